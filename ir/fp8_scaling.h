// Delayed scaling's arithmetic (ir/op_table.h: fp8_quantize, fp8_scale_update), one
// definition for the reference backend and the host code that reads a state back (the
// training report). kernels/fp8.cuh computes the same in f32 with exact ldexp steps.
//
// A state is f32 [L + 2]: [e, overflows, amax_1 .. amax_L], all zero initially. The scale is
// 2^e, a power of two so that x 2^e and q 2^-e are exact and an FP8 GEMM of (q, 2^-e) is
// bit for bit the GEMM of the dequantized values (passes/fp8_policy.h).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "ir/attributes.h"
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

// Where an fp8_quantize's results sit (ir/op_table.h): q 0, amax 1, scale_inv 2, then q_t
// with {transposed=1}, then the next state with {update_state=1}.
struct Fp8QuantizeResults {
  static constexpr int kQ = 0, kAmax = 1, kScaleInv = 2;
  int q_t = -1;         // result index, or -1 for none
  int next_state = -1;  // result index, or -1 for none
  int64_t margin = 0;   // with next_state: fp8_scale_update's margin
  int count = 3;
  bool transposed() const { return q_t >= 0; }
  bool updates_state() const { return next_state >= 0; }
};

// From the node's attributes; fails on a transposed or update_state other than 0 or 1, or a
// margin outside [0, 16] (or one without update_state=1).
absl::StatusOr<Fp8QuantizeResults> Fp8QuantizeResultsOf(const AttrMap& attrs);

}  // namespace kiln
