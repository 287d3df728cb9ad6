// fuse-cache-write (passes/fuse_cache_write.h): a layer's K and V rows are stored into the
// paged pools by the loop kernel that computes them. The pass changes no value (the reference
// backend gives the decode function's every output the same bits with it and without it),
// the cache_write fusion kind is checked by the verifier and round-trips as text, and
// codegen lowers it to the pool's in-place update.
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
#include "ir/verifier.h"
#include "tests/testing/tiny_decode.h"

#ifdef KILN_WITH_CUDA
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

TEST(FuseCacheWrite, DecodeWritesKAndVFromTheKernelsThatComputeThemWithTheSameBits) {
  // One cache_write fusion a write: merge-cache-write-siblings, which joins a layer's into
  // one kernel, is tested on its own (tests/merge_cache_write_siblings_test.cc).
  std::unique_ptr<Module> fused = testing::TinyDecode(4, {"merge-cache-write-siblings"});
  std::unique_ptr<Module> plain = testing::TinyDecode(4, {"fuse-cache-write"});
  const Function& f = *fused->functions()[0];
  const int layers = PresetConfig("llama-tiny")->n_layers;
  EXPECT_EQ(testing::FusionsOfKind(f, FusionKind::kCacheWrite).size(), static_cast<size_t>(2 * layers));
  EXPECT_TRUE(testing::FusionsOfKind(*plain->functions()[0], FusionKind::kCacheWrite).empty());
  for (const auto& n : f.nodes()) EXPECT_NE(n->opcode(), Opcode::kKvCacheWrite) << n->name();

  const std::vector<HostTensor> args = testing::TinyDecodeArgs(f);
  std::vector<HostTensor> got;
  testing::ExpectSameDecode(f, *plain->functions()[0], &got);
  ASSERT_GT(got.size(), 1u);
  // The pools took the new rows (output 1 is the K pool): the write is not a no-op.
  int64_t changed = 0;
  for (int64_t i = 0; i < got[1].type().num_elements(); ++i) changed += got[1][i] != args[kInferenceKPoolParameter][i];
  // 3 rows (one is padding) x layers x kv heads x head dim, less the odd element whose new
  // value the random pool held already.
  const int64_t written = int64_t{3} * layers * 2 * 32;
  EXPECT_LE(changed, written);
  EXPECT_GE(changed, written - 8);

  // The text round-trips, and the verifier holds the kind to its rule.
  testing::ExpectTextRoundTrips(*fused);
  EXPECT_NE(PrintModule(*fused).find("{kind=cache_write}"), std::string::npos);
}

TEST(FuseCacheWrite, TheVerifierWantsThePoolAndSlotsAsBodyParameters) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %pool = parameter() {index=0} : f32[1,2,1,2,4]
  %x = parameter() {index=1} : f32[1,1,4]
  %slots = parameter() {index=2} : i32[1]
  %y = fusion(%pool, %x, %slots) {kind=cache_write} : f32[1,2,1,2,4] {
    %pool = parameter() {index=0} : f32[1,2,1,2,4]
    %x = parameter() {index=1} : f32[1,1,4]
    %slots = parameter() {index=2} : i32[1]
    %p = neg(%pool) : f32[1,2,1,2,4]
    %w = kv_cache_write(%p, %x, %slots) {layer=0} : f32[1,2,1,2,4]
    return %w
  }
  return %y
}
)");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StrContains(m.status().message(), "writes a pool or reads slots that are not the body's parameters"))
      << m.status();
}

#ifdef KILN_WITH_CUDA
// A cache_write fusion is two kernels, the pool copy (left out when the plan updates the pool
// in place, its in-place operand) and the rows' kernel; both compile for sm_90a.
TEST(FuseCacheWrite, LowersToThePoolsInPlaceUpdate) {
  std::unique_ptr<Module> m = testing::TinyDecode(4, {"merge-cache-write-siblings"});
  for (const Node* n : testing::FusionsOfKind(*m->functions()[0], FusionKind::kCacheWrite)) {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kernels.size(), 2u);
    EXPECT_EQ(lowered->copy_kernel_results, std::vector<int>{0});
    EXPECT_EQ(lowered->in_place_operand, *n->body()->outputs()[0]->operand(0)->attrs().GetInt("index"));
    EXPECT_TRUE(absl::EndsWith(lowered->kernels[0].name, "_copy"));
    // The rows' indices in unsigned 32 bits (a division by a power of two one shift; the
    // pool's own index in 64 bits from the slot).
    EXPECT_TRUE(absl::StrContains(lowered->kernels[1].source, "typedef unsigned Index;")) << lowered->kernels[1].source;
    EXPECT_TRUE(absl::StrContains(lowered->kernels[1].source, "const unsigned long long s = slot;"));
    for (const KernelSpec& k : lowered->kernels) {
      absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{});
      ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
    }
  }
}
#endif

}  // namespace
}  // namespace kiln
