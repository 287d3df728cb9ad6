// reduce_sum and reduce_max: the operand is laid out as [kept dims..., reduced dims...]
// (a StridedCopy unless the reduced dims already trail), then each output element folds
// one contiguous run, in index order, in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/status_macros.h"
#include "runtime/reference/kernels.h"

namespace kiln::reference {
namespace {

template <typename Fold>
absl::StatusOr<HostTensor> Reduce(const Node& node, const HostTensor& x, const EvalContext& ctx, double init,
                                  Fold fold) {
  ASSIGN_OR_RETURN(std::vector<int64_t> reduced, node.attrs().GetInts("dims"));
  const std::vector<int64_t>& x_dims = x.type().dims;
  const std::vector<int64_t> x_strides = RowMajorStrides(x_dims);
  std::vector<bool> is_reduced(x_dims.size(), false);
  for (int64_t d : reduced) is_reduced[d] = true;
  std::vector<int64_t> order;
  for (size_t d = 0; d < x_dims.size(); ++d) {
    if (!is_reduced[d]) order.push_back(static_cast<int64_t>(d));
  }
  const bool already_trailing = std::is_sorted(reduced.begin(), reduced.end()) &&
                                (reduced.empty() || reduced.front() == static_cast<int64_t>(order.size()));
  order.insert(order.end(), reduced.begin(), reduced.end());

  std::vector<double> permuted;
  const double* src = x.values().data();
  if (!already_trailing) {
    std::vector<int64_t> dims, strides;
    for (int64_t d : order) {
      dims.push_back(x_dims[d]);
      strides.push_back(x_strides[d]);
    }
    permuted.resize(x.num_elements());
    StridedCopy(src, 0, dims, strides, permuted.data(), ctx.pool);
    src = permuted.data();
  }
  HostTensor out(node.type());
  const int64_t run = out.num_elements() == 0 ? 0 : x.num_elements() / out.num_elements();
  double* dst = out.mutable_values().data();
  ctx.pool.ParallelFor(out.num_elements(), std::max<int64_t>(1, kElementsPerChunk / std::max<int64_t>(1, run)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t i = begin; i < end; ++i) {
                           double acc = init;
                           for (const double* p = src + i * run; p < src + (i + 1) * run; ++p) acc = fold(acc, *p);
                           dst[i] = acc;
                         }
                       });
  return out;
}

}  // namespace

absl::StatusOr<HostTensor> EvalReduceSum(const Node& node, Operands xs, const EvalContext& ctx) {
  return Reduce(node, *xs[0], ctx, 0.0, [](double acc, double v) { return acc + v; });
}

absl::StatusOr<HostTensor> EvalReduceMax(const Node& node, Operands xs, const EvalContext& ctx) {
  // An empty reduction gives -inf (the lowest value of the dtype after rounding); NaN wins.
  return Reduce(node, *xs[0], ctx, -std::numeric_limits<double>::infinity(), [](double acc, double v) {
    return std::isnan(acc) || std::isnan(v) ? acc + v : (v > acc ? v : acc);
  });
}

}  // namespace kiln::reference
