// Delayed scaling's arithmetic (ir/op_table.h: fp8_quantize, fp8_scale_update), one
// definition for the reference backend and the host code that reads a state back (the
// training report). kernels/fp8.cuh computes the same in f32 with exact ldexp steps.
//
// A state is f32 [L + 2]: [e, overflows, amax_1 .. amax_L], all zero initially. The scale is
// 2^e, a power of two so that x 2^e and q 2^-e are exact and an FP8 GEMM of (q, 2^-e) is
// bit for bit the GEMM of the dequantized values (passes/fp8_policy.h).
#pragma once

#include <cstdint>

#include "ir/types.h"

namespace kiln {

inline constexpr int kFp8MinExponent = -64;
inline constexpr int kFp8MaxExponent = 64;
inline constexpr int kFp8StateHeader = 2;  // e, overflows; the amax history follows

// The largest finite value of an fp8 format: 448 (e4m3), 57344 (e5m2).
double Fp8MaxFinite(DType format);

// The scale exponent a state's first element stands for: floor(v) clamped to
// [kFp8MinExponent, kFp8MaxExponent] (NaN: 0).
int Fp8ScaleExponent(double v);

// The exponent fp8_scale_update chooses for a history whose max is m > 0: the largest
// integer e with m 2^e <= Fp8MaxFinite(format), minus margin, clamped (m = +inf:
// kFp8MinExponent).
int Fp8ExponentForAmax(double m, DType format, int margin);

// fp8_scale_update on one state (n = L + 2 values), in place.
void Fp8ScaleUpdate(double* state, int64_t n, double amax, DType format, int margin);

}  // namespace kiln
