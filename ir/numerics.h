// Rounding of real values to kiln's element types, and the bit encodings of the narrow
// floats. The CPU reference backend stores every element as a double and calls
// RoundToDType after each op, so a tensor always holds exactly the values its dtype can
// represent; GPU results are then compared against these with tight tolerances.
//
// Float formats round to nearest, ties to even, straight from the double (one rounding).
//   f32, bf16, f16   IEEE-style: overflow -> ±inf, NaN and ±0 kept, subnormals kept.
//   f8e4m3           OCP E4M3FN: no inf, max finite 448. Out-of-range values and ±inf
//                    saturate to ±448; NaN stays NaN.
//   f8e5m2           max finite 57344. We saturate (±inf and overflow -> ±57344) like the
//                    GPU's cvt.*.satfinite, which is how kiln's FP8 GEMM path converts;
//                    NaN stays NaN.
// Integer types truncate toward zero, then clamp to the type's range (NaN -> 0), like
// PTX cvt.rzi.s32.f32. Integer arithmetic that overflows therefore saturates rather than
// wraps; kiln programs use integers for indices and positions, far from the limits.
// i64 is exact only up to 2^53 since values are held in doubles.
// pred: v != 0 (NaN counts as true) -> 1.0 or 0.0.
#pragma once

#include <cstdint>

#include "ir/types.h"

namespace kiln {

double RoundToDType(double v, DType t);

// Rounds every value in place; with keep_f32_in_f64, f32 values are left in double
// precision (ReferenceOptions::f32_as_f64), narrower types still round.
void RoundValuesToDType(double* values, int64_t n, DType t, bool keep_f32_in_f64 = false);

// Encoders round like RoundToDType (from the float, one rounding); NaN encodes as the
// format's canonical quiet NaN with the input's sign. Decoders are exact.
uint16_t FloatToBF16Bits(float v);
float BF16BitsToFloat(uint16_t bits);
uint16_t FloatToF16Bits(float v);
float F16BitsToFloat(uint16_t bits);
uint8_t FloatToF8E4M3Bits(float v);
float F8E4M3BitsToFloat(uint8_t bits);
uint8_t FloatToF8E5M2Bits(float v);
float F8E5M2BitsToFloat(uint8_t bits);

}  // namespace kiln
