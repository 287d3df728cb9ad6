// gather and scatter_add along dim 0 of the table.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {

absl::StatusOr<HostTensor> EvalGather(const Node& node, Operands xs, const EvalContext& ctx) {
  const HostTensor& table = *xs[0];
  const HostTensor& indices = *xs[1];
  const int64_t num_rows = table.type().dims[0];
  const int64_t row = num_rows == 0 ? 0 : table.num_elements() / num_rows;
  const std::vector<double>& idx = indices.values();
  for (int64_t i = 0; i < indices.num_elements(); ++i) {
    if (idx[i] < 0 || idx[i] >= num_rows) {
      return absl::InvalidArgumentError(absl::StrCat("index ", idx[i], " at ",
                                                     MultiIndexString(i, indices.type().dims),
                                                     " is out of range [0, ", num_rows, ") for table ",
                                                     table.type().ToString()));
    }
  }
  HostTensor out(node.type());
  double* dst = out.mutable_values().data();
  const double* src = table.values().data();
  ctx.pool.ParallelFor(indices.num_elements(), std::max<int64_t>(1, kElementsPerChunk / std::max<int64_t>(1, row)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t i = begin; i < end; ++i) {
                           const double* from = src + static_cast<int64_t>(idx[i]) * row;
                           std::copy(from, from + row, dst + i * row);
                         }
                       });
  return out;
}

absl::StatusOr<HostTensor> EvalScatterAdd(const Node& node, Operands xs, const EvalContext& ctx) {
  const HostTensor& indices = *xs[0];
  const HostTensor& updates = *xs[1];
  HostTensor out(node.type());
  const int64_t num_rows = node.type().dims[0];
  const int64_t row = num_rows == 0 ? 0 : out.num_elements() / num_rows;
  const std::vector<double>& idx = indices.values();
  double* dst = out.mutable_values().data();
  // Sequential in index order so duplicate indices sum deterministically. Indices out of
  // range are dropped: the gradient of a gather that would have failed contributes nothing.
  for (int64_t i = 0; i < indices.num_elements(); ++i) {
    if (idx[i] < 0 || idx[i] >= num_rows) continue;
    double* to = dst + static_cast<int64_t>(idx[i]) * row;
    const double* from = updates.values().data() + i * row;
    for (int64_t j = 0; j < row; ++j) to[j] += from[j];
  }
  return out;
}

}  // namespace kiln::reference
