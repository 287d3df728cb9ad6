// fuse-norm-gemv (passes/fuse_norm_gemv.h): a decode step's norms are computed by the GEMVs
// that read them. The pass changes no value on the reference backend (every output of the
// decode function has the same bits with it and without it), leaves norms of more than one
// reader and of more than 8 KB alone, the verifier holds the gemv_norm kind to its rule, and
// each fusion lowers to one SmallMGemm kernel reading A through RmsNormA that NVRTC compiles.
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
#include "passes/fuse_norm_gemv.h"
#include "tests/testing/tiny_decode.h"

#ifdef KILN_WITH_CUDA
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

TEST(FuseNormGemv, DecodeNormsComputedByTheirGemvsWithTheSameBits) {
  std::unique_ptr<Module> fused = testing::TinyDecode(4, {});
  std::unique_ptr<Module> plain = testing::TinyDecode(4, {"fuse-norm-gemv"});
  const Function& f = *fused->functions()[0];
  const int layers = PresetConfig("llama-tiny")->n_layers;
  const std::vector<const Node*> fusions = testing::FusionsOfKind(f, FusionKind::kGemvNorm);
  ASSERT_EQ(fusions.size(), static_cast<size_t>(2 * layers + 1)) << "qkv and gate/up a layer, and the LM head";
  int glus = 0;
  for (const Node* n : fusions) glus += n->body()->outputs()[0]->opcode() != Opcode::kGemm;
  EXPECT_EQ(glus, layers) << "the gate/up GEMVs keep their SwiGLU";
  for (const auto& n : f.nodes()) EXPECT_NE(n->opcode(), Opcode::kRmsNorm) << n->name();
  EXPECT_EQ(f.num_nodes() + 2 * layers + 1, plain->functions()[0]->num_nodes());

  const std::vector<HostTensor> args = testing::TinyDecodeArgs(f);
  absl::StatusOr<std::vector<HostTensor>> got = EvaluateFunction(f, args);
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(*plain->functions()[0], args);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  testing::ExpectSameBits(*got, *want);

  const std::string text = PrintModule(*fused);
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PrintModule(**parsed), text);
  EXPECT_NE(text.find("{kind=gemv_norm}"), std::string::npos);
}

constexpr char kNormAndGemm[] = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[1,64]
  %w = parameter() {index=1} : f32[64]
  %b = parameter() {index=2} : bf16[32,64]
  %h = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[1,64]
  %y = gemm(%h, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=64, m=1, n=32} : f32[1,32]
  return %y%s
}
)";

std::string NormAndGemm(const std::string& also_returned) {
  std::string text = kNormAndGemm;
  text.replace(text.find("%s"), 2, also_returned);
  return text;
}

TEST(FuseNormGemv, FusesANormReadOnlyByItsGemv) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(NormAndGemm(""));
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<bool> changed = FuseNormGemvPass().RunOnFunction(*(*m)->functions()[0]);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  const Function& f = *(*m)->functions()[0];
  ASSERT_EQ(testing::FusionsOfKind(f, FusionKind::kGemvNorm).size(), 1u);
  EXPECT_EQ(testing::FusionsOfKind(f, FusionKind::kGemvNorm)[0]->operands().size(), 3u) << "x, w, the weight";
  EXPECT_TRUE(ParseModule(PrintModule(**m)).ok()) << PrintModule(**m);

  // The norm returned as well is stored anyway: left alone.
  absl::StatusOr<std::unique_ptr<Module>> returned = ParseModule(NormAndGemm(", %h"));
  ASSERT_TRUE(returned.ok()) << returned.status();
  changed = FuseNormGemvPass().RunOnFunction(*(*returned)->functions()[0]);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
}

TEST(FuseNormGemv, LeavesNormsOfManyRowsToTheirKernel) {
  // Batch 32 at llama-M's width: the normalized A (128 KB) would not fit a GEMV block's tile,
  // and SmallMGemm takes at most 8 rows anyway.
  absl::StatusOr<std::unique_ptr<Module>> big = ParseModule(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4,2048]
  %w = parameter() {index=1} : f32[2048]
  %b = parameter() {index=2} : bf16[32,2048]
  %h = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[4,2048]
  %y = gemm(%h, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=2048, m=4, n=32} : f32[4,32]
  return %y
}
)");
  ASSERT_TRUE(big.ok()) << big.status();
  absl::StatusOr<bool> changed = FuseNormGemvPass().RunOnFunction(*(*big)->functions()[0]);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed) << "16 KB of normalized rows";
}

TEST(FuseNormGemv, TheVerifierWantsTheNormAsTheGemmsAAlone) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[1,64]
  %w = parameter() {index=1} : f32[64]
  %b = parameter() {index=2} : bf16[64,64]
  %y = fusion(%x, %w, %b) {kind=gemv_norm} : f32[1,64] {
    %x = parameter() {index=0} : f32[1,64]
    %w = parameter() {index=1} : f32[64]
    %b = parameter() {index=2} : bf16[64,64]
    %h = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[1,64]
    %y = gemm(%b, %h) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=64, m=64, n=1} : f32[64,1]
    return %y
  }
  return %y
}
)");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "is not the gemm's A alone")) << m.status();
}

#ifdef KILN_WITH_CUDA
// Each gemv_norm fusion is one kernel, its weight read before the grid-dependency wait, and
// compiles for sm_90a without spills.
TEST(FuseNormGemv, LowersToOneSmallMGemmReadingAThroughTheNorm) {
  std::unique_ptr<Module> m = testing::TinyDecode(4, {});
  for (const Node* n : testing::FusionsOfKind(*m->functions()[0], FusionKind::kGemvNorm)) {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kernels.size(), 1u);
    EXPECT_TRUE(absl::StrContains(lowered->kernels[0].source, "RmsNormA<")) << lowered->kernels[0].source;
    EXPECT_TRUE(lowered->kernels[0].waits_itself);
    absl::StatusOr<CompiledKernel> compiled = CompileKernel(lowered->kernels[0], NvrtcOptions{.ptxas_info = true});
    ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << lowered->kernels[0].source;
    EXPECT_NE(compiled->log.find("0 bytes spill stores"), std::string::npos) << compiled->log;
  }
}
#endif

}  // namespace
}  // namespace kiln
