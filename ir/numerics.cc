#include "ir/numerics.h"

#include <bit>
#include <cmath>
#include <limits>

namespace kiln {
namespace {

// A binary float format narrower than f32, described by its fields.
struct FloatFormat {
  int mantissa_bits;   // explicit fraction bits
  int exponent_bits;
  int min_exponent;    // exponent of the smallest normal, 2^min_exponent
  double min_normal;   // 2^min_exponent
  double max_finite;
  bool saturate;       // overflow and ±inf go to ±max_finite instead of ±inf
  bool nan_is_all_ones;  // E4M3FN: S.1111.111 is NaN and there is no inf
};

constexpr FloatFormat kBF16 = {7, 8, -126, 0x1p-126, 0x1.fep127, false, false};
constexpr FloatFormat kF16 = {10, 5, -14, 0x1p-14, 65504.0, false, false};
constexpr FloatFormat kE4M3 = {3, 4, -6, 0x1p-6, 448.0, true, true};
constexpr FloatFormat kE5M2 = {2, 5, -14, 0x1p-14, 57344.0, true, false};

// Round to nearest even from a double, with one rounding.
double RoundToFormat(double v, const FloatFormat& f) {
  if (std::isnan(v)) return v;
  if (std::isinf(v)) return f.saturate ? std::copysign(f.max_finite, v) : v;
  const double a = std::fabs(v);
  if (a == 0) return v;  // keeps -0.0
  double r;
  if (a >= f.min_normal) {
    // Normal in the target: drop the low fraction bits of the double with RNE. A carry
    // out of the fraction correctly bumps the exponent.
    const int drop = 52 - f.mantissa_bits;
    uint64_t bits = std::bit_cast<uint64_t>(a);
    const uint64_t lsb = (bits >> drop) & 1;
    bits += ((uint64_t{1} << (drop - 1)) - 1) + lsb;
    bits &= ~((uint64_t{1} << drop) - 1);
    r = std::bit_cast<double>(bits);
  } else {
    // Subnormal in the target: a multiple of the smallest subnormal. Scaling by a power
    // of two is exact, and rint rounds ties to even in the default rounding mode.
    const double quantum = std::ldexp(1.0, f.min_exponent - f.mantissa_bits);
    r = std::rint(a / quantum) * quantum;
  }
  if (r > f.max_finite) r = f.saturate ? f.max_finite : std::numeric_limits<double>::infinity();
  return std::copysign(r, v);
}

// Bits of a value that `f` represents exactly (the output of RoundToFormat).
uint32_t EncodeRepresentable(double r, const FloatFormat& f) {
  const int m = f.mantissa_bits;
  const uint32_t exp_all_ones = (uint32_t{1} << f.exponent_bits) - 1;
  const uint32_t sign = std::signbit(r) ? uint32_t{1} << (m + f.exponent_bits) : 0;
  if (std::isnan(r)) {
    if (f.nan_is_all_ones) return sign | (exp_all_ones << m) | ((uint32_t{1} << m) - 1);
    return sign | (exp_all_ones << m) | (uint32_t{1} << (m - 1));  // quiet NaN
  }
  if (std::isinf(r)) return sign | (exp_all_ones << m);
  const double a = std::fabs(r);
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);  // a = frac * 2^e with frac in [0.5, 1)
  const int exponent = e - 1;
  if (exponent < f.min_exponent) {
    return sign | static_cast<uint32_t>(std::ldexp(a, m - f.min_exponent));
  }
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  const uint32_t fraction = static_cast<uint32_t>(std::ldexp(a, m - exponent)) - (uint32_t{1} << m);
  return sign | (static_cast<uint32_t>(exponent + bias) << m) | fraction;
}

double Decode(uint32_t bits, const FloatFormat& f) {
  const int m = f.mantissa_bits;
  const uint32_t exp_all_ones = (uint32_t{1} << f.exponent_bits) - 1;
  const bool negative = (bits >> (m + f.exponent_bits)) & 1;
  const uint32_t exponent_field = (bits >> m) & exp_all_ones;
  const uint32_t fraction = bits & ((uint32_t{1} << m) - 1);
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  double a;
  if (f.nan_is_all_ones && exponent_field == exp_all_ones && fraction == (uint32_t{1} << m) - 1) {
    a = std::numeric_limits<double>::quiet_NaN();
  } else if (!f.nan_is_all_ones && exponent_field == exp_all_ones) {
    a = fraction == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent_field == 0) {
    a = std::ldexp(static_cast<double>(fraction), f.min_exponent - m);
  } else {
    a = std::ldexp(static_cast<double>(fraction + (uint32_t{1} << m)), static_cast<int>(exponent_field) - bias - m);
  }
  return negative ? -a : a;
}

// Truncate toward zero, clamp to [lo, hi], NaN -> 0.
double TruncateAndClamp(double v, double lo, double hi) {
  if (std::isnan(v)) return 0;
  const double t = std::trunc(v);
  return t < lo ? lo : (t > hi ? hi : t);
}

constexpr double kI32Min = -2147483648.0;
constexpr double kI32Max = 2147483647.0;
// 2^63 - 1 is not a double; the largest double below 2^63 is the top of the i64 range.
constexpr double kI64Min = -0x1p63;
constexpr double kI64Max = 0x1.fffffffffffffp62;

template <typename Fn>
void RoundEach(double* values, int64_t n, Fn round) {
  for (int64_t i = 0; i < n; ++i) values[i] = round(values[i]);
}

}  // namespace

double RoundToDType(double v, DType t) {
  switch (t) {
    case DType::kF32:
      return static_cast<double>(static_cast<float>(v));
    case DType::kF16:
      return RoundToFormat(v, kF16);
    case DType::kBF16:
      return RoundToFormat(v, kBF16);
    case DType::kF8E4M3:
      return RoundToFormat(v, kE4M3);
    case DType::kF8E5M2:
      return RoundToFormat(v, kE5M2);
    case DType::kI32:
      return TruncateAndClamp(v, kI32Min, kI32Max);
    case DType::kI64:
      return TruncateAndClamp(v, kI64Min, kI64Max);
    case DType::kPred:
      return v != 0 ? 1.0 : 0.0;
  }
  return v;
}

void RoundValuesToDType(double* values, int64_t n, DType t, bool keep_f32_in_f64) {
  // One switch per call, not per element: this runs over every tensor the backend makes.
  switch (t) {
    case DType::kF32:
      if (!keep_f32_in_f64) RoundEach(values, n, [](double v) { return static_cast<double>(static_cast<float>(v)); });
      return;
    case DType::kF16:
      return RoundEach(values, n, [](double v) { return RoundToFormat(v, kF16); });
    case DType::kBF16:
      return RoundEach(values, n, [](double v) { return RoundToFormat(v, kBF16); });
    case DType::kF8E4M3:
      return RoundEach(values, n, [](double v) { return RoundToFormat(v, kE4M3); });
    case DType::kF8E5M2:
      return RoundEach(values, n, [](double v) { return RoundToFormat(v, kE5M2); });
    case DType::kI32:
      return RoundEach(values, n, [](double v) { return TruncateAndClamp(v, kI32Min, kI32Max); });
    case DType::kI64:
      return RoundEach(values, n, [](double v) { return TruncateAndClamp(v, kI64Min, kI64Max); });
    case DType::kPred:
      return RoundEach(values, n, [](double v) { return v != 0 ? 1.0 : 0.0; });
  }
}

uint16_t FloatToBF16Bits(float v) { return EncodeRepresentable(RoundToFormat(v, kBF16), kBF16); }
float BF16BitsToFloat(uint16_t bits) { return static_cast<float>(Decode(bits, kBF16)); }
uint16_t FloatToF16Bits(float v) { return EncodeRepresentable(RoundToFormat(v, kF16), kF16); }
float F16BitsToFloat(uint16_t bits) { return static_cast<float>(Decode(bits, kF16)); }
uint8_t FloatToF8E4M3Bits(float v) { return EncodeRepresentable(RoundToFormat(v, kE4M3), kE4M3); }
float F8E4M3BitsToFloat(uint8_t bits) { return static_cast<float>(Decode(bits, kE4M3)); }
uint8_t FloatToF8E5M2Bits(float v) { return EncodeRepresentable(RoundToFormat(v, kE5M2), kE5M2); }
float F8E5M2BitsToFloat(uint8_t bits) { return static_cast<float>(Decode(bits, kE5M2)); }

}  // namespace kiln
