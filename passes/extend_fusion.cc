#include "passes/extend_fusion.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::StatusOr<Node*> AppendBodyParameter(Function& into, int64_t index, const Node& like, absl::string_view pass) {
  Node* p = into.AppendNode(Opcode::kParameter, {}, AttrMap{{"index", index}}, like.type(), into.UniqueName(like.name()),
                            like.scope());
  if (p == nullptr) return absl::InternalError(absl::StrCat(pass, ": cannot add a parameter for %", like.name()));
  return p;
}

absl::Status CopyBodyParameters(const Function& from, Function& into, absl::flat_hash_map<const Node*, Node*>& copy_of,
                                absl::string_view pass) {
  const std::vector<Node*> params = from.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    absl::StatusOr<Node*> p = AppendBodyParameter(into, static_cast<int64_t>(i), *params[i], pass);
    if (!p.ok()) return p.status();
    copy_of[params[i]] = *p;
  }
  return absl::OkStatus();
}

absl::StatusOr<Node*> CopyBodyOps(const Function& from, Function& into,
                                  absl::flat_hash_map<const Node*, Node*>& copy_of, absl::string_view pass) {
  for (const auto& n : from.nodes()) {
    if (n->opcode() == Opcode::kParameter) continue;
    std::vector<Node*> operands;
    for (Node* o : n->operands()) {
      auto it = copy_of.find(o);
      if (it == copy_of.end()) return absl::InternalError(absl::StrCat(pass, ": %", o->name(), " has no copy"));
      operands.push_back(it->second);
    }
    Node* copy = into.AppendNode(n->opcode(), std::move(operands), n->attrs(), n->type(), into.UniqueName(n->name()),
                                 n->scope());
    if (copy == nullptr) return absl::InternalError(absl::StrCat(pass, ": cannot copy %", n->name()));
    copy_of[n.get()] = copy;
  }
  if (from.outputs().empty()) return absl::InternalError(absl::StrCat(pass, ": @", from.name(), " has no output"));
  return copy_of.at(from.outputs()[0]);
}

absl::Status ReplaceWithFusion(Function& f, Node* replaced, Node* absorbed, FusionKind kind,
                               std::vector<Node*> operands, std::unique_ptr<Function> body, absl::string_view pass) {
  const std::string name = replaced->name();
  if (!f.RenameNode(replaced, f.UniqueName(absl::StrCat(name, ".unfused")))) {
    return absl::InternalError(absl::StrCat(pass, ": cannot rename %", name));
  }
  std::vector<Node*> fusion =
      AddFusionNode(f, kind, std::move(operands), std::move(body), {name}, replaced->scope(), replaced);
  if (fusion.empty()) return absl::InternalError(absl::StrCat(pass, ": cannot add the fusion %", name));
  replaced->ReplaceAllUsesWith(fusion[0]);
  f.RemoveNode(replaced);
  f.RemoveNode(absorbed);
  return absl::OkStatus();
}

}  // namespace kiln
