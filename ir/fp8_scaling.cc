#include "ir/fp8_scaling.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

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

absl::StatusOr<Fp8QuantizeResults> Fp8QuantizeResultsOf(const AttrMap& attrs) {
  auto flag = [&](absl::string_view name) -> absl::StatusOr<bool> {
    if (!attrs.Has(name)) return false;
    ASSIGN_OR_RETURN(int64_t v, attrs.GetInt(name));
    if (v != 0 && v != 1) return absl::InvalidArgumentError(absl::StrCat("fp8_quantize ", name, " must be 0 or 1, got ", v));
    return v == 1;
  };
  Fp8QuantizeResults r;
  ASSIGN_OR_RETURN(const bool transposed, flag("transposed"));
  ASSIGN_OR_RETURN(const bool updates_state, flag("update_state"));
  if (transposed) r.q_t = r.count++;
  if (updates_state) {
    r.next_state = r.count++;
    ASSIGN_OR_RETURN(r.margin, attrs.GetInt("margin"));
    if (r.margin < 0 || r.margin > 16) {
      return absl::InvalidArgumentError(absl::StrCat("fp8_quantize margin ", r.margin, " must be in [0, 16]"));
    }
  } else if (attrs.Has("margin")) {
    return absl::InvalidArgumentError("fp8_quantize margin is fp8_scale_update's: it needs update_state=1");
  }
  return r;
}

}  // namespace kiln
