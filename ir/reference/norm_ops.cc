// rms_norm and its exact gradients, row by row over the last dim, in double.
//   r  = 1 / sqrt(mean(x^2) + eps)
//   y  = x * r * w
//   dx = r * (w * dy) - x * r^3 / D * sum(w * dy * x)
//   dw = sum over rows of dy * x * r
// and layer_norm, the same of the centered row c = x - mean(x), plus the bias:
//   y  = c * (1 / sqrt(mean(c^2) + eps)) * w + b
#include <algorithm>
#include <cmath>

#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {
namespace {

double InverseRms(const double* x, int64_t length, double eps) {
  double sum_squares = 0;
  for (int64_t i = 0; i < length; ++i) sum_squares += x[i] * x[i];
  return 1.0 / std::sqrt(sum_squares / static_cast<double>(length) + eps);
}

// Calls fn(row index) for every row of `x`, rows split across the pool.
template <typename Fn>
void ForEachRow(const EvalContext& ctx, Rows rows, Fn fn) {
  ctx.pool.ParallelFor(rows.count, std::max<int64_t>(1, kElementsPerChunk / std::max<int64_t>(1, rows.length)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t r = begin; r < end; ++r) fn(r);
                       });
}

}  // namespace

absl::StatusOr<HostTensor> EvalRmsNorm(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const Rows rows = RowsOf(xs[0]->type());
  const double* w = xs[1]->values().data();
  HostTensor out(node.type());
  ForEachRow(ctx, rows, [&](int64_t r) {
    const double* x = xs[0]->values().data() + r * rows.length;
    double* y = out.mutable_values().data() + r * rows.length;
    const double inv_rms = InverseRms(x, rows.length, eps);
    for (int64_t i = 0; i < rows.length; ++i) y[i] = x[i] * inv_rms * w[i];
  });
  return out;
}

absl::StatusOr<HostTensor> EvalLayerNorm(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const Rows rows = RowsOf(xs[0]->type());
  const double* w = xs[1]->values().data();
  const double* bias = xs[2]->values().data();
  HostTensor out(node.type());
  ForEachRow(ctx, rows, [&](int64_t r) {
    const double* x = xs[0]->values().data() + r * rows.length;
    double* y = out.mutable_values().data() + r * rows.length;
    double sum = 0;
    for (int64_t i = 0; i < rows.length; ++i) sum += x[i];
    const double mean = sum / static_cast<double>(rows.length);
    for (int64_t i = 0; i < rows.length; ++i) y[i] = x[i] - mean;  // centered, then normed in place
    const double inv_std = InverseRms(y, rows.length, eps);
    for (int64_t i = 0; i < rows.length; ++i) y[i] = y[i] * inv_std * w[i] + bias[i];
  });
  return out;
}

absl::StatusOr<HostTensor> EvalRmsNormGradInput(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const Rows rows = RowsOf(xs[0]->type());
  const double* w = xs[1]->values().data();
  HostTensor out(node.type());
  ForEachRow(ctx, rows, [&](int64_t r) {
    const double* x = xs[0]->values().data() + r * rows.length;
    const double* dy = xs[2]->values().data() + r * rows.length;
    double* dx = out.mutable_values().data() + r * rows.length;
    const double inv_rms = InverseRms(x, rows.length, eps);
    double dot = 0;  // sum(w * dy * x)
    for (int64_t i = 0; i < rows.length; ++i) dot += w[i] * dy[i] * x[i];
    const double scale = inv_rms * inv_rms * inv_rms * dot / static_cast<double>(rows.length);
    for (int64_t i = 0; i < rows.length; ++i) dx[i] = inv_rms * w[i] * dy[i] - x[i] * scale;
  });
  return out;
}

absl::StatusOr<HostTensor> EvalRmsNormGradWeight(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const Rows rows = RowsOf(xs[0]->type());
  HostTensor out(node.type());
  double* dw = out.mutable_values().data();
  // Serial over rows: the sum over rows is in row order, independent of the thread count.
  for (int64_t r = 0; r < rows.count; ++r) {
    const double* x = xs[0]->values().data() + r * rows.length;
    const double* dy = xs[2]->values().data() + r * rows.length;
    const double inv_rms = InverseRms(x, rows.length, eps);
    for (int64_t i = 0; i < rows.length; ++i) dw[i] += dy[i] * x[i] * inv_rms;
  }
  return out;
}

}  // namespace kiln::reference
