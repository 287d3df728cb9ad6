// fuse-gemv-glu (passes/fuse_gemv_glu.h): a decode step's SwiGLU is computed by the GEMV that
// makes the gate and up halves. The pass changes no value (the reference backend gives the
// decode function's every output the same bits with it and without it), takes only the few
// rows SmallMGemm streams, the gemv_glu kind is checked by the verifier and round-trips as
// text, and codegen lowers it to SmallMGemm's GLU form or says which pass to disable.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codegen/lower_node.h"
#include "frontends/llama_inference.h"
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

TEST(FuseGemvGlu, DecodeComputesSwiGluInTheGemvWithTheSameBits) {
  std::unique_ptr<Module> fused = testing::TinyDecode(4, {});
  std::unique_ptr<Module> plain = testing::TinyDecode(4, {"fuse-gemv-glu"});
  const Function& f = *fused->functions()[0];
  const int layers = PresetConfig("llama-tiny")->n_layers;
  ASSERT_EQ(testing::FusionsOfKind(f, FusionKind::kGemvGlu).size(), static_cast<size_t>(layers))
      << "one a layer: its MLP's gate/up projection";
  EXPECT_TRUE(testing::FusionsOfKind(*plain->functions()[0], FusionKind::kGemvGlu).empty());
  EXPECT_EQ(f.num_nodes() + layers, plain->functions()[0]->num_nodes()) << "each gemm and its loop fusion: one node";
  for (const Node* glu : testing::FusionsOfKind(f, FusionKind::kGemvGlu)) {
    EXPECT_EQ(glu->operands().size(), 2u);
    EXPECT_EQ(glu->operand(1)->opcode(), Opcode::kParameter) << "the joined gate/up weight";
  }

  testing::ExpectSameDecode(f, *plain->functions()[0]);
  testing::ExpectTextRoundTrips(*fused);
  EXPECT_TRUE(absl::StrContains(PrintModule(*fused), "{kind=gemv_glu}"));
}

// A batch of 16 is cuBLASLt's (more rows than SmallMGemm takes): its SwiGLU stays a loop
// kernel.
TEST(FuseGemvGlu, LeavesCublasLtGemmsAlone) {
  std::unique_ptr<Module> m = testing::TinyDecode(16, {});
  EXPECT_TRUE(testing::FusionsOfKind(*m->functions()[0], FusionKind::kGemvGlu).empty());
}

// The verifier holds the kind to its body: a gemm of parameters and its SwiGLU, nothing else.
TEST(FuseGemvGlu, TheVerifierWantsTheGemmAndItsSwiGlu) {
  const std::string head = R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[1,8]
  %w = parameter() {index=1} : bf16[8,8]
  %y = fusion(%x, %w) {kind=gemv_glu} : bf16[1,4] {
    %x = parameter() {index=0} : bf16[1,8]
    %w = parameter() {index=1} : bf16[8,8]
    %gu = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=8, m=1, n=8} : bf16[1,8]
    %g = slice(%gu) {limit=[1,4], start=[0,0], stride=[1,1]} : bf16[1,4]
    %u = slice(%gu) {limit=[1,8], start=[0,4], stride=[1,1]} : bf16[1,4]
    %s = sigmoid(%g) : bf16[1,4]
)";
  const std::string tail = R"(    return %h
  }
  return %y
}
)";
  absl::StatusOr<std::unique_ptr<Module>> good =
      ParseModule(head + "    %t = mul(%g, %s) : bf16[1,4]\n    %h = mul(%t, %u) : bf16[1,4]\n" + tail);
  ASSERT_TRUE(good.ok()) << good.status();
  // silu(gate) + up is not the SwiGLU.
  absl::StatusOr<std::unique_ptr<Module>> bad =
      ParseModule(head + "    %t = mul(%g, %s) : bf16[1,4]\n    %h = add(%t, %u) : bf16[1,4]\n" + tail);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "is not followed by silu(x[.., :F]) * x[.., F:] alone"))
      << bad.status();

  // Without SmallMGemm (CodegenOptions::small_m_gemv off), codegen names the pass to disable.
  const Node* glu = (*good)->functions()[0]->outputs()[0];
  CodegenOptions no_gemv;
  no_gemv.small_m_gemv = false;
  absl::StatusOr<LoweredNode> refused = LowerNode(*glu, no_gemv);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--disable-pass fuse-gemv-glu")) << refused.status();
}

#ifdef KILN_WITH_CUDA
// One kernel, SmallMGemm's GLU form, compiled for sm_90a.
TEST(FuseGemvGlu, LowersToTheGemvsGluForm) {
  std::unique_ptr<Module> m = testing::TinyDecode(4, {});
  for (const Node* n : testing::FusionsOfKind(*m->functions()[0], FusionKind::kGemvGlu)) {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kernels.size(), 1u);
    EXPECT_EQ(lowered->label, "gemv");
    const KernelSpec& k = lowered->kernels[0];
    EXPECT_TRUE(absl::StrContains(k.source, "SwiGlu<__nv_bfloat16>>::Run")) << k.source;
    absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{});
    ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
  }
}
#endif

}  // namespace
}  // namespace kiln
