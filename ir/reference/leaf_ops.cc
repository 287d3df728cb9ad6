// parameter, constant, iota.
#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {

absl::StatusOr<HostTensor> EvalParameter(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(int64_t index, node.attrs().GetInt("index"));
  if (index < 0 || index >= static_cast<int64_t>(ctx.args.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter index ", index, " has no argument (", ctx.args.size(), " given)"));
  }
  return *ctx.args[index];
}

absl::StatusOr<HostTensor> EvalConstant(const Node& node, Operands xs, const EvalContext& ctx) {
  HostTensor out(node.type());
  if (node.attrs().Has("values")) {
    ASSIGN_OR_RETURN(out.mutable_values(), node.attrs().GetFloats("values"));
  } else {
    ASSIGN_OR_RETURN(double value, node.attrs().GetFloat("value"));
    std::fill(out.mutable_values().begin(), out.mutable_values().end(), value);
  }
  return out;
}

absl::StatusOr<HostTensor> EvalIota(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(int64_t dim, node.attrs().GetInt("dim"));
  HostTensor out(node.type());
  const std::vector<int64_t>& dims = node.type().dims;
  const int64_t inner = RowMajorStrides(dims)[dim];
  std::vector<double>& v = out.mutable_values();
  for (int64_t i = 0; i < out.num_elements(); ++i) v[i] = static_cast<double>((i / inner) % dims[dim]);
  return out;
}

}  // namespace kiln::reference
