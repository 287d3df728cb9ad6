// softmax, softmax_grad, cross_entropy and its gradient, row by row over the last dim, in
// double. Softmax subtracts the row max and cross-entropy uses logsumexp, so large
// logits neither overflow nor lose the small terms.
//   softmax_grad:        dx = y * (dy - sum(dy * y))
//   cross_entropy:       lse = logsumexp(row), loss = lse - row[label]
//   cross_entropy_grad:  dlogits = (exp(row - lse) - onehot(label)) * dloss, lse the operand
//                        (rounded to f32 as cross_entropy's result is: softmax(row) - onehot
//                        up to f32 rounding when lse is the row's)
// where a cross-entropy's row is the first {classes} columns (ir/op_table.h); the gradient
// of the padding columns after them is 0. The gradient is rounded to f32 first, as the
// kernel computes it, and then (by the evaluator) to its dtype: so a narrow gradient, of
// f32 logits {out_dtype=bf16} or of bf16 logits, is one rounding of the f32 gradient, and
// {out_dtype=bf16} is exactly convert(cross_entropy_grad) of the same f32 logits.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/numerics.h"
#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {
namespace {

template <typename Fn>
void ForEachRow(const EvalContext& ctx, Rows rows, Fn fn) {
  ctx.pool.ParallelFor(rows.count, std::max<int64_t>(1, kElementsPerChunk / std::max<int64_t>(1, rows.length)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t r = begin; r < end; ++r) fn(r);
                       });
}

double RowMax(const double* x, int64_t length) {
  double max = -INFINITY;
  for (int64_t i = 0; i < length; ++i) max = std::max(max, x[i]);
  return max;
}

double LogSumExp(const double* x, int64_t length) {
  const double max = RowMax(x, length);
  double sum = 0;
  for (int64_t i = 0; i < length; ++i) sum += std::exp(x[i] - max);
  return max + std::log(sum);
}

// Writes softmax(x) into y.
void SoftmaxRow(const double* x, int64_t length, double* y) {
  const double max = RowMax(x, length);
  double sum = 0;
  for (int64_t i = 0; i < length; ++i) {
    y[i] = std::exp(x[i] - max);
    sum += y[i];
  }
  for (int64_t i = 0; i < length; ++i) y[i] /= sum;
}

absl::Status CheckLabels(const HostTensor& labels, int64_t num_classes) {
  const std::vector<double>& l = labels.values();
  for (int64_t r = 0; r < labels.num_elements(); ++r) {
    if (l[r] < 0 || l[r] >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", l[r], " of row ", r, " is out of range [0, ", num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HostTensor> EvalSoftmax(const Node& node, Operands xs, const EvalContext& ctx) {
  const Rows rows = RowsOf(xs[0]->type());
  HostTensor out(node.type());
  ForEachRow(ctx, rows, [&](int64_t r) {
    SoftmaxRow(xs[0]->values().data() + r * rows.length, rows.length, out.mutable_values().data() + r * rows.length);
  });
  return out;
}

absl::StatusOr<HostTensor> EvalSoftmaxGrad(const Node& node, Operands xs, const EvalContext& ctx) {
  const Rows rows = RowsOf(xs[0]->type());
  HostTensor out(node.type());
  ForEachRow(ctx, rows, [&](int64_t r) {
    const double* y = xs[0]->values().data() + r * rows.length;
    const double* dy = xs[1]->values().data() + r * rows.length;
    double* dx = out.mutable_values().data() + r * rows.length;
    double dot = 0;
    for (int64_t i = 0; i < rows.length; ++i) dot += dy[i] * y[i];
    for (int64_t i = 0; i < rows.length; ++i) dx[i] = y[i] * (dy[i] - dot);
  });
  return out;
}

absl::StatusOr<std::vector<HostTensor>> EvalCrossEntropy(const Node& node, Operands xs, const EvalContext& ctx) {
  const Rows rows = RowsOf(xs[0]->type());
  const int64_t classes = CrossEntropyClasses(node);
  RETURN_IF_ERROR(CheckLabels(*xs[1], classes));
  HostTensor loss(node.result_type(0)), lse(node.result_type(1));
  ForEachRow(ctx, rows, [&](int64_t r) {
    const double* logits = xs[0]->values().data() + r * rows.length;
    lse.mutable_values()[r] = LogSumExp(logits, classes);
    loss.mutable_values()[r] = lse.values()[r] - logits[static_cast<int64_t>((*xs[1])[r])];
  });
  std::vector<HostTensor> results;
  results.push_back(std::move(loss));
  results.push_back(std::move(lse));
  return results;
}

absl::StatusOr<HostTensor> EvalCrossEntropyGrad(const Node& node, Operands xs, const EvalContext& ctx) {
  const Rows rows = RowsOf(xs[0]->type());
  const int64_t classes = CrossEntropyClasses(node);
  RETURN_IF_ERROR(CheckLabels(*xs[1], classes));
  HostTensor out(node.type());  // zeros: the padding columns' gradient
  ForEachRow(ctx, rows, [&](int64_t r) {
    double* dlogits = out.mutable_values().data() + r * rows.length;
    const double* logits = xs[0]->values().data() + r * rows.length;
    const double lse = (*xs[3])[r];
    for (int64_t i = 0; i < classes; ++i) dlogits[i] = std::exp(logits[i] - lse);
    dlogits[static_cast<int64_t>((*xs[1])[r])] -= 1.0;
    const double dloss = (*xs[2])[r];
    for (int64_t i = 0; i < classes; ++i) dlogits[i] *= dloss;
    if (node.type().dtype != DType::kF32) RoundValuesToDType(dlogits, classes, DType::kF32, ctx.options.f32_as_f64);
  });
  return out;
}

}  // namespace kiln::reference
