// fuse-norm-between-gemvs (passes/fuse_norm_between_gemvs.h): the rms_norm between two
// decode GEMVs is applied by the second as it reads, from sums of squares the first adds up.
// The pass changes no value on the reference backend (the body holds the ops it replaced), takes
// only the GEMVs SmallMGemm streams, its kind is checked by the verifier and round-trips as text,
// and codegen lowers it to two kernels that share the node's persistent bytes (the sums), which
// the memory plan gives the node alone and the launch list passes last.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codegen/lower_gemv.h"
#include "codegen/lower_node.h"
#include "frontends/model_config.h"
#include "ir/fusion.h"
#include "ir/text_format.h"
#include "passes/fuse_norm_between_gemvs.h"
#include "tests/testing/tiny_decode.h"

#ifdef KILN_WITH_CUDA
#include "codegen/compile_program.h"
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

// Off by default (passes/fuse_norm_between_gemvs.h): each test enables it.
const std::string kPass(FuseNormBetweenGemvsPass::kName);

int CountOps(const Function& f, Opcode op) {
  int count = 0;
  for (const auto& n : f.nodes()) count += n->opcode() == op;
  return count;
}

// Each layer: o, its norm and the gate/up GEMV (with the SwiGLU); down, the next layer's norm
// and its qkv (the last layer's: the final norm and the LM head). The first layer's norm, of the
// embedding, stays a kernel of its own.
TEST(FuseNormBetweenGemvs, DecodeAppliesEveryNormButTheFirstInItsGemvWithTheSameBits) {
  std::unique_ptr<Module> fused = testing::TinyDecode(4, {}, {kPass});
  std::unique_ptr<Module> plain = testing::TinyDecode(4, {});  // off by default
  const Function& f = *fused->functions()[0];
  const int layers = PresetConfig("llama-tiny")->n_layers;
  const std::vector<const Node*> fusions = testing::FusionsOfKind(f, FusionKind::kGemvNormGemv);
  ASSERT_EQ(fusions.size(), static_cast<size_t>(2 * layers));
  EXPECT_EQ(CountOps(f, Opcode::kRmsNorm), 1);
  EXPECT_EQ(CountOps(*plain->functions()[0], Opcode::kRmsNorm), 2 * layers + 1);
  int with_glu = 0;
  for (const Node* n : fusions) {
    absl::StatusOr<GemvNormGemvOps> ops = MatchGemvNormGemv(*n->body());
    ASSERT_TRUE(ops.ok()) << ops.status();
    with_glu += ops->glu.out != nullptr;
    EXPECT_EQ(n->result(0)->type().dtype, DType::kF32) << "the residual stream";
    for (int i = 3; i < n->num_operands(); ++i) {
      EXPECT_EQ(n->operand(i)->opcode(), Opcode::kParameter) << "the norm's weight and the second GEMV's";
    }
  }
  EXPECT_EQ(with_glu, layers) << "o's fusion takes the gate/up gemv_glu fusion in";
  EXPECT_TRUE(testing::FusionsOfKind(f, FusionKind::kGemvGlu).empty());

  testing::ExpectSameDecode(f, *plain->functions()[0]);
  testing::ExpectTextRoundTrips(*fused);
  EXPECT_TRUE(absl::StrContains(PrintModule(*fused), "{kind=gemv_norm_gemv}"));
}

// A batch of 16 is cuBLASLt's (more rows than SmallMGemm takes): its norms stay kernels.
TEST(FuseNormBetweenGemvs, LeavesCublasLtGemmsAlone) {
  std::unique_ptr<Module> m = testing::TinyDecode(16, {}, {kPass});
  EXPECT_TRUE(testing::FusionsOfKind(*m->functions()[0], FusionKind::kGemvNormGemv).empty());
  EXPECT_EQ(CountOps(*m->functions()[0], Opcode::kRmsNorm), 2 * PresetConfig("llama-tiny")->n_layers + 1);
}

// The verifier holds the kind to its body: two gemms of parameters but the norm, the first f32,
// the norm read by the second alone, the outputs the first gemm and then the second.
TEST(FuseNormBetweenGemvs, TheVerifierWantsTwoGemmsAndTheNormBetween) {
  auto module = [](absl::string_view first_type, absl::string_view extra, absl::string_view outputs) {
    return absl::StrCat(R"(module @m
func @main {
  %h = parameter() {index=0} : bf16[1,8]
  %wo = parameter() {index=1} : bf16[8,8]
  %r = parameter() {index=2} : )",
                        first_type, R"([1,8]
  %wn = parameter() {index=3} : f32[8]
  %wq = parameter() {index=4} : bf16[4,8]
  %x, %q = fusion(%h, %wo, %r, %wn, %wq) {kind=gemv_norm_gemv} : ()",
                        first_type, R"([1,8], f32[1,4]) {
    %h = parameter() {index=0} : bf16[1,8]
    %wo = parameter() {index=1} : bf16[8,8]
    %r = parameter() {index=2} : )",
                        first_type, R"([1,8]
    %wn = parameter() {index=3} : f32[8]
    %wq = parameter() {index=4} : bf16[4,8]
    %x = gemm(%h, %wo, %r) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=1.0, epilogue=none, k=8, m=1, n=8} : )",
                        first_type, R"([1,8]
    %n = rms_norm(%x, %wn) {eps=1e-05)",
                        first_type == "f32" ? ", out_dtype=bf16" : "", R"(} : bf16[1,8]
    %q = gemm(%n, %wq) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=8, m=1, n=4} : f32[1,4]
)",
                        extra, "    return ", outputs, R"(
  }
  return %x, %q
}
)");
  };
  absl::StatusOr<std::unique_ptr<Module>> good = ParseModule(module("f32", "", "%x, %q"));
  ASSERT_TRUE(good.ok()) << good.status();

  absl::StatusOr<std::unique_ptr<Module>> bf16 = ParseModule(module("bf16", "", "%x, %q"));
  ASSERT_FALSE(bf16.ok());
  EXPECT_TRUE(absl::StrContains(bf16.status().message(), "is not f32")) << bf16.status();

  absl::StatusOr<std::unique_ptr<Module>> swapped = ParseModule(module("f32", "", "%q, %x"));
  ASSERT_FALSE(swapped.ok());
  EXPECT_TRUE(absl::StrContains(swapped.status().message(), "returns its first gemm, then its second"))
      << swapped.status();

  // The norm read by something else too: the second GEMV would be the only one to see it.
  absl::StatusOr<std::unique_ptr<Module>> shared = ParseModule(
      module("f32", "    %m = neg(%n) : bf16[1,8]\n", "%x, %q"));
  ASSERT_FALSE(shared.ok());
  EXPECT_TRUE(absl::StrContains(shared.status().message(), "its one reader")) << shared.status();

  // Without SmallMGemm (CodegenOptions::small_m_gemv off), codegen names the pass to disable.
  const Node* fusion = (*good)->functions()[0]->outputs()[0]->operand(0);
  CodegenOptions no_gemv;
  no_gemv.small_m_gemv = false;
  absl::StatusOr<LoweredNode> refused = LowerNode(*fusion, no_gemv);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--disable-pass fuse-norm-between-gemvs"))
      << refused.status();
}

// Two kernels: the first adds up the squares, the second reads A through the norm; one set
// of sums each node (32 slots of two 8-byte words a row, and the count), D's rows in scratch.
TEST(FuseNormBetweenGemvs, LowersToTwoGemvsSharingTheNodesPersistentSums) {
  for (int64_t batch : {1, 4}) {
    std::unique_ptr<Module> m = testing::TinyDecode(batch, {}, {kPass});
    const std::vector<const Node*> fusions = testing::FusionsOfKind(*m->functions()[0], FusionKind::kGemvNormGemv);
    ASSERT_FALSE(fusions.empty());
    for (const Node* n : fusions) {
      absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      ASSERT_EQ(lowered->kernels.size(), 2u);
      EXPECT_EQ(lowered->label, "gemv");
      EXPECT_EQ(lowered->persistent_bytes, batch * codegen::kSquareSumSlots * 16 + 8);
      EXPECT_EQ(lowered->scratch_bytes, batch * n->result(0)->type().dims.back() * 4);
      EXPECT_TRUE(absl::StrContains(lowered->kernels[0].source, "::RunAddingSquares(x != nullptr ? x : x_scratch"))
          << lowered->kernels[0].source;
      EXPECT_TRUE(absl::StrContains(lowered->kernels[1].source, "::RunNormedA<float>(y, x != nullptr ? x : x_scratch"))
          << lowered->kernels[1].source;
      for (const KernelSpec& k : lowered->kernels) {
        EXPECT_TRUE(k.waits_itself) << "the weights, parameters, are read before the wait";
        EXPECT_TRUE(absl::StrContains(k.source, "float* x_scratch, unsigned long long* sums)")) << k.source;
      }
    }
  }
}

#ifdef KILN_WITH_CUDA
// NVRTC compiles both kernels (GLU form and plain, batch 1 and 4) for sm_90a; in the compiled
// program each node's sums are a persistent buffer no other buffer overlaps, passed to both
// of its launches, and the node's scratch holds x where the plan gives x no buffer.
TEST(FuseNormBetweenGemvs, CompilesAndEveryNodeHoldsItsOwnSums) {
  for (int64_t batch : {1, 4}) {
    std::unique_ptr<Module> m = testing::TinyDecode(batch, {}, {kPass});
    const Function& f = *m->functions()[0];
    absl::StatusOr<CompiledProgram> program = CompileProgram(f, {.target = TargetForArch("sm_90a").value()});
    ASSERT_TRUE(program.ok()) << program.status();
    const BufferPlan& plan = program->plan;
    int launches = 0;
    std::vector<int64_t> persistent;
    for (const ProgramStep& s : program->steps) {
      if (s.node == nullptr || s.node->opcode() != Opcode::kFusion ||
          *FusionKindOf(*s.node) != FusionKind::kGemvNormGemv) {
        EXPECT_EQ(s.persistent_buffer, -1);
        continue;
      }
      ++launches;
      ASSERT_GE(s.persistent_buffer, 0);
      ASSERT_GE(s.scratch_buffer, 0);
      const PlannedBuffer& sums = plan.buffers[s.persistent_buffer];
      EXPECT_EQ(sums.kind, PlannedBuffer::Kind::kPersistent);
      EXPECT_EQ(sums.first_step, 0);
      EXPECT_EQ(sums.last_step, f.num_nodes());
      if (persistent.empty() || persistent.back() != s.persistent_buffer) persistent.push_back(s.persistent_buffer);
    }
    EXPECT_EQ(launches, 2 * 2 * PresetConfig("llama-tiny")->n_layers);
    EXPECT_EQ(persistent.size(), static_cast<size_t>(launches / 2)) << "a node's two launches share its sums";
    for (int64_t p : persistent) {
      const PlannedBuffer& sums = plan.buffers[p];
      for (size_t b = 0; b < plan.buffers.size(); ++b) {
        const PlannedBuffer& other = plan.buffers[b];
        if (static_cast<int64_t>(b) == p || other.bytes == 0) continue;
        EXPECT_TRUE(other.offset + other.bytes <= sums.offset || sums.offset + sums.bytes <= other.offset)
            << "buffer " << b << " overlaps the sums of node " << sums.node_index;
      }
    }
  }
}
#endif

}  // namespace
}  // namespace kiln
