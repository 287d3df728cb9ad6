#include "ir/graph.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln {

namespace {
void EraseOneUse(std::vector<Node*>& users, Node* user) {
  auto it = std::find(users.begin(), users.end(), user);
  KILN_CHECK(it != users.end());
  users.erase(it);
}
}  // namespace

void Node::ReplaceOperand(int i, Node* value) {
  KILN_CHECK(i >= 0 && i < num_operands() && value != nullptr);
  EraseOneUse(operands_[i]->users_, this);
  operands_[i] = value;
  value->users_.push_back(this);
}

void Node::ReplaceAllUsesWith(Node* value) {
  KILN_CHECK(value != this);
  std::vector<Node*> users = users_;
  for (Node* user : users) {
    for (int i = 0; i < user->num_operands(); ++i) {
      if (user->operands_[i] == this) user->ReplaceOperand(i, value);
    }
  }
  for (size_t i = 0; i < parent_->outputs_.size(); ++i) {
    if (parent_->outputs_[i] == this) parent_->outputs_[i] = value;
  }
}

Node::~Node() = default;

void Node::set_body(std::unique_ptr<Function> body) {
  body_ = std::move(body);
  if (body_ != nullptr) body_->owner_ = this;
}

Node* Node::result(int i) const {
  for (Node* user : users_) {
    if (user->opcode() == Opcode::kGetResult && user->result_index() == i) return user;
  }
  return nullptr;
}

int Node::result_index() const {
  KILN_CHECK(opcode_ == Opcode::kGetResult);
  const absl::StatusOr<int64_t> index = attrs_.GetInt("index");
  return index.ok() ? static_cast<int>(*index) : -1;
}

std::vector<Node*> Function::parameters() const {
  std::vector<std::pair<int64_t, Node*>> params;
  for (const auto& n : nodes_) {
    if (n->opcode() != Opcode::kParameter) continue;
    absl::StatusOr<int64_t> index = n->attrs().GetInt("index");
    params.push_back({index.ok() ? *index : -1, n.get()});
  }
  std::stable_sort(params.begin(), params.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Node*> out;
  for (auto& [i, n] : params) out.push_back(n);
  return out;
}

std::unique_ptr<Node> Function::MakeNode(int64_t id, Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                         std::vector<TensorType> types, std::string name, std::string scope) {
  if (id < 0 || ids_.contains(id)) return nullptr;
  if (name.empty()) name = UniqueName(absl::StrCat(id));
  if (names_.contains(name)) return nullptr;
  auto node = std::unique_ptr<Node>(new Node());
  node->id_ = id;
  ids_.insert(id);
  next_id_ = std::max(next_id_, id + 1);
  node->opcode_ = op;
  node->operands_ = std::move(operands);
  node->attrs_ = std::move(attrs);
  node->types_ = std::move(types);
  node->name_ = std::move(name);
  node->scope_ = std::move(scope);
  node->parent_ = this;
  for (Node* operand : node->operands_) operand->users_.push_back(node.get());
  names_[node->name_] = node.get();
  return node;
}

Node* Function::AppendNode(Opcode op, std::vector<Node*> operands, AttrMap attrs, TensorType type,
                           std::string name, std::string scope) {
  return AppendNodeWithId(next_id_, op, std::move(operands), std::move(attrs), std::move(type), std::move(name),
                          std::move(scope));
}

Node* Function::AppendNodeWithId(int64_t id, Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                 TensorType type, std::string name, std::string scope) {
  std::unique_ptr<Node> node =
      MakeNode(id, op, std::move(operands), std::move(attrs), {std::move(type)}, std::move(name), std::move(scope));
  if (!node) return nullptr;
  nodes_.push_back(std::move(node));
  return nodes_.back().get();
}

Node* Function::AppendNodeWithTypes(int64_t id, Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                            std::vector<TensorType> types, std::string name, std::string scope) {
  std::unique_ptr<Node> node =
      MakeNode(id, op, std::move(operands), std::move(attrs), std::move(types), std::move(name), std::move(scope));
  if (!node) return nullptr;
  nodes_.push_back(std::move(node));
  return nodes_.back().get();
}

std::vector<Node*> Function::AppendMultiResultNode(Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                                   std::vector<TensorType> types, std::vector<std::string> result_names,
                                                   std::string scope, Node* before) {
  KILN_CHECK(result_names.size() == types.size());
  for (size_t i = 0; i < result_names.size(); ++i) {
    // An unnamed result is named by its id, as AppendNode does: the multi-result node takes
    // next_id_, its results the ids after it.
    if (result_names[i].empty()) result_names[i] = UniqueName(absl::StrCat(next_id_ + 1 + static_cast<int64_t>(i)));
    if (names_.contains(result_names[i])) return {};
    for (size_t j = 0; j < i; ++j) {
      if (result_names[j] == result_names[i]) return {};
    }
  }
  auto position = nodes_.end();
  if (before != nullptr) {
    position = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.get() == before; });
    KILN_CHECK(position != nodes_.end());
  }
  const std::vector<TensorType> result_types = types;
  // Named after its first result, so that a module read back from text (which does not
  // print this name) names it the same.
  std::unique_ptr<Node> multi = MakeNode(next_id_, op, std::move(operands), std::move(attrs), std::move(types),
                                         UniqueName(absl::StrCat(result_names[0], ".results")), scope);
  KILN_CHECK(multi != nullptr);
  Node* parent = multi.get();
  position = nodes_.insert(position, std::move(multi)) + 1;
  std::vector<Node*> results;
  for (size_t i = 0; i < result_types.size(); ++i) {
    std::unique_ptr<Node> r = MakeNode(next_id_, Opcode::kGetResult, {parent},
                                       AttrMap{{"index", static_cast<int64_t>(i)}}, {result_types[i]},
                                       std::move(result_names[i]), scope);
    KILN_CHECK(r != nullptr);  // names checked above
    results.push_back(r.get());
    position = nodes_.insert(position, std::move(r)) + 1;
  }
  return results;
}

Node* Function::InsertNodeBefore(Node* before, Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                 TensorType type, std::string name, std::string scope) {
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.get() == before; });
  KILN_CHECK(it != nodes_.end());
  std::unique_ptr<Node> node = MakeNode(next_id_, op, std::move(operands), std::move(attrs), {std::move(type)},
                                        std::move(name), std::move(scope));
  if (!node) return nullptr;
  return nodes_.insert(it, std::move(node))->get();
}

void Function::RemoveNode(Node* node) { RemoveNodes({node}); }

void Function::MoveNodeBefore(Node* node, Node* before) {
  KILN_CHECK(node != before);
  auto from = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.get() == node; });
  KILN_CHECK(from != nodes_.end());
  std::unique_ptr<Node> owned = std::move(*from);
  nodes_.erase(from);
  auto to = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.get() == before; });
  KILN_CHECK(to != nodes_.end());
  nodes_.insert(to, std::move(owned));
}

void Function::RemoveNodes(const std::vector<Node*>& dead) {
  absl::flat_hash_set<Node*> dead_set(dead.begin(), dead.end());
  for (Node* n : dead) {
    for (Node* user : n->users_) KILN_CHECK(dead_set.contains(user));
    for (Node* out : outputs_) KILN_CHECK(out != n);
  }
  for (Node* n : dead) {
    for (Node* operand : n->operands_) {
      if (!dead_set.contains(operand)) EraseOneUse(operand->users_, n);
    }
    names_.erase(n->name_);
    ids_.erase(n->id_);
  }
  nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return dead_set.contains(n.get()); }),
               nodes_.end());
}

void Function::SetOutputs(std::vector<Node*> outputs, std::vector<int64_t> aliases) {
  outputs_ = std::move(outputs);
  output_aliases_ = std::move(aliases);
}

void Function::ReplaceOutput(int i, Node* value) {
  KILN_CHECK(i >= 0 && i < static_cast<int>(outputs_.size()));
  outputs_[i] = value;
}

bool Function::RenameNode(Node* node, std::string name) {
  KILN_CHECK(node->parent_ == this);
  if (names_.contains(name)) return false;
  names_.erase(node->name_);
  node->name_ = std::move(name);
  names_[node->name_] = node;
  return true;
}

Node* Function::FindNode(absl::string_view name) const {
  auto it = names_.find(name);
  return it == names_.end() ? nullptr : it->second;
}

std::string Function::UniqueName(absl::string_view base) const {
  if (!names_.contains(base)) return std::string(base);
  for (int i = 1;; ++i) {
    std::string candidate = absl::StrCat(base, ".", i);
    if (!names_.contains(candidate)) return candidate;
  }
}

Function* Module::AddFunction(std::string name) {
  if (FindFunction(name)) return nullptr;
  functions_.push_back(std::make_unique<Function>(std::move(name)));
  return functions_.back().get();
}

Function* Module::FindFunction(absl::string_view name) const {
  for (const auto& f : functions_) {
    if (f->name() == name) return f.get();
  }
  return nullptr;
}

void Module::RemoveFunction(absl::string_view name) {
  functions_.erase(std::remove_if(functions_.begin(), functions_.end(),
                                  [&](const auto& f) { return f->name() == name; }),
                   functions_.end());
}

namespace {
void CopyNodes(const Function& from, Function& to) {
  absl::flat_hash_map<const Node*, Node*> map;
  for (const auto& n : from.nodes()) {
    std::vector<Node*> operands;
    for (Node* o : n->operands()) operands.push_back(map.at(o));
    Node* copy = to.AppendNodeWithTypes(n->id(), n->opcode(), operands, n->attrs(), n->result_types(), n->name(),
                                        n->scope());
    if (n->body() != nullptr) copy->set_body(CloneFunction(*n->body(), n->body()->name()));
    map[n.get()] = copy;
  }
  std::vector<Node*> outputs;
  for (Node* o : from.outputs()) outputs.push_back(map.at(o));
  to.SetOutputs(outputs, from.output_aliases());
}
}  // namespace

std::unique_ptr<Function> CloneFunction(const Function& function, std::string name) {
  auto clone = std::make_unique<Function>(std::move(name));
  CopyNodes(function, *clone);
  return clone;
}

std::unique_ptr<Module> CloneModule(const Module& module) {
  auto clone = std::make_unique<Module>(module.name());
  for (const auto& f : module.functions()) CopyNodes(*f, *clone->AddFunction(f->name()));
  return clone;
}

}  // namespace kiln
