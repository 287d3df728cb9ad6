// The kiln IR graph: a Module owns Functions, a Function owns Nodes. A Node is one SSA
// value: it knows its operands and its users, and has an id that is stable for the life of
// the function (never reused). Nodes are kept in definition order: every operand of a node
// comes before it (the verifier checks this).
//
// A node of an op with several results (adamw_update, attention, attention_grad: one kernel
// computing several tensors) has one type per result and is followed directly by one
// get_result node per result, in order; those are the values everything else uses (XLA's
// tuple and get-tuple-element, kept as one line in the text form). The multi-result node
// itself is used by its get_result nodes only, holds no value of its own, and is removed
// together with them. Function::AppendMultiResultNode makes the group.
//
// A fusion node (ir/fusion.h) owns a body: a Function of its own, whose parameter i is the
// node's operand i and whose outputs are the node's results (XLA's fused computation). The
// body's nodes are not nodes of the enclosing function; Function::owner() leads back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "ir/attributes.h"
#include "ir/op_table.h"
#include "ir/status_macros.h"
#include "ir/types.h"

namespace kiln {

class Function;

class Node {
 public:
  ~Node();
  int64_t id() const { return id_; }
  Opcode opcode() const { return opcode_; }
  absl::string_view op_name() const { return OpName(opcode_); }
  // The type of a single-result node (every node but a multi-result one).
  const TensorType& type() const {
    KILN_CHECK(types_.size() == 1);
    return types_[0];
  }
  int num_results() const { return static_cast<int>(types_.size()); }
  bool has_multiple_results() const { return types_.size() > 1; }
  const TensorType& result_type(int i) const { return types_[i]; }
  const std::vector<TensorType>& result_types() const { return types_; }
  // The get_result node reading result `i` of this multi-result node (nullptr if absent,
  // which the verifier rejects).
  Node* result(int i) const;
  // For a get_result node, which result of its operand it reads.
  int result_index() const;
  const std::vector<Node*>& operands() const { return operands_; }
  Node* operand(int i) const { return operands_[i]; }
  int num_operands() const { return static_cast<int>(operands_.size()); }
  // One entry per use: a node that uses this one twice appears twice.
  const std::vector<Node*>& users() const { return users_; }
  const AttrMap& attrs() const { return attrs_; }
  AttrMap& mutable_attrs() { return attrs_; }
  // Unique within the function; the text form prints it as %name.
  const std::string& name() const { return name_; }
  // Where the node belongs in the model, e.g. "layers.3.attn"; empty at top level.
  const std::string& scope() const { return scope_; }
  void set_scope(std::string scope) { scope_ = std::move(scope); }
  Function* parent() const { return parent_; }

  // Points use `i` at `value` and keeps both user lists right.
  void ReplaceOperand(int i, Node* value);
  // Makes every user of this node use `value` instead (outputs included).
  void ReplaceAllUsesWith(Node* value);
  // For passes that retype a value in place (e.g. narrowing); the verifier re-checks.
  void set_type(TensorType t) { types_ = {std::move(t)}; }
  // The same for result `i` of a multi-result node (its get_result node is retyped apart).
  void set_result_type(int i, TensorType t) {
    KILN_CHECK(i >= 0 && i < static_cast<int>(types_.size()));
    types_[i] = std::move(t);
  }

  // A fusion node's body; null for every other node.
  const Function* body() const { return body_.get(); }
  Function* mutable_body() { return body_.get(); }
  // Gives this node `body` (which then knows its owner). The verifier checks that only
  // fusion nodes have one and that it matches the operands and results.
  void set_body(std::unique_ptr<Function> body);

 private:
  friend class Function;
  Node() = default;

  int64_t id_ = 0;
  Opcode opcode_ = Opcode::kParameter;
  std::vector<TensorType> types_;  // one per result
  std::vector<Node*> operands_;
  std::vector<Node*> users_;
  AttrMap attrs_;
  std::string name_;
  std::string scope_;
  Function* parent_ = nullptr;
  std::unique_ptr<Function> body_;  // a fusion's
};

class Function {
 public:
  explicit Function(std::string name) : name_(std::move(name)) {}
  Function(const Function&) = delete;
  Function& operator=(const Function&) = delete;

  const std::string& name() const { return name_; }
  // The fusion node whose body this is; null for a function of a module.
  const Node* owner() const { return owner_; }
  // Nodes in definition order.
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  // Parameter nodes sorted by their `index` attribute.
  std::vector<Node*> parameters() const;
  const std::vector<Node*>& outputs() const { return outputs_; }
  // For each output, the parameter index whose buffer it reuses (donation), or -1.
  // Empty means no output aliases anything.
  const std::vector<int64_t>& output_aliases() const { return output_aliases_; }

  // Appends a node without checking it: the Builder and the parser check types first, and
  // the verifier checks whole functions. `name` empty means "use the id". Fails (returns
  // nullptr) only if the name is taken.
  Node* AppendNode(Opcode op, std::vector<Node*> operands, AttrMap attrs, TensorType type,
                   std::string name = "", std::string scope = "");
  // As AppendNode, but with a given id (the protobuf reader and CloneModule keep ids).
  // Returns nullptr if the id or the name is taken, or the id is negative.
  Node* AppendNodeWithId(int64_t id, Opcode op, std::vector<Node*> operands, AttrMap attrs,
                         TensorType type, std::string name, std::string scope);
  // Inserts a node just before `before` (same checks as AppendNode).
  Node* InsertNodeBefore(Node* before, Opcode op, std::vector<Node*> operands, AttrMap attrs,
                         TensorType type, std::string name = "", std::string scope = "");
  // Appends a multi-result node of `types` and its get_result nodes, named `result_names`
  // (one per type; an empty entry is named by the result's id), all in `scope`. Returns the get_result nodes,
  // or an empty vector if a name is taken. The multi-result node is named after the first
  // result (`<first>.results`, made unique). With `before`, the group is inserted just
  // before that node instead of appended.
  std::vector<Node*> AppendMultiResultNode(Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                           std::vector<TensorType> types, std::vector<std::string> result_names,
                                           std::string scope = "", Node* before = nullptr);
  // As AppendNodeWithId with one type per result, for any node (the protobuf reader and
  // clones keep ids); a multi-result node's get_result nodes are appended separately.
  Node* AppendNodeWithTypes(int64_t id, Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                    std::vector<TensorType> types, std::string name, std::string scope);
  // Moves `node` to just before `before` in definition order. The caller keeps the order
  // valid (the verifier checks it): a node moved earlier needs its operands defined before
  // its new place.
  void MoveNodeBefore(Node* node, Node* before);
  // Removes a node that has no users and is not an output.
  void RemoveNode(Node* node);
  // Removes every node in `dead` (none may be used by a node outside the set).
  void RemoveNodes(const std::vector<Node*>& dead);

  void SetOutputs(std::vector<Node*> outputs, std::vector<int64_t> aliases = {});
  void ReplaceOutput(int i, Node* value);

  Node* FindNode(absl::string_view name) const;
  // Gives `node` a name not used in this function (a pass that replaces a node keeps its
  // name this way). Returns false, changing nothing, if the name is taken.
  bool RenameNode(Node* node, std::string name);
  // A name not yet used in this function, derived from `base`.
  std::string UniqueName(absl::string_view base) const;
  int64_t next_id() const { return next_id_; }

 private:
  friend class Node;
  std::unique_ptr<Node> MakeNode(int64_t id, Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                 std::vector<TensorType> types, std::string name, std::string scope);
  std::string name_;
  const Node* owner_ = nullptr;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Node*> outputs_;
  std::vector<int64_t> output_aliases_;
  int64_t next_id_ = 0;
  absl::flat_hash_map<std::string, Node*> names_;  // for uniqueness and lookups
  absl::flat_hash_set<int64_t> ids_;  // for uniqueness and lookups
};

class Module {
 public:
  explicit Module(std::string name = "module") : name_(std::move(name)) {}
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  const std::vector<std::unique_ptr<Function>>& functions() const { return functions_; }
  // Returns nullptr if a function of that name exists already.
  Function* AddFunction(std::string name);
  Function* FindFunction(absl::string_view name) const;
  void RemoveFunction(absl::string_view name);

 private:
  std::string name_;
  std::vector<std::unique_ptr<Function>> functions_;
};

// A deep copy (same names, ids, order and scopes; fusion bodies copied too).
std::unique_ptr<Module> CloneModule(const Module& module);
// A deep copy of one function, named `name`, owned by no node.
std::unique_ptr<Function> CloneFunction(const Function& function, std::string name);

}  // namespace kiln
