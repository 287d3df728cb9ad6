// dot_general: maps the operands' batch, free and contracting dims to a batched GEMM
// [batch, M, K] x [batch, K, N] -> [batch, M, N], which is exactly the result layout
// (batch dims, lhs free dims, rhs free dims). Operands are used as stored: already
// rounded to their dtype, hence exact in double; the sum is rounded once by the evaluator.
#include <algorithm>

#include "ir/status_macros.h"
#include "runtime/reference/gemm.h"
#include "runtime/reference/kernels.h"

namespace kiln::reference {
namespace {

// Offsets of the elements of `x` over the group of dims `group` (row-major within it).
std::vector<int64_t> OffsetsOf(const TensorType& x, const std::vector<int64_t>& group) {
  const std::vector<int64_t> strides = RowMajorStrides(x.dims);
  std::vector<int64_t> sizes, group_strides;
  for (int64_t d : group) {
    sizes.push_back(x.dims[d]);
    group_strides.push_back(strides[d]);
  }
  return GroupOffsets(sizes, group_strides);
}

// The dims of `x` in neither list, in increasing order.
std::vector<int64_t> FreeDims(const TensorType& x, const std::vector<int64_t>& batch,
                              const std::vector<int64_t>& contract) {
  std::vector<int64_t> free;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
        std::find(contract.begin(), contract.end(), d) == contract.end()) {
      free.push_back(d);
    }
  }
  return free;
}

}  // namespace

absl::StatusOr<HostTensor> EvalDotGeneral(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(std::vector<int64_t> lhs_batch, node.attrs().GetInts("lhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> rhs_batch, node.attrs().GetInts("rhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> lhs_contract, node.attrs().GetInts("lhs_contract"));
  ASSIGN_OR_RETURN(std::vector<int64_t> rhs_contract, node.attrs().GetInts("rhs_contract"));
  const TensorType& lt = xs[0]->type();
  const TensorType& rt = xs[1]->type();
  GemmOperand a{xs[0]->values().data(), OffsetsOf(lt, lhs_batch), OffsetsOf(lt, FreeDims(lt, lhs_batch, lhs_contract)),
                OffsetsOf(lt, lhs_contract)};
  GemmOperand b{xs[1]->values().data(), OffsetsOf(rt, rhs_batch), OffsetsOf(rt, rhs_contract),
                OffsetsOf(rt, FreeDims(rt, rhs_batch, rhs_contract))};
  HostTensor out(node.type());
  Gemm(a, b, out.mutable_values().data(), ctx.pool);
  return out;
}

}  // namespace kiln::reference
