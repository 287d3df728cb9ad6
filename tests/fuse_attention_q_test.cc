// fuse-attention-q (passes/fuse_attention_q.h): a layer's q RoPE is computed by the paged
// attention kernel as it loads q. The pass changes no value (the reference backend gives the
// decode function's every output the same bits with it and without it), the attention_q
// fusion kind is checked by the verifier and round-trips as text, and codegen lowers it to
// paged attention's kernels reading q through the fusion's GroupInput.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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

// The pass runs in CompileInferenceModule only when asked ($KILN_FUSE_ATTENTION_Q=1: not yet
// run on a GPU); these tests ask.
class FuseAttentionQ : public ::testing::Test {
 protected:
  void SetUp() override { setenv("KILN_FUSE_ATTENTION_Q", "1", 1); }
  void TearDown() override { unsetenv("KILN_FUSE_ATTENTION_Q"); }
};

TEST(FuseAttentionQOff, CompileInferenceModuleLeavesItOutUnlessAsked) {
  unsetenv("KILN_FUSE_ATTENTION_Q");
  EXPECT_FALSE(FuseAttentionQRequested());
  std::unique_ptr<Module> m = testing::TinyDecode(4, {});
  EXPECT_TRUE(testing::FusionsOfKind(*m->functions()[0], FusionKind::kAttentionQ).empty());
}

TEST_F(FuseAttentionQ, DecodeComputesQInTheAttentionKernelWithTheSameBits) {
  std::unique_ptr<Module> fused = testing::TinyDecode(4, {});
  std::unique_ptr<Module> plain = testing::TinyDecode(4, {"fuse-attention-q"});
  const Function& f = *fused->functions()[0];
  const int layers = PresetConfig("llama-tiny")->n_layers;
  EXPECT_EQ(testing::FusionsOfKind(f, FusionKind::kAttentionQ).size(), static_cast<size_t>(layers));
  EXPECT_TRUE(testing::FusionsOfKind(*plain->functions()[0], FusionKind::kAttentionQ).empty());
  for (const auto& n : f.nodes()) EXPECT_NE(n->opcode(), Opcode::kPagedAttention) << n->name();
  // One loop fusion a layer fewer: q's.
  EXPECT_EQ(testing::FusionsOfKind(f, FusionKind::kLoop).size() + layers,
            testing::FusionsOfKind(*plain->functions()[0], FusionKind::kLoop).size());

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
  EXPECT_NE(text.find("{kind=attention_q}"), std::string::npos);
}

// The body: loop ops computing q, then the attention, which reads its pools, tables and
// positions as body parameters and the computed value as q alone.
TEST_F(FuseAttentionQ, TheVerifierHoldsTheKindToItsRule) {
  const std::string head = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[1,1,1,8]
  %pool = parameter() {index=1} : f32[1,2,1,2,8]
  %tables = parameter() {index=2} : i32[1,2]
  %positions = parameter() {index=3} : i32[1,1]
  %y = fusion(%x, %pool, %tables, %positions) {kind=attention_q} : f32[1,1,1,8] {
    %x = parameter() {index=0} : f32[1,1,1,8]
    %pool = parameter() {index=1} : f32[1,2,1,2,8]
    %tables = parameter() {index=2} : i32[1,2]
    %positions = parameter() {index=3} : i32[1,1]
)";
  const std::string tail = R"(    return %o
  }
  return %y
}
)";
  absl::StatusOr<std::unique_ptr<Module>> ok = ParseModule(
      head + "    %q = neg(%x) : f32[1,1,1,8]\n" +
      "    %o = paged_attention(%q, %pool, %pool, %tables, %positions) {layer=0, scale=0.5} : f32[1,1,1,8]\n" + tail);
  ASSERT_TRUE(ok.ok()) << ok.status();
  absl::StatusOr<std::unique_ptr<Module>> from_parameter = ParseModule(
      head + "    %o = paged_attention(%x, %pool, %pool, %tables, %positions) {layer=0, scale=0.5} : f32[1,1,1,8]\n" +
      tail);
  ASSERT_FALSE(from_parameter.ok());
  EXPECT_TRUE(absl::StrContains(from_parameter.status().message(), "reads q from a parameter")) << from_parameter.status();
  absl::StatusOr<std::unique_ptr<Module>> computed_pool = ParseModule(
      head + "    %q = neg(%x) : f32[1,1,1,8]\n    %p = neg(%pool) : f32[1,2,1,2,8]\n" +
      "    %o = paged_attention(%q, %p, %pool, %tables, %positions) {layer=0, scale=0.5} : f32[1,1,1,8]\n" + tail);
  ASSERT_FALSE(computed_pool.ok());
  EXPECT_TRUE(absl::StrContains(computed_pool.status().message(), "not the body's parameters")) << computed_pool.status();
}

#ifdef KILN_WITH_CUDA
// The split kernel reads q through the fusion's GroupInput (pointers without __restrict__,
// so that its loads stay after the grid-dependency wait) and its block tables and positions,
// parameters nothing writes, before that wait; with the fold and with the combine kernel,
// every kernel compiles for sm_90a.
TEST_F(FuseAttentionQ, LowersToPagedAttentionReadingAComputedQ) {
  std::unique_ptr<Module> m = testing::TinyDecode(4, {});
  // Splits of one KV block (tiny's rows have at most 4): with them, the fold and the combine.
  CodegenOptions fold, combine;
  fold.paged_attention.min_split_blocks = combine.paged_attention.min_split_blocks = 1;
  combine.paged_attention.fold_max_rows = 2;
  for (const Node* n : testing::FusionsOfKind(*m->functions()[0], FusionKind::kAttentionQ)) {
    for (const CodegenOptions* options : {&fold, &combine}) {
      absl::StatusOr<LoweredNode> lowered = LowerNode(*n, *options);
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      ASSERT_EQ(lowered->kernels.size(), options == &fold ? 1u : 2u);
      const KernelSpec& split = lowered->kernels[0];
      EXPECT_TRUE(absl::StrContains(split.source, "struct GroupInput {")) << split.source;
      EXPECT_TRUE(absl::StrContains(split.source, ", true, GroupInput>(out, GroupInput{in0, ")) << split.source;
      EXPECT_FALSE(absl::StrContains(split.source, "__restrict__ in")) << split.source;
      EXPECT_TRUE(split.waits_itself);
      EXPECT_EQ(lowered->label, "fused paged_attention");
      for (const KernelSpec& k : lowered->kernels) {
        absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{});
        ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
      }
    }
  }
}
#endif

}  // namespace
}  // namespace kiln
