// rms_norm and its exact gradients, row by row over the last dim, in double.
//   r  = 1 / sqrt(mean(x^2) + eps)
//   y  = x * r * w
//   dx = r * (w * dy) - x * r^3 / D * sum(w * dy * x)
//   dw = sum over rows of dy * x * r
// and layer_norm, the same of the centered row c = x - mean(x), plus the bias:
//   y  = c * (1 / sqrt(mean(c^2) + eps)) * w + b
// and layer_norm's input gradient (layer_norm_grad_input), with xhat = c / sqrt(mean(c^2) + eps):
//   dx = r * (w * dy - mean(w * dy)) - xhat * r * mean(w * dy * xhat)
//   dw = sum over rows of dy * xhat;  db = sum over rows of dy
// The fused residual forms (add_rms_norm, add_layer_norm, add_*_norm_grad_input) round
// every intermediate the unfused ops would have stored, so they equal those ops bit for bit.
#include <algorithm>
#include <cmath>

#include "ir/numerics.h"
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

// One row of each norm, in double; the Eval functions below run them over rows.
void RmsNormRow(const double* x, const double* w, int64_t length, double eps, double* y) {
  const double inv_rms = InverseRms(x, length, eps);
  for (int64_t i = 0; i < length; ++i) y[i] = x[i] * inv_rms * w[i];
}

void LayerNormRow(const double* x, const double* w, const double* bias, int64_t length, double eps, double* y) {
  double sum = 0;
  for (int64_t i = 0; i < length; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(length);
  for (int64_t i = 0; i < length; ++i) y[i] = x[i] - mean;  // centered, then normed in place
  const double inv_std = InverseRms(y, length, eps);
  for (int64_t i = 0; i < length; ++i) y[i] = y[i] * inv_std * w[i] + bias[i];
}

void RmsNormGradInputRow(const double* x, const double* w, const double* dy, int64_t length, double eps,
                         double* dx) {
  const double inv_rms = InverseRms(x, length, eps);
  double dot = 0;  // sum(w * dy * x)
  for (int64_t i = 0; i < length; ++i) dot += w[i] * dy[i] * x[i];
  const double scale = inv_rms * inv_rms * inv_rms * dot / static_cast<double>(length);
  for (int64_t i = 0; i < length; ++i) dx[i] = inv_rms * w[i] * dy[i] - x[i] * scale;
}

// layer_norm_grad_input's row (llm.c's layernorm_backward), in double:
//   xhat = (x - mean) r;  g = w dy;  dx = r (g - mean(g) - xhat mean(g xhat))
// Computed on the centered row c = x - mean as rms_norm's gradient is, with g centered:
// dx = r (g - mean(g)) - c r^3 sum(g c) / D.
void LayerNormGradInputRow(const double* x, const double* w, const double* dy, int64_t length, double eps,
                           double* dx) {
  double sum = 0;
  for (int64_t i = 0; i < length; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(length);
  for (int64_t i = 0; i < length; ++i) dx[i] = x[i] - mean;  // c, in place
  const double inv_std = InverseRms(dx, length, eps);
  double g_sum = 0, dot = 0;  // sum(g), sum(g c)
  for (int64_t i = 0; i < length; ++i) {
    g_sum += w[i] * dy[i];
    dot += w[i] * dy[i] * dx[i];
  }
  const double g_mean = g_sum / static_cast<double>(length);
  const double scale = inv_std * inv_std * inv_std * dot / static_cast<double>(length);
  for (int64_t i = 0; i < length; ++i) dx[i] = inv_std * (w[i] * dy[i] - g_mean) - dx[i] * scale;
}

// A norm's y over every row of x (x's type), then, for {out_dtype}, rounded to x's dtype
// first: the evaluator rounds to out_dtype after, so y is convert(norm(x)) bit for bit.
template <typename Row>
HostTensor NormOfRows(const HostTensor& x, const TensorType& y_type, const EvalContext& ctx, Row row) {
  const Rows rows = RowsOf(x.type());
  HostTensor out(y_type);
  ForEachRow(ctx, rows, [&](int64_t r) {
    double* y = out.mutable_values().data() + r * rows.length;
    row(x.values().data() + r * rows.length, rows.length, y);
    if (y_type.dtype != x.type().dtype) {
      RoundValuesToDType(y, rows.length, x.type().dtype, ctx.options.f32_as_f64);
    }
  });
  return out;
}

}  // namespace

absl::StatusOr<HostTensor> EvalRmsNorm(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const double* w = xs[1]->values().data();
  return NormOfRows(*xs[0], node.type(), ctx,
                    [&](const double* x, int64_t length, double* y) { RmsNormRow(x, w, length, eps, y); });
}

absl::StatusOr<HostTensor> EvalLayerNorm(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const double* w = xs[1]->values().data();
  const double* bias = xs[2]->values().data();
  return NormOfRows(*xs[0], node.type(), ctx,
                    [&](const double* x, int64_t length, double* y) { LayerNormRow(x, w, bias, length, eps, y); });
}

// sum = h + branch rounded to its dtype (as add's result is), then the norm of that sum.
absl::StatusOr<std::vector<HostTensor>> EvalAddNorm(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  HostTensor sum(node.result_type(0));
  {
    const std::vector<double>& h = xs[0]->values();
    const std::vector<double>& branch = xs[1]->values();
    std::vector<double>& s = sum.mutable_values();
    ctx.pool.ParallelFor(static_cast<int64_t>(s.size()), kElementsPerChunk, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) s[i] = h[i] + branch[i];
      RoundValuesToDType(s.data() + begin, end - begin, sum.type().dtype, ctx.options.f32_as_f64);
    });
  }
  const double* w = xs[2]->values().data();
  HostTensor y;
  if (node.opcode() == Opcode::kAddRmsNorm) {
    y = NormOfRows(sum, node.result_type(1), ctx,
                   [&](const double* x, int64_t length, double* out) { RmsNormRow(x, w, length, eps, out); });
  } else {
    const double* bias = xs[3]->values().data();
    y = NormOfRows(sum, node.result_type(1), ctx, [&](const double* x, int64_t length, double* out) {
      LayerNormRow(x, w, bias, length, eps, out);
    });
  }
  std::vector<HostTensor> results;
  results.push_back(std::move(sum));
  results.push_back(std::move(y));
  return results;
}

namespace {

// rms_norm_grad_weight(x, w, dy) of type `dw_type`: the one definition, which the input
// gradients' {weight_grad=1} result shares, so the two are equal bit for bit.
HostTensor RmsNormGradWeightOf(const HostTensor& x, const HostTensor& dy, const TensorType& dw_type, double eps) {
  const Rows rows = RowsOf(x.type());
  HostTensor out(dw_type);
  double* dw = out.mutable_values().data();
  // Serial over rows: the sum over rows is in row order, independent of the thread count.
  for (int64_t r = 0; r < rows.count; ++r) {
    const double* xr = x.values().data() + r * rows.length;
    const double* dyr = dy.values().data() + r * rows.length;
    const double inv_rms = InverseRms(xr, rows.length, eps);
    for (int64_t i = 0; i < rows.length; ++i) dw[i] += dyr[i] * xr[i] * inv_rms;
  }
  return out;
}

// {weight_grad=1}: is the last result dw?
bool WritesWeightGrad(const Node& node) {
  return node.attrs().Has("weight_grad") && node.attrs().GetInt("weight_grad").value_or(0) == 1;
}

}  // namespace

absl::StatusOr<std::vector<HostTensor>> EvalRmsNormGradInput(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const Rows rows = RowsOf(xs[0]->type());
  const double* w = xs[1]->values().data();
  HostTensor out(node.result_type(0));
  ForEachRow(ctx, rows, [&](int64_t r) {
    const int64_t at = r * rows.length;
    RmsNormGradInputRow(xs[0]->values().data() + at, w, xs[2]->values().data() + at, rows.length, eps,
                        out.mutable_values().data() + at);
  });
  std::vector<HostTensor> results;
  results.push_back(std::move(out));
  if (WritesWeightGrad(node)) results.push_back(RmsNormGradWeightOf(*xs[0], *xs[2], node.result_type(1), eps));
  return results;
}

// dx = dres + (the input gradient rounded to dx's dtype, as rms_norm_grad_input's result
// is); the copy is dx again, which the evaluator rounds to copy_dtype.
absl::StatusOr<std::vector<HostTensor>> EvalAddRmsNormGradInput(const Node& node, Operands xs,
                                                                const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const Rows rows = RowsOf(xs[1]->type());
  const double* w = xs[2]->values().data();
  const DType dtype = node.result_type(0).dtype;
  HostTensor dx(node.result_type(0));
  ForEachRow(ctx, rows, [&](int64_t r) {
    const int64_t at = r * rows.length;
    double* out = dx.mutable_values().data() + at;
    RmsNormGradInputRow(xs[1]->values().data() + at, w, xs[3]->values().data() + at, rows.length, eps, out);
    RoundValuesToDType(out, rows.length, dtype, ctx.options.f32_as_f64);
    const double* dres = xs[0]->values().data() + at;
    for (int64_t i = 0; i < rows.length; ++i) out[i] += dres[i];
    RoundValuesToDType(out, rows.length, dtype, ctx.options.f32_as_f64);
  });
  const bool weight_grad = WritesWeightGrad(node);
  std::vector<HostTensor> results;
  if (node.num_results() == (weight_grad ? 3 : 2)) {  // the copy
    HostTensor copy(node.result_type(1));
    copy.mutable_values() = dx.values();
    results.push_back(std::move(dx));
    results.push_back(std::move(copy));
  } else {
    results.push_back(std::move(dx));
  }
  if (weight_grad) {
    results.push_back(RmsNormGradWeightOf(*xs[1], *xs[3], node.result_type(node.num_results() - 1), eps));
  }
  return results;
}

namespace {

// layer_norm_grad_input's {weight_grad=1} results: dw = sum over rows of dy xhat and db = the
// sum over rows of dy, both of type `type` (w's), serial over rows (in row order, whatever the
// thread count).
void LayerNormGradWeightAndBiasOf(const HostTensor& x, const HostTensor& dy, const TensorType& type, double eps,
                                  std::vector<HostTensor>& results) {
  const Rows rows = RowsOf(x.type());
  HostTensor dw_out(type), db_out(type);
  double* dw = dw_out.mutable_values().data();
  double* db = db_out.mutable_values().data();
  std::vector<double> c(static_cast<size_t>(rows.length));
  for (int64_t r = 0; r < rows.count; ++r) {
    const double* xr = x.values().data() + r * rows.length;
    const double* dyr = dy.values().data() + r * rows.length;
    double sum = 0;
    for (int64_t i = 0; i < rows.length; ++i) sum += xr[i];
    const double mean = sum / static_cast<double>(rows.length);
    for (int64_t i = 0; i < rows.length; ++i) c[i] = xr[i] - mean;
    const double inv_std = InverseRms(c.data(), rows.length, eps);
    for (int64_t i = 0; i < rows.length; ++i) {
      dw[i] += dyr[i] * c[i] * inv_std;
      db[i] += dyr[i];
    }
  }
  results.push_back(std::move(dw_out));
  results.push_back(std::move(db_out));
}

}  // namespace

// layer_norm_grad_input(x, w, dy) and add_layer_norm_grad_input(dres, x, w, dy): dx, for the
// residual form dres + (dx rounded to its dtype, as the plain op's result is), the copy (dx
// again, which the evaluator rounds to copy_dtype), then dw and db for {weight_grad=1}.
absl::StatusOr<std::vector<HostTensor>> EvalLayerNormGradInput(const Node& node, Operands xs,
                                                               const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const bool residual = node.opcode() == Opcode::kAddLayerNormGradInput;
  const int x_at = residual ? 1 : 0;
  const HostTensor& x = *xs[x_at];
  const HostTensor& dy = *xs[x_at + 2];
  const Rows rows = RowsOf(x.type());
  const double* w = xs[x_at + 1]->values().data();
  const DType dtype = node.result_type(0).dtype;
  HostTensor dx(node.result_type(0));
  ForEachRow(ctx, rows, [&](int64_t r) {
    const int64_t at = r * rows.length;
    double* out = dx.mutable_values().data() + at;
    LayerNormGradInputRow(x.values().data() + at, w, dy.values().data() + at, rows.length, eps, out);
    if (!residual) return;
    RoundValuesToDType(out, rows.length, dtype, ctx.options.f32_as_f64);
    const double* dres = xs[0]->values().data() + at;
    for (int64_t i = 0; i < rows.length; ++i) out[i] += dres[i];
    RoundValuesToDType(out, rows.length, dtype, ctx.options.f32_as_f64);
  });
  const bool weight_grad = WritesWeightGrad(node);
  const bool copy = residual && node.num_results() == (weight_grad ? 4 : 2);
  std::vector<HostTensor> results;
  if (copy) {
    HostTensor dx_copy(node.result_type(1));
    dx_copy.mutable_values() = dx.values();
    results.push_back(std::move(dx));
    results.push_back(std::move(dx_copy));
  } else {
    results.push_back(std::move(dx));
  }
  if (weight_grad) LayerNormGradWeightAndBiasOf(x, dy, node.result_types().back(), eps, results);
  return results;
}

absl::StatusOr<HostTensor> EvalRmsNormGradWeight(const Node& node, Operands xs, const EvalContext&) {
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  return RmsNormGradWeightOf(*xs[0], *xs[2], node.type(), eps);
}

}  // namespace kiln::reference
