#include "ir/fp8_scaling.h"

#include <algorithm>
#include <cmath>

namespace kiln {

double Fp8MaxFinite(DType format) { return format == DType::kF8E5M2 ? 57344.0 : 448.0; }

int Fp8ScaleExponent(double v) {
  if (std::isnan(v)) return 0;
  const double e = std::floor(v);
  return static_cast<int>(std::clamp(e, static_cast<double>(kFp8MinExponent), static_cast<double>(kFp8MaxExponent)));
}

int Fp8ExponentForAmax(double m, DType format, int margin) {
  // A history holding +inf (fp8_scale_update never records one; a state given from outside
  // might): the smallest scale, as kernels/fp8.cuh gives.
  if (!std::isfinite(m)) return kFp8MinExponent;
  const double max_finite = Fp8MaxFinite(format);
  int m_exp = 0, max_exp = 0;
  std::frexp(m, &m_exp);
  std::frexp(max_finite, &max_exp);
  int e = max_exp - m_exp;  // within one of the answer; ldexp by a power of two is exact
  while (std::ldexp(m, e) > max_finite) --e;
  while (std::ldexp(m, e + 1) <= max_finite) ++e;
  return std::clamp(e - margin, kFp8MinExponent, kFp8MaxExponent);
}

void Fp8ScaleUpdate(double* state, int64_t n, double amax, DType format, int margin) {
  const int e = Fp8ScaleExponent(state[0]);
  if (!std::isfinite(amax)) {  // an overflow: keep the history, back the scale off by half
    state[0] = std::max(e - 1, kFp8MinExponent);
    state[1] += 1;
    return;
  }
  for (int64_t i = n - 1; i > kFp8StateHeader; --i) state[i] = state[i - 1];
  state[kFp8StateHeader] = amax;
  double m = 0;
  for (int64_t i = kFp8StateHeader; i < n; ++i) m = std::max(m, state[i]);
  state[0] = m > 0 ? Fp8ExponentForAmax(m, format, margin) : e;
}

}  // namespace kiln
