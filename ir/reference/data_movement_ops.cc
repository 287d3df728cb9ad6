// broadcast, reshape, transpose, slice, concatenate: each is a StridedCopy (or plain
// copies) with the operand strides the op implies.
#include <algorithm>

#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {

absl::StatusOr<HostTensor> EvalBroadcast(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, node.attrs().GetInts("dims"));
  const TensorType& x = xs[0]->type();
  const std::vector<int64_t> x_strides = RowMajorStrides(x.dims);
  // Result dims that no operand dim maps to, and operand dims of size 1, repeat: stride 0.
  std::vector<int64_t> strides(node.type().rank(), 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    if (x.dims[i] != 1) strides[dims[i]] = x_strides[i];
  }
  HostTensor out(node.type());
  StridedCopy(xs[0]->values().data(), 0, node.type().dims, strides, out.mutable_values().data(), ctx.pool);
  return out;
}

absl::StatusOr<HostTensor> EvalReshape(const Node& node, Operands xs, const EvalContext& ctx) {
  HostTensor out(node.type());
  out.mutable_values() = xs[0]->values();
  return out;
}

absl::StatusOr<HostTensor> EvalTranspose(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, node.attrs().GetInts("perm"));
  const std::vector<int64_t> x_strides = RowMajorStrides(xs[0]->type().dims);
  std::vector<int64_t> strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) strides[i] = x_strides[perm[i]];
  HostTensor out(node.type());
  StridedCopy(xs[0]->values().data(), 0, node.type().dims, strides, out.mutable_values().data(), ctx.pool);
  return out;
}

absl::StatusOr<HostTensor> EvalSlice(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(std::vector<int64_t> start, node.attrs().GetInts("start"));
  ASSIGN_OR_RETURN(std::vector<int64_t> stride, node.attrs().GetInts("stride"));
  const std::vector<int64_t> x_strides = RowMajorStrides(xs[0]->type().dims);
  int64_t base = 0;
  std::vector<int64_t> strides(start.size());
  for (size_t d = 0; d < start.size(); ++d) {
    base += start[d] * x_strides[d];
    strides[d] = stride[d] * x_strides[d];
  }
  HostTensor out(node.type());
  if (out.num_elements() == 0) return out;
  StridedCopy(xs[0]->values().data(), base, node.type().dims, strides, out.mutable_values().data(), ctx.pool);
  return out;
}

absl::StatusOr<HostTensor> EvalConcatenate(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(int64_t dim, node.attrs().GetInt("dim"));
  const std::vector<int64_t>& dims = node.type().dims;
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= dims[d];
  // Per outer index, each operand contributes one contiguous run of dims[dim:] elements.
  HostTensor out(node.type());
  double* dst = out.mutable_values().data();
  for (int64_t o = 0; o < outer; ++o) {
    for (const HostTensor* x : xs) {
      const int64_t run = outer == 0 ? 0 : x->num_elements() / outer;
      const double* src = x->values().data() + o * run;
      dst = std::copy(src, src + run, dst);
    }
  }
  return out;
}

}  // namespace kiln::reference
