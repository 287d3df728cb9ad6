// merge-cache-write-siblings (passes/merge_cache_write_siblings.h): a decode layer's K write,
// V write and q RoPE, all reading the qkv projection, become one cache_write fusion of three
// results, one kernel. The pass changes no value (the reference backend gives every output of
// the decode function the same bits with it and without it), leaves siblings apart where one
// reads another's result, the verifier holds a body of several results to its rule, and the
// launch list leaves out each pool copy exactly where the plan writes that pool in place.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codegen/compile_program.h"
#include "codegen/lower_node.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "ir/fusion.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#include "passes/merge_cache_write_siblings.h"
#include "tests/testing/tiny_decode.h"

#ifdef KILN_WITH_CUDA
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

int Writes(const Node& fusion) {
  int writes = 0;
  for (const Node* out : fusion.body()->outputs()) writes += out->opcode() == Opcode::kKvCacheWrite;
  return writes;
}

TEST(MergeCacheWriteSiblings, OneKernelALayerForKVAndQWithTheSameBits) {
  std::unique_ptr<Module> merged = testing::TinyDecode(4, {});
  std::unique_ptr<Module> apart = testing::TinyDecode(4, {"merge-cache-write-siblings"});
  const Function& f = *merged->functions()[0];
  const int layers = PresetConfig("llama-tiny")->n_layers;
  const std::vector<const Node*> fusions = testing::FusionsOfKind(f, FusionKind::kCacheWrite);
  ASSERT_EQ(fusions.size(), static_cast<size_t>(layers));
  for (const Node* n : fusions) {
    EXPECT_EQ(n->num_results(), 3) << n->name();  // the K pool, the V pool, q
    EXPECT_EQ(Writes(*n), 2) << n->name();
    // q is read by the layer's attention as before.
    EXPECT_EQ(n->result(2)->users().size(), 1u);
    EXPECT_EQ(n->result(2)->users()[0]->opcode(), Opcode::kPagedAttention);
  }
  EXPECT_EQ(testing::FusionsOfKind(*apart->functions()[0], FusionKind::kCacheWrite).size(),
            static_cast<size_t>(2 * layers));

  testing::ExpectSameDecode(f, *apart->functions()[0]);
  testing::ExpectTextRoundTrips(*merged);
}

// A body of a pool written in place (%pool -> %pool1) and a loop value (%y), both of %x; the
// pool donated back to its parameter when `donated`.
std::string TwoSiblings(bool merged, bool donated) {
  const std::string ret = donated ? "  return %pool1, %y {aliases=[1,-1]}\n" : "  return %pool1, %y\n";
  if (merged) {
    return absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[2,1,4]
  %pool = parameter() {index=1} : f32[1,2,1,2,4]
  %slots = parameter() {index=2} : i32[2]
  %pool1, %y = fusion(%x, %pool, %slots) {kind=cache_write} : (f32[1,2,1,2,4], f32[2,1,4]) {
    %x = parameter() {index=0} : f32[2,1,4]
    %pool = parameter() {index=1} : f32[1,2,1,2,4]
    %slots = parameter() {index=2} : i32[2]
    %n = neg(%x) : f32[2,1,4]
    %w = kv_cache_write(%pool, %n, %slots) {layer=0} : f32[1,2,1,2,4]
    %e = exp(%x) : f32[2,1,4]
    return %w, %e
  }
)", ret, "}\n");
  }
  return absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[2,1,4]
  %pool = parameter() {index=1} : f32[1,2,1,2,4]
  %slots = parameter() {index=2} : i32[2]
  %pool1 = fusion(%x, %pool, %slots) {kind=cache_write} : f32[1,2,1,2,4] {
    %x = parameter() {index=0} : f32[2,1,4]
    %pool = parameter() {index=1} : f32[1,2,1,2,4]
    %slots = parameter() {index=2} : i32[2]
    %n = neg(%x) : f32[2,1,4]
    %w = kv_cache_write(%pool, %n, %slots) {layer=0} : f32[1,2,1,2,4]
    return %w
  }
  %y = fusion(%x) {kind=loop} : f32[2,1,4] {
    %x = parameter() {index=0} : f32[2,1,4]
    %e = exp(%x) : f32[2,1,4]
    return %e
  }
)", ret, "}\n");
}

TEST(MergeCacheWriteSiblings, MergesTwoSiblingsIntoTheNodeItPrints) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(TwoSiblings(false, true));
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<bool> changed = MergeCacheWriteSiblingsPass().RunOnFunction(*(*m)->functions()[0]);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(VerifyModule(**m).ok()) << PrintModule(**m);
  absl::StatusOr<std::unique_ptr<Module>> want = ParseModule(TwoSiblings(true, true));
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(PrintModule(**m), PrintModule(**want));
}

TEST(MergeCacheWriteSiblings, LeavesASiblingThatReadsAnothersResultApart) {
  // %w's rows read %a, a sibling on %x: one kernel cannot compute both.
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[2,1,4]
  %pool = parameter() {index=1} : f32[1,2,1,2,4]
  %slots = parameter() {index=2} : i32[2]
  %a = fusion(%x) {kind=loop} : f32[2,1,4] {
    %x = parameter() {index=0} : f32[2,1,4]
    %e = exp(%x) : f32[2,1,4]
    return %e
  }
  %pool1 = fusion(%x, %a, %pool, %slots) {kind=cache_write} : f32[1,2,1,2,4] {
    %x = parameter() {index=0} : f32[2,1,4]
    %a = parameter() {index=1} : f32[2,1,4]
    %pool = parameter() {index=2} : f32[1,2,1,2,4]
    %slots = parameter() {index=3} : i32[2]
    %s = add(%x, %a) : f32[2,1,4]
    %w = kv_cache_write(%pool, %s, %slots) {layer=0} : f32[1,2,1,2,4]
    return %w
  }
  return %pool1, %a
}
)");
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<bool> changed = MergeCacheWriteSiblingsPass().RunOnFunction(*(*m)->functions()[0]);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);

  // Nor are loop fusions merged among themselves: a group needs a cache write.
  absl::StatusOr<std::unique_ptr<Module>> loops = ParseModule(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %a = fusion(%x) {kind=loop} : f32[4] {
    %x = parameter() {index=0} : f32[4]
    %e = exp(%x) : f32[4]
    return %e
  }
  %b = fusion(%x) {kind=loop} : f32[4] {
    %x = parameter() {index=0} : f32[4]
    %n = neg(%x) : f32[4]
    return %n
  }
  return %a, %b
}
)");
  ASSERT_TRUE(loops.ok()) << loops.status();
  changed = MergeCacheWriteSiblingsPass().RunOnFunction(*(*loops)->functions()[0]);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
}

TEST(MergeCacheWriteSiblings, TheVerifierKeepsEachPoolToItsOneWrite) {
  const std::string head = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[2,1,4]
  %pool = parameter() {index=1} : f32[1,2,1,2,4]
  %slots = parameter() {index=2} : i32[2]
)";
  // Two writes of one pool in one kernel.
  absl::StatusOr<std::unique_ptr<Module>> twice = ParseModule(head + R"(  %p1, %p2 = fusion(%x, %pool, %slots) {kind=cache_write} : (f32[1,2,1,2,4], f32[1,2,1,2,4]) {
    %x = parameter() {index=0} : f32[2,1,4]
    %pool = parameter() {index=1} : f32[1,2,1,2,4]
    %slots = parameter() {index=2} : i32[2]
    %w1 = kv_cache_write(%pool, %x, %slots) {layer=0} : f32[1,2,1,2,4]
    %n = neg(%x) : f32[2,1,4]
    %w2 = kv_cache_write(%pool, %n, %slots) {layer=0} : f32[1,2,1,2,4]
    return %w1, %w2
  }
  return %p1, %p2
}
)");
  ASSERT_FALSE(twice.ok());
  EXPECT_TRUE(absl::StrContains(twice.status().message(), "that the body writes in place: only its write may"))
      << twice.status();
  // A loop value reading the pool the kernel overwrites.
  absl::StatusOr<std::unique_ptr<Module>> reads = ParseModule(head + R"(  %p1, %y = fusion(%x, %pool, %slots) {kind=cache_write} : (f32[1,2,1,2,4], f32[1,2,1,2,4]) {
    %x = parameter() {index=0} : f32[2,1,4]
    %pool = parameter() {index=1} : f32[1,2,1,2,4]
    %slots = parameter() {index=2} : i32[2]
    %w = kv_cache_write(%pool, %x, %slots) {layer=0} : f32[1,2,1,2,4]
    %e = exp(%pool) : f32[1,2,1,2,4]
    return %w, %e
  }
  return %p1, %y
}
)");
  ASSERT_FALSE(reads.ok());
  EXPECT_TRUE(absl::StrContains(reads.status().message(), "%e (exp) reads the pool %pool")) << reads.status();
  // No write at all: a loop fusion's job.
  absl::StatusOr<std::unique_ptr<Module>> none = ParseModule(head + R"(  %y = fusion(%x) {kind=cache_write} : f32[2,1,4] {
    %x = parameter() {index=0} : f32[2,1,4]
    %e = exp(%x) : f32[2,1,4]
    return %e
  }
  return %y
}
)");
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::StrContains(none.status().message(), "returns a kv_cache_write")) << none.status();
}

#ifdef KILN_WITH_CUDA
// The merged node is the pool copy (one a written pool) and one kernel; each compiles for
// sm_90a, and the lowering names the pool each result may be written over.
TEST(MergeCacheWriteSiblings, LowersToPoolCopiesAndOneKernel) {
  std::unique_ptr<Module> m = testing::TinyDecode(4, {});
  for (const Node* n : testing::FusionsOfKind(*m->functions()[0], FusionKind::kCacheWrite)) {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kernels.size(), 3u);
    EXPECT_EQ(lowered->copy_kernel_results, (std::vector<int>{0, 1}));
    const std::vector<Node*>& outs = n->body()->outputs();
    EXPECT_EQ(lowered->in_place_operand_of_results,
              (std::vector<int>{static_cast<int>(*outs[0]->operand(0)->attrs().GetInt("index")),
                                static_cast<int>(*outs[1]->operand(0)->attrs().GetInt("index")), -1}));
    for (const KernelSpec& k : lowered->kernels) {
      absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{});
      ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
    }
  }
}

// The pool copy is launched exactly where the plan cannot write the pool in place: a pool
// parameter donated to the result is written in place (one launch); one that is not donated
// is copied into the result first (two launches).
TEST(MergeCacheWriteSiblings, ThePoolIsCopiedOnlyWhereItIsNotWrittenInPlace) {
  for (bool donated : {true, false}) {
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(TwoSiblings(true, donated));
    ASSERT_TRUE(m.ok()) << m.status();
    const Function& f = *(*m)->functions()[0];
    absl::StatusOr<CompiledProgram> program = CompileProgram(f, {.target = TargetForArch("sm_90a").value()});
    ASSERT_TRUE(program.ok()) << program.status();
    int copies = 0, kernels = 0;
    for (const ProgramStep& s : program->steps) {
      if (s.kind != ProgramStep::Kind::kKernel) continue;
      ++kernels;
      copies += absl::StrContains(s.launch.name, "_copy");
    }
    EXPECT_EQ(copies, donated ? 0 : 1) << (donated ? "donated" : "not donated");
    EXPECT_EQ(kernels, donated ? 1 : 2);
    EXPECT_EQ(program->plan.in_place_outputs, donated ? 1 : 0);
  }
}
#endif

}  // namespace
}  // namespace kiln
