// group-optimizer-updates (passes/group_optimizer_updates.h): adamw_update nodes sharing their
// per-step scalars and attributes become grouped nodes. The grouped op's reference semantics
// (each group exactly the one-group update); IR text in, FileCheck on the print, each rewrite
// checked bit for bit on the reference backend; the 4 KiB cap, the classes, the order and
// the placement window; the grouped results updating their own parameters in place in the
// buffer plan (and never another group's); llama-tiny's and gpt2-tiny's training steps
// through the whole default pipeline with and without the pass, bit for bit.
#include "passes/group_optimizer_updates.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/compile_program.h"
#include "frontends/gpt2.h"
#include "frontends/llama.h"
#include "ir/builder.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "passes/training_compile.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

std::string Module(absl::string_view body) { return absl::StrCat("module @m\nfunc @main {\n", body, "}\n"); }

std::string Group(absl::string_view body, bool expect_change = true,
                  int64_t max_groups = kMaxAdamWGroupsPerLaunch) {
  GroupOptimizerUpdatesPass pass(max_groups);
  return testing::RunPassOnText(pass, Module(body), expect_change);
}

constexpr absl::string_view kAttrs = "{beta1=0.9, beta2=0.95, eps=1e-08}";

// `sizes.size()` parameters w<i> with their gradients, moments and one-group updates, each
// reading decay `decay_of[i]` (%decay0 or %decay1; all %decay0 when empty); the results are
// returned donated to their parameters (p', m', v' to w, m, v).
std::string Updates(const std::vector<int64_t>& sizes, const std::vector<int>& decay_of = {}) {
  const int64_t n = static_cast<int64_t>(sizes.size());
  std::string body;
  int64_t index = 0;
  auto param = [&](const std::string& name, const std::string& type) {
    absl::StrAppend(&body, "  %", name, " = parameter() {index=", index++, "} : ", type, "\n");
  };
  for (const char* kind : {"w", "m.w", "v.w", "g"}) {
    for (int64_t i = 0; i < n; ++i) param(absl::StrCat(kind, i), absl::StrCat("f32[", sizes[i], "]"));
  }
  for (const char* s : {"lr", "decay0", "decay1", "bc2", "scale"}) param(s, "f32[]");
  std::vector<std::string> outs, aliases;
  for (int64_t i = 0; i < n; ++i) {
    const std::string t = absl::StrCat("f32[", sizes[i], "]");
    absl::StrAppend(&body, "  %w", i, ".new, %m.w", i, ".new, %v.w", i, ".new = adamw_update(%w", i, ", %g", i,
                    ", %m.w", i, ", %v.w", i, ", %lr, %decay", decay_of.empty() ? 0 : decay_of[i], ", %bc2, %scale) ",
                    kAttrs, " : (", t, ", ", t, ", ", t, ") @adamw\n");
  }
  for (const char* kind : {"w", "m.w", "v.w"}) {
    for (int64_t i = 0; i < n; ++i) outs.push_back(absl::StrCat("%", kind, i, ".new"));
  }
  for (int64_t i = 0; i < 3 * n; ++i) aliases.push_back(absl::StrCat(i));
  absl::StrAppend(&body, "  return ", absl::StrJoin(outs, ", "), " {aliases=[", absl::StrJoin(aliases, ","), "]}\n");
  return body;
}

int CountUpdates(const std::string& text) {
  int count = 0;
  for (size_t at = text.find("adamw_update("); at != std::string::npos; at = text.find("adamw_update(", at + 1)) {
    ++count;
  }
  return count;
}

// The grouped op on the reference backend: every group's results are the one-group node's,
// bit for bit (the same function computes both).
TEST(GroupedAdamWUpdate, EachGroupIsTheOneGroupUpdateBitForBit) {
  const std::vector<int64_t> sizes = {7, 64, 1};
  const std::string separate = Module(Updates(sizes));
  GroupOptimizerUpdatesPass pass;
  std::unique_ptr<kiln::Module> before = *ParseModule(separate);
  std::unique_ptr<kiln::Module> after = *ParseModule(separate);
  ASSERT_TRUE(*pass.Run(*after));
  ASSERT_EQ(CountUpdates(PrintModule(*after)), 1) << PrintModule(*after);
  for (uint64_t seed : {1, 2, 3}) {
    DifferentialCheckOptions check{.seed = seed};
    for (int64_t i = 0; i < 3; ++i) check.ranges[2 * 3 + i] = {0.0, 1e-2};  // v >= 0
    check.ranges[4 * 3 + 0] = {1e-4, 1e-2};                                   // lr
    check.ranges[4 * 3 + 1] = {0.99, 1.0};                                    // decay
    check.ranges[4 * 3 + 3] = {0.9, 1.0};                                     // bc2
    check.ranges[4 * 3 + 4] = {0.25, 1.0};                                    // grad scale
    absl::StatusOr<DifferentialReport> report =
        CompareFunctions(*before->FindFunction("main"), *after->FindFunction("main"), check);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->within_tolerance()) << report->ToString();
    for (const OutputDifference& d : report->outputs) EXPECT_EQ(d.max_abs_error, 0.0) << d.name;
  }
}

TEST(GroupedAdamWUpdate, ShapeInferenceChecksEveryGroup) {
  Function f("f");
  Builder b(&f);
  const TensorType scalar{DType::kF32, {}};
  std::vector<Node*> in;
  for (const char* name : {"p", "g", "m", "v"}) in.push_back(*b.Parameter(name, {DType::kF32, {8}}));
  for (const char* name : {"q", "h", "n", "u"}) in.push_back(*b.Parameter(name, {DType::kF32, {3}}));
  for (const char* name : {"lr", "decay", "bc2", "scale"}) in.push_back(*b.Parameter(name, scalar));
  const AttrMap attrs{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}};
  absl::StatusOr<std::vector<Node*>> ok = b.MultiResultOp(Opcode::kAdamWUpdate, in, attrs);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 6u);
  EXPECT_EQ((*ok)[3]->type(), (TensorType{DType::kF32, {3}}));
  std::vector<Node*> bad = in;
  bad[5] = in[0];  // group 1's g of group 0's type
  absl::StatusOr<std::vector<Node*>> wrong = b.MultiResultOp(Opcode::kAdamWUpdate, bad, attrs);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("group 1: g f32[8] must have p's type f32[3]"), std::string::npos)
      << wrong.status();
  std::vector<Node*> short_by_one(in.begin() + 1, in.end());
  wrong = b.MultiResultOp(Opcode::kAdamWUpdate, short_by_one, attrs);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("4 operands (p, g, m, v) per parameter group and 4 scalars"),
            std::string::npos)
      << wrong.status();
}

// The header's example.
TEST(GroupOptimizerUpdates, HeaderExample) {
  const std::string out = Group(Updates({64, 6}));
  EXPECT_CHECKS(out, R"(CHECK: %w0.new, %m.w0.new, %v.w0.new, %w1.new, %m.w1.new, %v.w1.new = adamw_update(%w0, %g0, %m.w0, %v.w0, %w1, %g1, %m.w1, %v.w1, %lr, %decay0, %bc2, %scale) {beta1=0.9, beta2=0.95, eps=1e-08} : (f32[64], f32[64], f32[64], f32[6], f32[6], f32[6]) @adamw
CHECK-NOT: adamw_update
CHECK: return %w0.new, %w1.new, %m.w0.new, %m.w1.new, %v.w0.new, %v.w1.new {aliases=[0,1,2,3,4,5]})");
  // It prints what it parses: the grouped node round-trips through text.
  absl::StatusOr<std::unique_ptr<kiln::Module>> reparsed = ParseModule(out);
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_EQ(PrintModule(**reparsed), out);
  // Running it again changes nothing.
  GroupOptimizerUpdatesPass again;
  EXPECT_FALSE(*again.Run(**reparsed));
}

// At most max_groups per node, the 4 KiB kernel-parameter cap by default: 150 updates are
// nodes of 72, 72 and 6 groups, each within 7 pointers per group and 4 scalars of 4 KiB.
TEST(GroupOptimizerUpdates, GroupsRespectTheCap) {
  EXPECT_EQ(kMaxAdamWGroupsPerLaunch, 72);
  EXPECT_LE((kMaxAdamWGroupsPerLaunch * 7 + 4) * 8, 4096);
  EXPECT_GT(((kMaxAdamWGroupsPerLaunch + 1) * 7 + 4) * 8, 4096);
  const std::string five = Group(Updates({4, 4, 4, 4, 4}), true, /*max_groups=*/2);
  EXPECT_EQ(CountUpdates(five), 3) << five;
  EXPECT_CHECKS(five, R"(CHECK: %w0.new, %m.w0.new, %v.w0.new, %w1.new, %m.w1.new, %v.w1.new = adamw_update(
CHECK: %w2.new, %m.w2.new, %v.w2.new, %w3.new, %m.w3.new, %v.w3.new = adamw_update(
CHECK: %w4.new, %m.w4.new, %v.w4.new = adamw_update()");

  std::vector<int64_t> sizes(150, 8);
  absl::StatusOr<std::unique_ptr<kiln::Module>> m = ParseModule(Module(Updates(sizes)));
  ASSERT_TRUE(m.ok()) << m.status();
  GroupOptimizerUpdatesPass pass;
  ASSERT_TRUE(*pass.Run(**m));
  std::vector<int> groups;
  for (const auto& n : (*m)->functions()[0]->nodes()) {
    if (n->opcode() != Opcode::kAdamWUpdate) continue;
    groups.push_back(n->num_results() / 3);
    EXPECT_LE((n->num_operands() + n->num_results()) * 8, kKernelParamBytesLimit);
  }
  EXPECT_EQ(groups, (std::vector<int>{72, 72, 6}));
}

// Updates reading other scalars (the decay of non-decayed weights) or other attributes stay
// in classes of their own; an update alone in its class is left as it was.
TEST(GroupOptimizerUpdates, OnlyUpdatesSharingScalarsAndAttributesAreGrouped) {
  const std::string out = Group(Updates({4, 8, 4, 8, 2}, {0, 1, 0, 1, 0}));
  EXPECT_EQ(CountUpdates(out), 2) << out;
  EXPECT_CHECKS(out, R"(CHECK: %w0.new, %m.w0.new, %v.w0.new, %w2.new, %m.w2.new, %v.w2.new, %w4.new, %m.w4.new, %v.w4.new = adamw_update(%w0, %g0, %m.w0, %v.w0, %w2, %g2, %m.w2, %v.w2, %w4, %g4, %m.w4, %v.w4, %lr, %decay0, %bc2, %scale)
CHECK: %w1.new, %m.w1.new, %v.w1.new, %w3.new, %m.w3.new, %v.w3.new = adamw_update(%w1, %g1, %m.w1, %v.w1, %w3, %g3, %m.w3, %v.w3, %lr, %decay1, %bc2, %scale))");

  std::string other_beta = Updates({4, 4});
  const size_t second = other_beta.rfind("beta1=0.9");
  other_beta.replace(second, 9, "beta1=0.8");
  Group(other_beta, /*expect_change=*/false);
  Group(Updates({4, 4}, {0, 1}), /*expect_change=*/false);
  Group(Updates({4}), /*expect_change=*/false);
}

// Groups list their tensors in the order they become ready (the last-defined of p, g, m, v)
// and sit just after the last node they need, before the first reader of a result.
TEST(GroupOptimizerUpdates, GroupsFollowReadinessAndStayInTheirWindow) {
  constexpr absl::string_view kLate = R"(  %w0 = parameter() {index=0} : f32[4]
  %w1 = parameter() {index=1} : f32[4]
  %m0 = parameter() {index=2} : f32[4]
  %m1 = parameter() {index=3} : f32[4]
  %v0 = parameter() {index=4} : f32[4]
  %v1 = parameter() {index=5} : f32[4]
  %x = parameter() {index=6} : f32[4]
  %lr = parameter() {index=7} : f32[]
  %decay = parameter() {index=8} : f32[]
  %bc2 = parameter() {index=9} : f32[]
  %scale = parameter() {index=10} : f32[]
  %g1 = exp(%x) : f32[4]
  %w1.new, %m1.new, %v1.new = adamw_update(%w1, %g1, %m1, %v1, %lr, %decay, %bc2, %scale) {beta1=0.9, beta2=0.95, eps=1e-08} : (f32[4], f32[4], f32[4]) @adamw
  %g0 = neg(%x) : f32[4]
  %w0.new, %m0.new, %v0.new = adamw_update(%w0, %g0, %m0, %v0, %lr, %decay, %bc2, %scale) {beta1=0.9, beta2=0.95, eps=1e-08} : (f32[4], f32[4], f32[4]) @adamw
  %after = add(%w0.new, %w1.new) : f32[4]
  return %after, %m0.new, %m1.new, %v0.new, %v1.new {aliases=[-1,2,3,4,5]}
)";
  // w1's gradient is ready first, so it is group 0; the node follows %g0.
  EXPECT_CHECKS(Group(kLate), R"(CHECK: %g1 = exp(%x)
CHECK-NEXT: %g0 = neg(%x)
CHECK-NEXT: %w1.new, %m1.new, %v1.new, %w0.new, %m0.new, %v0.new = adamw_update(%w1, %g1, %m1, %v1, %w0, %g0, %m0, %v0, %lr, %decay, %bc2, %scale)
CHECK-NEXT: %after = add(%w0.new, %w1.new))");

  // w1's result is read (by %early) before w0's gradient exists: no place suits both.
  std::string read_early(kLate);
  const std::string g0 = "  %g0 = neg(%x) : f32[4]\n";
  read_early.replace(read_early.find(g0), g0.size(),
                     "  %early = neg(%w1.new) : f32[4]\n  %g0 = neg(%early) : f32[4]\n");
  Group(read_early, /*expect_change=*/false);

  // The second update reads the first's result directly: never one group.
  std::string chained(kLate);
  const std::string w0_update = "adamw_update(%w0, %g0, %m0, %v0";
  chained.replace(chained.find(w0_update), w0_update.size(), "adamw_update(%w1.new, %g0, %m0, %v0");
  Group(chained, /*expect_change=*/false);
}

// In the buffer plan, a grouped result takes its own group's p, m or v (operand 4i+{0,2,3}),
// so the finish copies nothing; a result donated to another group's parameter (of the same
// size) never takes that buffer, which other blocks of the launch still read.
TEST(GroupOptimizerUpdates, GroupedResultsUpdateTheirOwnParametersInPlace) {
  for (bool crossed : {false, true}) {
    SCOPED_TRACE(crossed ? "p'_0 and p'_1 donated to each other's parameter" : "donated to their own");
    std::string body = Updates({64, 64, 6});
    if (crossed) body.replace(body.find("{aliases=[0,1,"), 14, "{aliases=[1,0,");
    absl::StatusOr<std::unique_ptr<kiln::Module>> m = ParseModule(Module(body));
    ASSERT_TRUE(m.ok()) << m.status();
    GroupOptimizerUpdatesPass pass;
    ASSERT_TRUE(*pass.Run(**m));
    const Function& f = *(*m)->functions()[0];
    absl::StatusOr<CompiledProgram> program = CompileProgram(f, {.target = TargetForArch("sm_90a").value()});
    ASSERT_TRUE(program.ok()) << program.status();
    EXPECT_EQ(program->num_launches, 1);
    const BufferPlan& plan = program->plan;
    absl::flat_hash_map<const Node*, int64_t> index_of;
    for (int64_t i = 0; i < f.num_nodes(); ++i) index_of[f.nodes()[i].get()] = i;
    const std::vector<Node*> params = f.parameters();
    for (size_t o = 0; o < f.outputs().size(); ++o) {
      const bool swapped = crossed && o < 2;
      const Node* param = params[f.output_aliases()[o]];
      EXPECT_EQ(plan.node_buffer[index_of.at(f.outputs()[o])] == plan.node_buffer[index_of.at(param)], !swapped)
          << "output " << o << " (%" << f.outputs()[o]->name() << ")";
    }
    EXPECT_EQ(plan.in_place_outputs, crossed ? 7 : 9);
  }
}

// The whole default pipeline with and without the pass, on the reference backend: the same
// training step results bit for bit (the pass changes no arithmetic).
struct StepPair {
  std::unique_ptr<kiln::Module> with, without;
  TrainingStepLayout layout;
};

StepPair CompileBoth(std::unique_ptr<kiln::Module> m, double clip_norm) {
  StepPair pair;
  std::unique_ptr<kiln::Module> copy = CloneModule(*m);
  TrainingStepOptions step;
  step.adamw.clip_norm = clip_norm;
  for (bool grouped : {true, false}) {
    CompileOptions options;
    if (!grouped) options.disabled_passes = {std::string(GroupOptimizerUpdatesPass::kName)};
    absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create(step, options);
    EXPECT_TRUE(tc.ok()) << tc.status();
    std::unique_ptr<kiln::Module>& target = grouped ? pair.with : pair.without;
    target = grouped ? std::move(m) : std::move(copy);
    absl::Status run = tc->Run(*target);
    EXPECT_TRUE(run.ok()) << run;
    pair.layout = tc->layout();
  }
  return pair;
}

DifferentialCheckOptions StepCheck(const TrainingStepLayout& layout) {
  DifferentialCheckOptions check;
  for (int64_t i = 0; i < layout.num_params; ++i) check.ranges[layout.first_v() + i] = {0.0, 1e-2};
  check.ranges[layout.t_index()] = {1.0, 100.0};
  check.ranges[layout.lr_index()] = {1e-4, 1e-2};
  return check;
}

int64_t UpdateNodes(const Function& f) {
  int64_t n = 0;
  for (const auto& node : f.nodes()) n += node->opcode() == Opcode::kAdamWUpdate;
  return n;
}

TEST(GroupOptimizerUpdates, TrainingStepsAreBitForBitTheSame) {
  struct Case {
    const char* preset;
    double clip_norm;
  };
  for (const Case& c : {Case{"llama-tiny", 1.0}, Case{"llama-tiny", 0.0}, Case{"gpt2-tiny", 1.0}}) {
    SCOPED_TRACE(absl::StrCat(c.preset, ", clip ", c.clip_norm));
    ModelConfig config = *PresetConfig(c.preset);
    StepPair s = CompileBoth(*BuildModelModule(config, {.batch = 2, .seq_len = 16, .precision = Precision::kBf16}),
                             c.clip_norm);
    const Function& with = *s.with->FindFunction("train_step");
    const Function& without = *s.without->FindFunction("train_step");
    EXPECT_EQ(UpdateNodes(without), s.layout.num_params);
    EXPECT_EQ(UpdateNodes(with), 2) << "decayed matrices, and the rest";
    std::printf("%s step (clip %g): %lld adamw_update nodes -> %lld\n", c.preset, c.clip_norm,
                static_cast<long long>(UpdateNodes(without)), static_cast<long long>(UpdateNodes(with)));
    absl::Status same = CheckMeaningPreserved(*s.without, *s.with, StepCheck(s.layout));
    EXPECT_TRUE(same.ok()) << same;
  }
}

}  // namespace
}  // namespace kiln
