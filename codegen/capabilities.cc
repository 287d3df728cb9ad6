#include "codegen/capabilities.h"

#include "absl/strings/str_cat.h"
#include "codegen/gemm_rules.h"
#include "kernels/flash_attention.cuh"  // the shapes the kernels take: plain C++ outside a CUDA compiler

namespace kiln {
namespace {

class Capabilities final : public BackendCapabilities {
 public:
  std::string AttentionUnsupportedReason(const AttentionKernelShape& s, const Target& target) const override {
    // The mma.sync kernels need bf16 tensor cores (sm_80 and later).
    if (target.compute_capability < 80) {
      return absl::StrCat(target.arch, " has no bf16 tensor cores (the flash kernels need sm_80 or later)");
    }
    const char* why = kernels::FlashAttentionUnsupportedReason(s.batch, s.heads, s.kv_heads, s.seq, s.head_dim);
    return why == nullptr ? "" : why;
  }

  // The kernels when T is a multiple of 128 (codegen/lower_attention.cc picks per shape, and
  // takes the mma.sync ones otherwise).
  std::string AttentionImplementation(const Target& target) const override {
    if (target.has_wgmma) {
      return absl::StrCat("wgmma flash attention, forward and backward (kernels/flash_attention_wgmma.cuh), for ",
                          target.arch);
    }
    return absl::StrCat("mma.sync flash attention (kernels/flash_attention.cuh) for ", target.arch);
  }

  std::string Fp8GemmUnsupportedReason(const Fp8GemmShape& s, const Target& target) const override {
    if (!target.has_fp8) return absl::StrCat(target.arch, " has no FP8 tensor cores (sm_89 or later)");
    GemmDescription g{.batch = s.batch, .m = s.m, .n = s.n, .k = s.k, .beta = s.beta,
                      .a_dtype = s.a, .b_dtype = s.b, .d_dtype = s.d, .bias = s.bias, .scaled = true};
    return kiln::Fp8GemmUnsupportedReason(g);
  }
};

}  // namespace

const BackendCapabilities& CodegenCapabilities() {
  static const Capabilities capabilities;
  return capabilities;
}

}  // namespace kiln
