#include "ir/verifier.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/fusion.h"
#include "ir/op_attributes.h"
#include "ir/shape_inference.h"
#include "ir/status_macros.h"

namespace kiln {

bool IsValidName(absl::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-';
    if (!ok) return false;
  }
  return true;
}

namespace {

absl::Status NodeError(const Function& f, const Node& n, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("verifier: @", f.name(), " %", n.name(), " = ", n.op_name(), ": ", why));
}

// A multi-result node is followed directly by its get_result nodes, one per result in
// order, in its scope, and used by nothing else: the text form writes the group as one line
// and every pass can find a result without a search.
absl::Status VerifyResults(const Function& f, const Node& n, size_t index) {
  if (n.opcode() == Opcode::kGetResult) {
    const size_t parent = index - 1 - static_cast<size_t>(n.result_index());
    if (n.result_index() > static_cast<int>(index) - 1 || f.nodes()[parent].get() != n.operand(0)) {
      return NodeError(f, n, absl::StrCat("must follow %", n.operand(0)->name(), " directly, as its result ",
                                          n.result_index()));
    }
    if (n.scope() != n.operand(0)->scope()) return NodeError(f, n, "must be in its multi-result node's scope");
    return absl::OkStatus();
  }
  if (!n.has_multiple_results()) return absl::OkStatus();
  if (n.users().size() != static_cast<size_t>(n.num_results())) {
    return NodeError(f, n, absl::StrCat("has ", n.num_results(), " results, so exactly ", n.num_results(),
                                        " get_result users, not ", n.users().size()));
  }
  for (int i = 0; i < n.num_results(); ++i) {
    const size_t at = index + 1 + i;
    if (at >= f.nodes().size() || f.nodes()[at]->opcode() != Opcode::kGetResult ||
        f.nodes()[at]->operand(0) != &n || f.nodes()[at]->result_index() != i) {
      return NodeError(f, n, absl::StrCat("result ", i, " must be read by a get_result right after it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyFunction(const Function& f) {
  if (!IsValidName(f.name())) {
    return absl::InvalidArgumentError(absl::StrCat("verifier: function name '", f.name(), "' is not a valid name"));
  }
  absl::flat_hash_set<const Node*> defined;
  absl::flat_hash_set<absl::string_view> names;
  absl::flat_hash_set<int64_t> ids;
  absl::flat_hash_map<int64_t, const Node*> params;
  for (size_t index = 0; index < f.nodes().size(); ++index) {
    const Node& n = *f.nodes()[index];
    if (!IsValidName(n.name())) return NodeError(f, n, "name must match [A-Za-z0-9_.-]+");
    if (!n.scope().empty() && !IsValidName(n.scope())) return NodeError(f, n, "scope must match [A-Za-z0-9_.-]+");
    if (!names.insert(n.name()).second) return NodeError(f, n, "duplicate name");
    if (!ids.insert(n.id()).second) return NodeError(f, n, absl::StrCat("duplicate id ", n.id()));
    if (n.parent() != &f) return NodeError(f, n, "node belongs to another function");
    for (const TensorType& t : n.result_types()) {
      absl::Status size_ok = CheckTensorSizeLimit(t.dtype, t.dims);
      if (!size_ok.ok()) return NodeError(f, n, size_ok.message());
    }
    absl::Status attrs_ok = CheckKnownAttributes(n.opcode(), n.attrs());
    if (!attrs_ok.ok()) return NodeError(f, n, attrs_ok.message());
    for (int i = 0; i < n.num_operands(); ++i) {
      const Node* o = n.operand(i);
      if (o == nullptr || !defined.contains(o)) {
        return NodeError(f, n,
                         absl::StrCat("operand ", i, o ? absl::StrCat(" %", o->name()) : "",
                                      " is not defined before its use"));
      }
    }
    absl::StatusOr<std::vector<TensorType>> types = OperandTypes(n.opcode(), n.operands());
    if (!types.ok()) return NodeError(f, n, types.status().message());
    if ((n.body() != nullptr) != (n.opcode() == Opcode::kFusion)) {
      return NodeError(f, n, n.body() != nullptr ? "only a fusion has a body" : "a fusion needs a body");
    }
    if (n.body() != nullptr) {
      if (f.owner() != nullptr) return NodeError(f, n, "is a fusion inside a fusion body: bodies do not nest");
      absl::Status body_ok = VerifyFunction(*n.body());
      if (body_ok.ok()) body_ok = CheckFusionBody(n.attrs(), n.body());
      if (!body_ok.ok()) return NodeError(f, n, absl::StrCat("in its body: ", body_ok.message()));
    }
    absl::StatusOr<std::vector<TensorType>> inferred = InferNodeResultTypes(n);
    if (!inferred.ok()) {
      return NodeError(f, n, absl::StrCat("operands (", TypeListToString(*types), "): ", inferred.status().message()));
    }
    if (*inferred != n.result_types()) {
      auto show = [](const std::vector<TensorType>& ts) {
        std::vector<std::string> shown;
        for (const TensorType& t : ts) shown.push_back(t.ToString());
        return ts.size() == 1 ? shown[0] : absl::StrCat("(", absl::StrJoin(shown, ", "), ")");
      };
      return NodeError(f, n, absl::StrCat("written type ", show(n.result_types()), " but operands give ",
                                          show(*inferred)));
    }
    RETURN_IF_ERROR(VerifyResults(f, n, index));
    if (n.opcode() == Opcode::kParameter) {
      int64_t index = *n.attrs().GetInt("index");  // checked by inference
      if (!params.emplace(index, &n).second) {
        return NodeError(f, n, absl::StrCat("parameter index ", index, " is used twice"));
      }
    }
    defined.insert(&n);
  }
  for (int64_t i = 0; i < static_cast<int64_t>(params.size()); ++i) {
    if (!params.contains(i)) {
      return absl::InvalidArgumentError(absl::StrCat("verifier: @", f.name(), ": parameter indices must be 0..",
                                                     params.size() - 1, " but index ", i, " is missing"));
    }
  }
  if (f.outputs().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("verifier: @", f.name(), " returns nothing"));
  }
  for (size_t i = 0; i < f.outputs().size(); ++i) {
    if (!defined.contains(f.outputs()[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("verifier: @", f.name(), ": output ", i, " is not a node of this function"));
    }
    if (f.outputs()[i]->has_multiple_results()) {
      return absl::InvalidArgumentError(absl::StrCat("verifier: @", f.name(), ": output ", i, " %",
                                                     f.outputs()[i]->name(),
                                                     " has several results: return them, not the node"));
    }
  }
  const auto& aliases = f.output_aliases();
  if (!aliases.empty()) {
    if (aliases.size() != f.outputs().size()) {
      return absl::InvalidArgumentError(absl::StrCat("verifier: @", f.name(), ": ", aliases.size(),
                                                     " output aliases for ", f.outputs().size(), " outputs"));
    }
    absl::flat_hash_set<int64_t> donated;
    for (size_t i = 0; i < aliases.size(); ++i) {
      int64_t p = aliases[i];
      if (p == -1) continue;
      auto it = params.find(p);
      if (it == params.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("verifier: @", f.name(), ": output ", i, " aliases parameter ", p, ", which does not exist"));
      }
      if (it->second->type() != f.outputs()[i]->type()) {
        return absl::InvalidArgumentError(absl::StrCat("verifier: @", f.name(), ": output ", i, " (",
                                                       f.outputs()[i]->type().ToString(), ") aliases parameter ", p,
                                                       " of another type (", it->second->type().ToString(), ")"));
      }
      if (!donated.insert(p).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("verifier: @", f.name(), ": parameter ", p, " is aliased by two outputs"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyModule(const Module& module) {
  if (!IsValidName(module.name())) {
    return absl::InvalidArgumentError(absl::StrCat("verifier: module name '", module.name(), "' is not a valid name"));
  }
  absl::flat_hash_set<absl::string_view> names;
  for (const auto& f : module.functions()) {
    if (!names.insert(f->name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("verifier: function @", f->name(), " is defined twice"));
    }
    RETURN_IF_ERROR(VerifyFunction(*f));
  }
  return absl::OkStatus();
}

}  // namespace kiln
