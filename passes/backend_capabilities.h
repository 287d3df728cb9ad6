// What the code generator's kernels can take, asked by passes before they choose an
// implementation (select-flash-attention today; FP8 GEMMs and paged attention next). The
// code generator answers (codegen/capabilities.h): passes/ includes nothing of kernels/ or
// codegen/, and a compile that gives no answers selects nothing that needs one.
#pragma once

#include <cstdint>
#include <string>

#include "ir/types.h"
#include "passes/target.h"

namespace kiln {

// Causal attention over q [batch, heads, seq, head_dim] and k, v [batch, kv_heads, seq, head_dim].
struct AttentionKernelShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0;
};

// A GEMM select-fp8-gemm would make: D [m, n] = a_scale b_scale A B (+ beta C) per batch, both
// operands K-inner (TN), of the given dtypes.
struct Fp8GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  DType a = DType::kF8E4M3, b = DType::kF8E4M3, d = DType::kBF16;
  float beta = 0;
  bool bias = false;
};

class BackendCapabilities {
 public:
  virtual ~BackendCapabilities() = default;
  // Why no attention kernel for `target` takes `shape`, or "" when one does.
  virtual std::string AttentionUnsupportedReason(const AttentionKernelShape& shape, const Target& target) const = 0;
  // The attention kernels `target` gets, in words ("mma.sync flash attention, 64x64 tiles").
  virtual std::string AttentionImplementation(const Target& target) const = 0;
  // Why no FP8 GEMM of `target` takes `shape`, or "" when one does.
  virtual std::string Fp8GemmUnsupportedReason(const Fp8GemmShape& shape, const Target& target) const = 0;
};

}  // namespace kiln
