// Loop fusion (passes/fusion.h) and the kernels it leads to (codegen/kernel_group.h): which
// nodes join a group and why the others do not, that the marks survive the text form, that
// the reference backend sees the same values (RunPassOnText checks meaning), and that every
// group kernel compiles with NVRTC for sm_90a.
#include "passes/fusion.h"

#include <map>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "codegen/compile_function.h"
#include "codegen/kernel_group.h"
#include "codegen/lower_composite.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#include "passes/default_pipeline.h"
#include "passes/lower_gemm.h"
#include "frontends/llama.h"
#include "passes/training_step.h"
#include "tests/testing/all_ops.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/reduction_shapes.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string RunFusion(absl::string_view text, bool expect_change = true) {
  FusionPass pass;
  return testing::RunPassOnText(pass, text, expect_change);
}

std::unique_ptr<Module> FuseText(absl::string_view text) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  EXPECT_TRUE(m.ok()) << m.status();
  FusionPass pass;
  EXPECT_TRUE(pass.Run(**m).ok());
  return *std::move(m);
}

constexpr absl::string_view kBiasConvert = R"(module @m
func @main {
  %a = parameter() {index=0} : f32[4,8]
  %b = parameter() {index=1} : f32[8]
  %bb = broadcast(%b) {dims=[1]} : f32[4,8]
  %s = add(%a, %bb) : f32[4,8]
  %y = convert(%s) : bf16[4,8]
  return %y
})";

TEST(Fusion, ChainWithBroadcastBecomesOneGroupRootedAtItsLastNode) {
  const std::string out = RunFusion(kBiasConvert);
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK:      %a = parameter() {index=0}
    CHECK-NEXT: %b = parameter() {index=1}
    CHECK-NEXT: %bb = broadcast(%b) {dims=[1], kernel_group="y"}
    CHECK-NEXT: %s = add(%a, %bb) {kernel_group="y"}
    CHECK-NEXT: %y = convert(%s) {kernel_group="y"}
  )").ok()) << out;
  std::unique_ptr<Module> m = FuseText(kBiasConvert);
  absl::StatusOr<std::vector<codegen::KernelGroup>> groups = codegen::FindKernelGroups(*m->functions()[0]);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_EQ((*groups)[0].root->name(), "y");
  ASSERT_EQ((*groups)[0].inputs.size(), 2u);  // %b and %a, each read once, by first use
  EXPECT_EQ((*groups)[0].inputs[0]->name(), "b");
  EXPECT_EQ((*groups)[0].inputs[1]->name(), "a");
}

TEST(Fusion, MarksSurviveTheTextForm) {
  std::unique_ptr<Module> m = FuseText(kBiasConvert);
  const std::string printed = PrintModule(*m);
  absl::StatusOr<std::unique_ptr<Module>> again = ParseModule(printed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(PrintModule(**again), printed);
  EXPECT_TRUE(codegen::FindKernelGroups(*(*again)->functions()[0]).ok());
}

TEST(Fusion, AProducerWithAUseOutsideIsStoredAndTheReasonIsRecorded) {
  constexpr absl::string_view text = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[16]
  %e = exp(%x) : f32[16]
  %n = neg(%e) : f32[16]
  %r = reduce_sum(%e) {dims=[0]} : f32[]
  %y = mul(%n, %n) : f32[16]
  return %y, %r
})";
  const std::string out = RunFusion(text);
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK:      %e = exp(%x) : f32[16]
    CHECK-NEXT: %n = neg(%e) {kernel_group="y"}
    CHECK-NEXT: %r = reduce_sum(%e) {dims=[0]} : f32[]
    CHECK-NEXT: %y = mul(%n, %n) {kernel_group="y"}
  )").ok()) << out;
  std::unique_ptr<Module> m = FuseText(text);
  const std::vector<FusionDecision> decisions = ExplainFusion(*m->functions()[0]);
  bool explained = false;
  for (const FusionDecision& d : decisions) {
    if (d.producer->name() == "e" && d.consumer->name() == "n") {
      EXPECT_FALSE(d.fused);
      EXPECT_EQ(d.why, "used outside this kernel: stored once, read by each user");
      explained = true;
    }
    if (d.producer->name() == "n") EXPECT_TRUE(d.fused) << d.why;
  }
  EXPECT_TRUE(explained);
  const std::string report = FormatFusionReport(*m->functions()[0], true);
  EXPECT_TRUE(testing::FileCheck(report, R"(
    CHECK:      @main: 1 kernel groups of 2 nodes; operand edges into groups: 2 fused, 1 not
    CHECK-NEXT:   fused      2  every use is in the kernel
    CHECK-NEXT:   not fused  1  used outside this kernel: stored once, read by each user
    CHECK-NEXT:   %e (exp) -> %n (neg): not fused: used outside this kernel
  )").ok()) << report;
}

TEST(Fusion, GemmsOutputsAndCompositesStayOutside) {
  const std::string out = RunFusion(R"(module @m
func @main {
  %a = parameter() {index=0} : bf16[4,8]
  %b = parameter() {index=1} : bf16[8,8]
  %mm = dot_general(%a, %b) {lhs_batch=[], rhs_batch=[], lhs_contract=[1], rhs_contract=[0], out_dtype=f32} : f32[4,8]
  %sm = softmax(%mm) : f32[4,8]
  %t = tanh(%sm) : f32[4,8]
  %y = convert(%t) : bf16[4,8]
  %o = exp(%mm) : f32[4,8]
  %z = neg(%o) : f32[4,8]
  return %y, %z, %o
})");
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK:      %mm = dot_general(%a, %b)
    CHECK-NOT:  kernel_group
    CHECK:      %sm = softmax(%mm) : f32[4,8]
    CHECK-NEXT: %t = tanh(%sm) {kernel_group="y"}
    CHECK-NEXT: %y = convert(%t) {kernel_group="y"}
    CHECK-NEXT: %o = exp(%mm) : f32[4,8]
    CHECK-NEXT: %z = neg(%o) : f32[4,8]
  )").ok()) << out;
}

// The causal mask reads no memory: each kernel that uses it gets its own copy, so neither
// the mask nor its broadcast is ever stored.
TEST(Fusion, AMaskThatReadsNoMemoryIsDuplicatedIntoEachUser) {
  const std::string out = RunFusion(R"(module @m
func @main {
  %s = parameter() {index=0} : f32[2,4,4]
  %g = parameter() {index=1} : f32[2,4,4]
  %qi = iota() {dim=0} : i32[4,4]
  %ki = iota() {dim=1} : i32[4,4]
  %c = compare(%qi, %ki) {direction=ge} : pred[4,4]
  %cb = broadcast(%c) {dims=[1,2]} : pred[2,4,4]
  %inf = constant() {value=-inf} : f32[]
  %infb = broadcast(%inf) {dims=[]} : f32[2,4,4]
  %zero = constant() {value=0.0} : f32[]
  %zb = broadcast(%zero) {dims=[]} : f32[2,4,4]
  %m = select(%cb, %s, %infb) : f32[2,4,4]
  %e = exp(%m) : f32[2,4,4]
  %dg = select(%cb, %g, %zb) : f32[2,4,4]
  return %e, %dg
})");
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK: %cb = broadcast(%c) {dims=[1,2], kernel_group="e"}
    CHECK: %m = select(%cb, %s, %infb) {kernel_group="e"}
    CHECK: %e = exp(%m) {kernel_group="e"}
    CHECK: %cb.dup = broadcast(%c.dup) {dims=[1,2], kernel_group="dg"}
    CHECK: %dg = select(%cb.dup, %g, %zb) {kernel_group="dg"}
  )").ok()) << out;
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(out);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::vector<codegen::KernelGroup>> groups = codegen::FindKernelGroups(*(*m)->functions()[0]);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  for (const codegen::KernelGroup& g : *groups) {
    ASSERT_EQ(g.inputs.size(), 1u) << g.root->name();  // only %s or %g comes from memory
  }
}

// A reduction roots a group: the squares of a gradient norm are never stored.
TEST(Fusion, AReductionRootsTheGroupOfItsOperandChain) {
  const std::string out = RunFusion(R"(module @m
func @main {
  %g = parameter() {index=0} : f32[64,1000]
  %c = parameter() {index=1} : f32[]
  %cb = broadcast(%c) {dims=[]} : f32[64,1000]
  %s = mul(%g, %cb) : f32[64,1000]
  %sq = mul(%s, %s) : f32[64,1000]
  %r = reduce_sum(%sq) {dims=[1]} : f32[64]
  return %r
})");
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK: %cb = broadcast(%c) {dims=[], kernel_group="r"}
    CHECK: %s = mul(%g, %cb) {kernel_group="r"}
    CHECK: %sq = mul(%s, %s) {kernel_group="r"}
    CHECK: %r = reduce_sum(%sq) {dims=[1], kernel_group="r"}
  )").ok()) << out;
}

// Every reduction scheme (a thread, a warp or block, several blocks per row; columns) reads
// a fused operand through the group's accessor and compiles.
TEST(KernelGroups, FusedReductionsOfEveryShapeCompile) {
  for (const auto& [shape, dims, result] : testing::ReductionShapesOfEveryScheme()) {
    std::unique_ptr<Module> m = FuseText(absl::StrCat(R"(module @m
func @main {
  %g = parameter() {index=0} : bf16)", shape, R"(
  %f = convert(%g) : f32)", shape, R"(
  %sq = mul(%f, %f) : f32)", shape, R"(
  %r = reduce_sum(%sq) {dims=)", dims, R"(} : f32)", result, R"(
  %m = reduce_max(%f) {dims=)", dims, R"(} : f32)", result, R"(
  return %r, %m
})"));
    const Function& f = *m->functions()[0];
    absl::StatusOr<std::vector<codegen::KernelGroup>> groups = codegen::FindKernelGroups(f);
    ASSERT_TRUE(groups.ok()) << groups.status();
    ASSERT_EQ(groups->size(), 1u) << shape << "\n" << PrintModule(*m);  // %f has two users: only %sq joins %r
    absl::StatusOr<KernelCompileReport> report = CompileFunctionKernels(f, {.arch = "sm_90a"}, nullptr);
    ASSERT_TRUE(report.ok()) << shape << ": " << report.status();
  }
}

TEST(Fusion, NothingToFuseReportsNoChange) {
  RunFusion(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %e = exp(%x) : f32[4]
  return %e
})", /*expect_change=*/false);
}

TEST(KernelGroups, MalformedMarksAreRejectedWithTheNode) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %e = exp(%x) {kernel_group="y"} : f32[4]
  %y = neg(%e) {kernel_group="y"} : f32[4]
  return %y, %e
})");
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::vector<codegen::KernelGroup>> groups = codegen::FindKernelGroups(*(*m)->functions()[0]);
  ASSERT_FALSE(groups.ok());
  EXPECT_NE(groups.status().message().find("%e (exp) is returned"), std::string::npos) << groups.status();
}

// Every group the default pipeline forms in llama-tiny's training step (and in the all-ops
// module) lowers to a kernel that NVRTC compiles for sm_90a, and the step has fewer
// launches than without fusion.
TEST(KernelGroups, EveryGroupOfATrainingStepCompiles) {
  ModelConfig config = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = *BuildLlamaModule(config, {.batch = 2, .seq_len = 16, .precision = Precision::kBf16});
  ASSERT_TRUE(BuildTrainingStep(*m, *m->FindFunction("forward"), {}, nullptr).ok());
  std::unique_ptr<Module> unfused = CloneModule(*m);
  ASSERT_TRUE(RunDefaultPipeline(*m, {}).ok());
  CompileOptions no_fusion;
  no_fusion.disabled_passes.push_back("fuse-loops");
  ASSERT_TRUE(BuildDefaultPipeline(no_fusion).Run(*unfused, no_fusion).ok());
  const Function& step = *m->FindFunction("train_step");
  absl::StatusOr<std::vector<codegen::KernelGroup>> groups = codegen::FindKernelGroups(step);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_GT(groups->size(), 20u);
  absl::StatusOr<KernelCompileReport> fused = CompileFunctionKernels(step, {.arch = "sm_90a"}, nullptr);
  ASSERT_TRUE(fused.ok()) << fused.status();
  absl::StatusOr<KernelCompileReport> plain =
      CompileFunctionKernels(*unfused->FindFunction("train_step"), {.arch = "sm_90a"}, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::printf("llama-tiny step: %zu kernel groups; %lld launches fused, %lld unfused\n", groups->size(),
              static_cast<long long>(fused->num_kernels), static_cast<long long>(plain->num_kernels));
  EXPECT_LT(fused->num_kernels, plain->num_kernels * 4 / 5);

  std::unique_ptr<Module> all_ops = testing::BuildAllOpsModule();
  ASSERT_TRUE(LowerGemmPass().Run(*all_ops).ok());
  FusionPass pass;
  ASSERT_TRUE(pass.Run(*all_ops).ok());
  absl::StatusOr<KernelCompileReport> ops = CompileFunctionKernels(*all_ops->functions()[0], {.arch = "sm_90a"}, nullptr);
  ASSERT_TRUE(ops.ok()) << ops.status();
}

// Multi-result ops: a parameter's update is one adamw_update node with three results, one
// in-place kernel writing them all; its get_result nodes launch nothing. attention writes
// its output and LSE in one kernel, attention_grad dq in one and dk, dv in another.
TEST(KernelGroups, MultiResultNodesWriteEveryResultFromTheirKernels) {
  ModelConfig config = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = *BuildLlamaModule(config, {.batch = 2, .seq_len = 16, .precision = Precision::kBf16});
  TrainingStepLayout layout;
  ASSERT_TRUE(BuildTrainingStep(*m, *m->FindFunction("forward"), {}, &layout).ok());
  ASSERT_TRUE(RunDefaultPipeline(*m, {}).ok());
  const Function& step = *m->FindFunction("train_step");
  absl::StatusOr<KernelCompileReport> report = CompileFunctionKernels(step, {.arch = "sm_90a"}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  int updates = 0, results = 0;
  for (const NodeKernels& n : report->nodes) {
    if (n.node->opcode() == Opcode::kGetResult && n.node->operand(0)->opcode() == Opcode::kAdamWUpdate) {
      ++results;
      EXPECT_EQ(n.lowered.kind, LoweringKind::kResult);
      EXPECT_TRUE(n.lowered.kernels.empty());
    }
    if (n.node->opcode() != Opcode::kAdamWUpdate) continue;
    ++updates;
    EXPECT_EQ(n.node->num_results(), 3);
    EXPECT_TRUE(n.lowered.elementwise_in_place);
    ASSERT_EQ(n.lowered.kernels.size(), 1u);
    EXPECT_NE(n.lowered.kernels[0].source.find("AdamWUpdate<"), std::string::npos);
  }
  EXPECT_EQ(updates, layout.num_params);
  EXPECT_EQ(results, 3 * layout.num_params);

  std::unique_ptr<Module> all_ops = testing::BuildAllOpsModule();
  const Function& attention = *all_ops->FindFunction("attention");
  absl::StatusOr<KernelCompileReport> attention_kernels = CompileFunctionKernels(attention, {.arch = "sm_90a"}, nullptr);
  ASSERT_TRUE(attention_kernels.ok()) << attention_kernels.status();
  std::map<Opcode, size_t> kernels_of;
  for (const NodeKernels& n : attention_kernels->nodes) kernels_of[n.node->opcode()] += n.lowered.kernels.size();
  EXPECT_EQ(kernels_of[Opcode::kAttention], 1u);
  EXPECT_EQ(kernels_of[Opcode::kAttentionGrad], 2u);
  EXPECT_EQ(kernels_of[Opcode::kGetResult], 0u);
}

}  // namespace
}  // namespace kiln
