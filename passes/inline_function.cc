#include "passes/inline_function.h"

#include "ir/fusion.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln {

absl::StatusOr<std::vector<Node*>> InlineFunction(Function& dst, const Function& src, absl::Span<Node* const> args,
                                                  absl::string_view name_prefix) {
  std::vector<Node*> params = src.parameters();
  if (params.size() != args.size()) {
    return absl::InvalidArgumentError(absl::StrCat("inlining @", src.name(), ": it takes ", params.size(),
                                                   " parameters, got ", args.size(), " arguments"));
  }
  absl::flat_hash_map<const Node*, Node*> map;
  for (size_t i = 0; i < params.size(); ++i) {
    if (args[i] == nullptr || args[i]->parent() != &dst || args[i]->has_multiple_results() ||
        args[i]->type() != params[i]->type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inlining @", src.name(), ": argument ", i, " must be a node of @", dst.name(), " of type ",
          params[i]->type().ToString(),
          args[i] && !args[i]->has_multiple_results() ? absl::StrCat(", got ", args[i]->type().ToString()) : ""));
    }
    map[params[i]] = args[i];
  }
  for (const auto& n : src.nodes()) {
    if (n->opcode() == Opcode::kParameter) continue;
    std::vector<Node*> operands;
    for (Node* o : n->operands()) operands.push_back(map.at(o));
    std::string name = dst.UniqueName(absl::StrCat(name_prefix, n->name()));
    // Node by node, multi-result nodes and their get_result nodes included, so the copy
    // keeps the group's order.
    map[n.get()] = dst.AppendNodeWithTypes(dst.next_id(), n->opcode(), std::move(operands), n->attrs(),
                                           n->result_types(), name, n->scope());
    // A fusion's body is its own function: copied whole, its names untouched.
    if (n->body() != nullptr) map[n.get()]->set_body(CloneFunction(*n->body(), FusionBodyName(name)));
  }
  std::vector<Node*> outputs;
  for (Node* o : src.outputs()) outputs.push_back(map.at(o));
  return outputs;
}

}  // namespace kiln
