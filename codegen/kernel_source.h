// What every generated kernel source shares: its name, its opening (a comment naming the
// node and its IR line, the CUDA headers its dtypes need, and a small device library of
// loads, one-rounding stores and 16-byte vectors), launch geometry and index types.
//
// Numerics of generated code (ir/numerics.h is the contract):
//   - Floats of every width compute in f32 and round once to the result dtype
//     (__float2bfloat16_rn, __float2half_rn, __nv_cvt_float_to_fp8 with __NV_SATFINITE).
//     For +, -, *, /, sqrt of bf16/f16/f8 operands this equals the reference's "compute in
//     double, round once": f32 has more than 2p+2 significand bits for those formats, so
//     the double rounding through f32 is innocuous (Figueroa, 1995).
//   - f32 add/sub/mul/div/sqrt/max/min/compare/select/convert are IEEE and so bit-exact;
//     exp/log/tanh/rsqrt/sigmoid use CUDA's f32 functions (gelu computes in double) (within 2 ulp of the reference's
//     correctly rounded double result). No fast-math; arithmetic is written with __fadd_rn
//     and friends so that no FMA contraction changes a result.
//   - Integers compute in double, as the reference holds them, and store truncating toward
//     zero and clamping (NaN -> 0); integer division truncates. Conversions from integers
//     to floats go through double, so an i32 rounds once to bf16 as in the reference.
//   - pred loads as 0/1 and stores v != 0 (NaN is true).
// Vector accesses assume every buffer starts 16-byte aligned, as the arena places them
// (passes/buffer_plan.h aligns to 256); an alias (reshape) starts where its operand does.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_spec.h"
#include "ir/graph.h"
#include "passes/target.h"

namespace kiln::codegen {

// "k_<node name, non-alphanumerics as '_'>_<op name>".
std::string KernelName(const Node& node);

// The opening of a kernel source for `node`: the comment naming it and its IR line, the
// CUDA headers for `dtypes`, and the device library (namespace kiln) for those dtypes:
//   kiln::Load(x)              storage value -> compute value (float, or double for ints)
//   kiln::Round<T>::From(v)    compute value -> T, rounded once as the reference does
//   kiln::Vec<T, N>            N elements in one aligned access (16 bytes at most)
//   kiln::Max / kiln::Min      NaN-propagating, as the reference
//   kiln::IntDiv(a, b)         truncating integer division of integer-valued doubles
std::string SourceOpening(const Node& node, const std::vector<DType>& dtypes);

// The C++ type that values of `t` compute in: "float" for floats and pred, "double" for
// integers.
const char* ComputeTypeName(DType t);

// "int" when every index below `bound` fits in 32 bits, else "long long".
const char* IndexTypeFor(int64_t bound);

// The most elements per access, a power of two, such that the access of the widest dtype
// is at most 16 bytes and the count divides every entry of `multiples_of`.
int VectorWidth(int widest_dtype_bytes, const std::vector<int64_t>& multiples_of);

// A 1-D grid covering `work_items` with `threads` per block, capped for grid-stride loops at
// a few waves of `target`'s SMs.
std::array<uint32_t, 3> GridFor(int64_t work_items, int threads, const Target& target);

// Row-major strides of `dims`.
std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims);

// A kernel launched as `grid` x `block` threads.
KernelSpec MakeKernel(std::string name, std::string source, std::array<uint32_t, 3> grid,
                      std::array<uint32_t, 3> block);

}  // namespace kiln::codegen
