// reduce_sum and reduce_max: the operand is laid out as [kept dims..., reduced dims...]
// (a StridedCopy unless the reduced dims already trail), then each output element folds
// one contiguous run, in index order, in double. Reducing leading dims skips the copy.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

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
  const bool sorted = std::is_sorted(reduced.begin(), reduced.end());
  const bool already_trailing =
      sorted && (reduced.empty() || reduced.front() == static_cast<int64_t>(order.size()));
  HostTensor out(node.type());
  double* dst = out.mutable_values().data();
  if (sorted && !reduced.empty() && reduced.back() == static_cast<int64_t>(reduced.size()) - 1) {
    // Leading dims reduced (a gradient summed over the batch): fold whole rows into the
    // output, rows in index order, which is the same order as the general path.
    const int64_t cols = out.num_elements();
    const int64_t rows = cols == 0 ? 0 : x.num_elements() / cols;
    const double* src = x.values().data();
    ctx.pool.ParallelFor(cols, std::max<int64_t>(64, kElementsPerChunk / std::max<int64_t>(1, rows)),
                         [&](int64_t begin, int64_t end) {
                           std::fill(dst + begin, dst + end, init);
                           for (int64_t r = 0; r < rows; ++r) {
                             const double* row = src + r * cols;
                             for (int64_t j = begin; j < end; ++j) dst[j] = fold(dst[j], row[j]);
                           }
                         });
    return out;
  }
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
  const int64_t run = out.num_elements() == 0 ? 0 : x.num_elements() / out.num_elements();
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
