// fuse-gemv-norm (passes/fuse_gemv_norm.h): the rms_norm of a decode step's few-row gemm (the
// residual stream after the o and down projections) is computed by that gemm's GEMV, its last
// block to finish. The pass changes no value (the reference backend gives the decode
// function's every output the same bits with it and without it), takes only the few rows
// SmallMGemm streams, the gemv_norm kind is checked by the verifier and round-trips as text,
// and codegen lowers it to SmallMGemm::RunWithNorm or says which pass to disable.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "codegen/lower_node.h"
#include "frontends/model_config.h"
#include "ir/fusion.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "tests/testing/tiny_decode.h"

#ifdef KILN_WITH_CUDA
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

TEST(FuseGemvNorm, DecodeComputesNormsInTheGemvWithTheSameBits) {
  for (int64_t batch : {1, 4}) {
    SCOPED_TRACE(batch);
    std::unique_ptr<Module> fused = testing::TinyDecode(batch, {});
    std::unique_ptr<Module> plain = testing::TinyDecode(batch, {"fuse-gemv-norm"});
    const Function& f = *fused->functions()[0];
    const int layers = PresetConfig("llama-tiny")->n_layers;
    // Each layer's two norms but the first layer's (of the embedding): its mlp norm after the
    // o projection, the next layer's attention norm (or the final norm) after the down projection.
    ASSERT_EQ(testing::FusionsOfKind(f, FusionKind::kGemvNorm).size(), static_cast<size_t>(2 * layers));
    EXPECT_TRUE(testing::FusionsOfKind(*plain->functions()[0], FusionKind::kGemvNorm).empty());
    int norms = 0;
    for (const auto& n : f.nodes()) norms += n->opcode() == Opcode::kRmsNorm;
    EXPECT_EQ(norms, 1) << "the first layer's attention norm, of the embedding, stays its own kernel";
    for (const Node* fusion : testing::FusionsOfKind(f, FusionKind::kGemvNorm)) {
      EXPECT_EQ(fusion->operands().size(), 4u) << "x, the weight, the residual (C) and the norm's weight";
      EXPECT_EQ(fusion->operand(3)->opcode(), Opcode::kParameter) << "the norm's weight";
    }
    if (batch != 4) continue;  // TinyDecodeArgs holds four sequences
    const std::vector<HostTensor> args = testing::TinyDecodeArgs(f);
    absl::StatusOr<std::vector<HostTensor>> got = EvaluateFunction(f, args);
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(*plain->functions()[0], args);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(got->size(), want->size());
    testing::ExpectSameBits(*got, *want);

    const std::string text = PrintModule(*fused);
    absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(PrintModule(**parsed), text);
    EXPECT_NE(text.find("{kind=gemv_norm}"), std::string::npos);
  }
}

// A batch of 16 is cuBLASLt's (more rows than SmallMGemm takes): its norms stay kernels.
TEST(FuseGemvNorm, LeavesCublasLtGemmsAlone) {
  std::unique_ptr<Module> m = testing::TinyDecode(16, {});
  EXPECT_TRUE(testing::FusionsOfKind(*m->functions()[0], FusionKind::kGemvNorm).empty());
}

// The verifier holds the kind to its body: a gemm of parameters and the rms_norm of it by a
// parameter, returned in that order, nothing else.
TEST(FuseGemvNorm, TheVerifierWantsTheGemmAndItsNorm) {
  const std::string head = R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[1,8]
  %w = parameter() {index=1} : bf16[4,8]
  %g = parameter() {index=2} : bf16[4]
  %h, %n = fusion(%x, %w, %g) {kind=gemv_norm} : (f32[1,4], bf16[1,4]) {
    %x = parameter() {index=0} : bf16[1,8]
    %w = parameter() {index=1} : bf16[4,8]
    %g = parameter() {index=2} : bf16[4]
    %p = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=8, m=1, n=4} : f32[1,4]
)";
  const std::string tail = R"(  }
  return %h, %n
}
)";
  const std::string norm = "    %r = rms_norm(%p, %g) {eps=1e-05, out_dtype=bf16} : bf16[1,4]\n";
  absl::StatusOr<std::unique_ptr<Module>> good = ParseModule(head + norm + "    return %p, %r\n" + tail);
  ASSERT_TRUE(good.ok()) << good.status();
  absl::StatusOr<std::unique_ptr<Module>> swapped = ParseModule(head + norm + "    return %r, %p\n" + tail);
  ASSERT_FALSE(swapped.ok());
  EXPECT_TRUE(absl::StrContains(swapped.status().message(), "returns its gemm, then its rms_norm")) << swapped.status();
  absl::StatusOr<std::unique_ptr<Module>> extra = ParseModule(
      head + norm + "    %s = exp(%p) : f32[1,4]\n    return %p, %r\n" + tail);
  ASSERT_FALSE(extra.ok());
  EXPECT_TRUE(absl::StrContains(extra.status().message(), "is neither its one gemm nor its one rms_norm"))
      << extra.status();

  // Without SmallMGemm (CodegenOptions::small_m_gemv off), codegen names the pass to disable.
  const Node* fusion = (*good)->functions()[0]->outputs()[0]->operand(0);
  CodegenOptions no_gemv;
  no_gemv.small_m_gemv = false;
  absl::StatusOr<LoweredNode> refused = LowerNode(*fusion, no_gemv);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--disable-pass fuse-gemv-norm")) << refused.status();
}

#ifdef KILN_WITH_CUDA
// One kernel with both results, SmallMGemm::RunWithNorm and the module's block counter,
// compiled for sm_90a without spilling.
TEST(FuseGemvNorm, LowersToTheGemvWithItsNorm) {
  std::unique_ptr<Module> m = testing::TinyDecode(4, {});
  for (const Node* n : testing::FusionsOfKind(*m->functions()[0], FusionKind::kGemvNorm)) {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kernels.size(), 1u);
    EXPECT_EQ(lowered->label, "gemv");
    const KernelSpec& k = lowered->kernels[0];
    EXPECT_TRUE(absl::StrContains(k.source, ">::RunWithNorm<__nv_bfloat16, ")) << k.source;
    EXPECT_TRUE(absl::StrContains(k.source, "static __device__ unsigned int g_blocks_done;")) << k.source;
    EXPECT_TRUE(absl::StrContains(k.source, "(float* out, __nv_bfloat16* normed, ")) << k.source;
    absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{.ptxas_info = true});
    ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
    EXPECT_TRUE(absl::StrContains(compiled->log, "0 bytes spill stores")) << compiled->log;
  }
}
#endif

}  // namespace
}  // namespace kiln
