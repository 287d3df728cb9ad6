// expand-rope (passes/expand_rope.h): rope becomes the f32 ops it is over one rope_table per
// (positions, theta, head size, direction). IR text in, FileCheck on the print, meaning
// checked bit for bit on the reference backend (tests/testing/pass_test.h); the table is
// shared; narrow inputs and results convert at the ends; and in llama-S's training step every
// rope goes, its rotation landing in loop kernels with the slices and transposes beside it.
#include "passes/expand_rope.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "ir/text_format.h"
#include "passes/training_compile.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string Expand(absl::string_view body, bool expect_change = true) {
  ExpandRopePass pass;
  return testing::RunPassOnText(pass, absl::StrCat("module @m\nfunc @main {\n", body, "}\n"), expect_change);
}

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

TEST(ExpandRope, HeaderExample) {
  const std::string out = Expand(R"(
  %x = parameter() {index=0} : bf16[2,5,3,8]
  %pos = parameter() {index=1} : i32[5]
  %q = rope(%x, %pos) {inverse=0, theta=10000.0} : bf16[2,5,3,8]
  return %q
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %q.table = rope_table(%pos) {head_dim=8, inverse=0, theta=10000.0} : f32[5,8]
    CHECK-NEXT: %q.x = convert(%x) : f32[2,5,3,8]
    CHECK-NEXT: %q.lo = slice(%q.x) {limit=[2,5,3,4], start=[0,0,0,0], stride=[1,1,1,1]} : f32[2,5,3,4]
    CHECK-NEXT: %q.hi = slice(%q.x) {limit=[2,5,3,8], start=[0,0,0,4], stride=[1,1,1,1]} : f32[2,5,3,4]
    CHECK:      broadcast(%q.cos_rows) {dims=[1,3]} : f32[2,5,3,4]
    CHECK:      %q.out_lo = sub(%q.lo_cos, %q.hi_sin)
    CHECK-NEXT: %q.out_hi = add(%q.hi_cos, %q.lo_sin)
    CHECK-NEXT: %q.rotated = concatenate(%q.out_lo, %q.out_hi) {dim=3} : f32[2,5,3,8]
    CHECK-NEXT: %q = convert(%q.rotated) : bf16[2,5,3,8]
    CHECK-NOT:  rope(
  )");
}

// q and k of the same positions share one table; the backward's inverse rotation gets its
// own; an f32 rope converts nothing. Exact on the reference backend in every case (the
// RunPassOnText check), including f32 values far from 1 and positions up to 4096 (the random
// inputs of CheckMeaningPreserved).
TEST(ExpandRope, OneTablePerPositionsAndDirection) {
  const std::string out = Expand(R"(
  %q = parameter() {index=0} : f32[1,4,6,16]
  %k = parameter() {index=1} : f32[1,4,2,16]
  %pos = parameter() {index=2} : i32[4]
  %rq = rope(%q, %pos) {inverse=0, theta=500000.0} : f32[1,4,6,16]
  %rk = rope(%k, %pos) {inverse=0, theta=500000.0} : f32[1,4,2,16]
  %dq = rope(%rq, %pos) {inverse=1, theta=500000.0} : f32[1,4,6,16]
  return %rq, %rk, %dq
)");
  EXPECT_CHECKS(out, R"(
    CHECK:     %rq.table = rope_table(%pos) {head_dim=16, inverse=0, theta=5e+05} : f32[4,16]
    CHECK-NOT: convert
    CHECK:     %rk.lo = slice(%k)
    CHECK-NOT: rope_table(%pos) {head_dim=16, inverse=0
    CHECK:     %dq.table = rope_table(%pos) {head_dim=16, inverse=1, theta=5e+05} : f32[4,16]
  )");
  EXPECT_EQ(out.find("%rk.table"), std::string::npos) << out;
}

TEST(ExpandRope, NothingToExpandIsNoChange) {
  const std::string out = Expand(R"(
  %x = parameter() {index=0} : f32[2,8]
  %y = exp(%x) : f32[2,8]
  return %y
)", /*expect_change=*/false);
  EXPECT_CHECKS(out, "CHECK: exp(%x)");
}

// llama-S's training step through the default pipeline: no rope left, two tables (forward and
// backward rotations), and no rope_table or rotation outside the loop kernels: every mul of a
// table's broadcast sits in a fusion body.
TEST(ExpandRope, LlamaTrainingStepKeepsNoRopeAndFusesTheRotations) {
  const ModelConfig c = *PresetConfig("llama-tiny");
  auto compile = [&](bool expand) {
    std::unique_ptr<Module> m = *BuildLlamaModule(c, {.batch = 1, .seq_len = 16, .precision = Precision::kBf16});
    CompileOptions options;
    if (!expand) options.disabled_passes = {std::string(ExpandRopePass::kName)};
    absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create({}, options);
    EXPECT_TRUE(tc.ok()) << tc.status();
    absl::Status run = tc->Run(*m);
    EXPECT_TRUE(run.ok()) << run;
    return m;
  };
  std::unique_ptr<Module> before = compile(false);
  std::unique_ptr<Module> after = compile(true);
  int ropes = 0, tables = 0, unfused_muls = 0;
  for (const auto& n : after->FindFunction("train_step")->nodes()) {
    ropes += n->opcode() == Opcode::kRope;
    tables += n->opcode() == Opcode::kRopeTable;
    unfused_muls += n->opcode() == Opcode::kMul;
  }
  EXPECT_EQ(ropes, 0);
  EXPECT_EQ(tables, 2);
  EXPECT_EQ(unfused_muls, 0);
  absl::Status same = CheckMeaningPreserved(*before, *after);
  EXPECT_TRUE(same.ok()) << same;
}

}  // namespace
}  // namespace kiln
