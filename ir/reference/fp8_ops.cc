// fp8_quantize, fp8_dequantize, fp8_scale_update (ir/op_table.h) in double. The evaluator
// rounds each result to its dtype, which is the quantization itself: x 2^e is exact in
// double, and RoundToDType rounds it once to e4m3/e5m2, saturating (ir/numerics.h), as the
// kernel's cvt.satfinite does.
#include <cmath>

#include "ir/fp8_scaling.h"
#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {

absl::StatusOr<std::vector<HostTensor>> EvalFp8Quantize(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(const Fp8QuantizeResults layout, Fp8QuantizeResultsOf(node.attrs()));
  const HostTensor& x = *xs[0];
  const int e = Fp8ScaleExponent((*xs[1])[0]);
  const double scale = std::ldexp(1.0, e);
  std::vector<HostTensor> results;
  for (int r = 0; r < node.num_results(); ++r) results.emplace_back(node.result_type(r));
  std::vector<double>& q = results[0].mutable_values();
  const int64_t n = x.num_elements();
  ctx.pool.ParallelFor(n, kElementsPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) q[i] = x[i] * scale;
  });
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(x[i]);
    if (std::isnan(a)) {
      amax = a;
      break;
    }
    amax = std::max(amax, a);
  }
  results[1].mutable_values()[0] = amax;
  results[2].mutable_values()[0] = std::ldexp(1.0, -e);
  if (layout.transposed()) {  // q_t: x as [R, C] transposed to [C, R]
    const int64_t cols = x.type().dims.back(), rows = cols == 0 ? 0 : n / cols;
    std::vector<double>& qt = results[layout.q_t].mutable_values();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) qt[c * rows + r] = q[r * cols + c];
    }
  }
  if (layout.updates_state()) {  // fp8_scale_update(state, amax) {fp8_format=out_dtype, margin}
    ASSIGN_OR_RETURN(DType format, node.attrs().GetDType("out_dtype"));
    HostTensor& next = results[layout.next_state];
    next = *xs[1];
    // amax as the f32 result the unfused update reads (|x| of a float input is exact in f32).
    Fp8ScaleUpdate(next.mutable_values().data(), next.num_elements(), static_cast<float>(amax), format,
                   static_cast<int>(layout.margin));
  }
  return results;
}

absl::StatusOr<HostTensor> EvalFp8Dequantize(const Node& node, Operands xs, const EvalContext&) {
  HostTensor out(node.type());
  const double scale_inv = (*xs[1])[0];
  for (int64_t i = 0; i < out.num_elements(); ++i) out.mutable_values()[i] = (*xs[0])[i] * scale_inv;
  return out;
}

absl::StatusOr<HostTensor> EvalFp8ScaleUpdate(const Node& node, Operands xs, const EvalContext&) {
  ASSIGN_OR_RETURN(DType format, node.attrs().GetDType("fp8_format"));
  ASSIGN_OR_RETURN(int64_t margin, node.attrs().GetInt("margin"));
  HostTensor out = *xs[0];
  Fp8ScaleUpdate(out.mutable_values().data(), out.num_elements(), (*xs[1])[0], format, static_cast<int>(margin));
  return out;
}

}  // namespace kiln::reference
