// What cuBLASLt's FP8 GEMMs take (CUDA 13, sm_89/sm_90), one definition for the runtime that
// plans them (runtime/cuda/gemm.cc GemmPlan::CheckSupported) and the pass that chooses them
// (select-fp8-gemm, through codegen/capabilities.cc). Header only: the runtime links nothing
// of codegen (codegen/program.h).
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/program.h"

namespace kiln {

inline bool IsFp8Gemm(const GemmDescription& g) { return IsFp8(g.a_dtype) || IsFp8(g.b_dtype); }

// "a_layout=mk, b_layout=nk": the gemm's layouts as the IR writes them.
inline std::string GemmLayouts(const GemmDescription& g) {
  return absl::StrCat("a_layout=", g.a_k_inner ? "mk" : "km", ", b_layout=", g.b_k_inner ? "nk" : "kn");
}

// Why cuBLASLt takes no FP8 GEMM like `g` (gemm.h's table), or "" when it takes it.
inline std::string Fp8GemmUnsupportedReason(const GemmDescription& g) {
  const std::string types = absl::StrCat(DTypeName(g.a_dtype), " x ", DTypeName(g.b_dtype), " -> ", DTypeName(g.d_dtype));
  if (!IsFp8(g.a_dtype) || !IsFp8(g.b_dtype)) return absl::StrCat(types, ": both operands must be fp8");
  if (!g.scaled) return absl::StrCat(types, ": fp8 operands take scaled=1 (a_scale, b_scale, d_scale)");
  if (g.a_dtype == DType::kF8E5M2 && g.b_dtype == DType::kF8E5M2) {
    return absl::StrCat(types, ": cuBLASLt has no e5m2 x e5m2 GEMM (one operand e4m3: e4m3 x e5m2 or e5m2 x e4m3)");
  }
  if (!g.a_k_inner || !g.b_k_inner) {
    return absl::StrCat(GemmLayouts(g), ": FP8 cuBLASLt on sm_90 takes only K-inner operands (TN: a_layout=mk, ",
                        "b_layout=nk); write the transposed copy in the producer");
  }
  if (g.k % 16 != 0) return absl::StrCat("K ", g.k, ": FP8 cuBLASLt takes K a multiple of 16 (16-byte rows)");
  const bool fp8_d = IsFp8(g.d_dtype);
  if (g.d_dtype == DType::kF8E5M2 && g.a_dtype == DType::kF8E4M3 && g.b_dtype == DType::kF8E4M3) {
    return absl::StrCat(types, ": cuBLASLt writes an e5m2 D from mixed operands only (e4m3 x e4m3 -> e4m3, bf16, ",
                        "f16 or f32)");
  }
  if (!fp8_d && g.d_dtype != DType::kBF16 && g.d_dtype != DType::kF16 && g.d_dtype != DType::kF32) {
    return absl::StrCat(types, ": FP8 cuBLASLt writes D in bf16, f16, f32 or fp8");
  }
  if (fp8_d && g.beta != 0) {
    return absl::StrCat(types, " with beta=", g.beta, ": cuBLASLt's C for an fp8 D is bf16 or f16, not the D's ",
                        DTypeName(g.d_dtype), " the gemm's c has");
  }
  if (g.bias && (g.d_dtype == DType::kF32 || fp8_d)) {
    return absl::StrCat(types, " with epilogue=bias: cuBLASLt's FP8 bias for a ", DTypeName(g.d_dtype),
                        " D is bf16", fp8_d ? " or f16" : "", ", not the D's dtype the gemm's bias has");
  }
  if (g.amax && !fp8_d) {
    return absl::StrCat(types, " with amax=1: cuBLASLt computes AMAX_D for an fp8 D only (for a ",
                        DTypeName(g.d_dtype), " D no algorithm runs); the amax of a wide result must come from the ",
                        "kernel that consumes it");
  }
  return "";
}

}  // namespace kiln
