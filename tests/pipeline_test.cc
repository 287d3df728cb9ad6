#include "passes/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "absl/strings/match.h"
#include "ir/file_util.h"
#include "ir/text_format.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/default_pipeline.h"
#include "tests/testing/filecheck.h"

namespace kiln {
namespace {

// A pass made of a lambda, for pipelines that need a pass that misbehaves on purpose.
class LambdaPass : public Pass {
 public:
  LambdaPass(std::string name, std::function<absl::StatusOr<bool>(Module&)> run)
      : name_(std::move(name)), run_(std::move(run)) {}
  absl::string_view name() const override { return name_; }
  absl::StatusOr<bool> Run(Module& m) override { return run_(m); }

 private:
  std::string name_;
  std::function<absl::StatusOr<bool>(Module&)> run_;
};

std::unique_ptr<Module> Parse(absl::string_view text) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : std::make_unique<Module>();
}

constexpr absl::string_view kRedundant = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %a = exp(%x) : f32[4]
  %b = exp(%x) : f32[4]
  %one = constant() {value=1.0} : f32[4]
  %c = mul(%b, %one) : f32[4]
  %d = add(%a, %c) : f32[4]
  %dead = neg(%d) : f32[4]
  return %d
})";

CompileOptions TestOptions() {
  CompileOptions o;
  o.check_change_reporting = true;
  return o;
}

std::string TempDir(absl::string_view name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("kiln_pipeline_test_", ::getpid(), "_", name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

const PassRecord* FindRecord(const PipelineReport& r, absl::string_view name) {
  for (const PassRecord& p : r.passes) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

TEST(Pipeline, RunsPassesInOrderAndReportsEach) {
  std::unique_ptr<Module> m = Parse(kRedundant);
  Pipeline p("test");
  p.Add(std::make_unique<CsePass>()).Add(std::make_unique<DcePass>());
  absl::StatusOr<PipelineReport> report = p.Run(*m, TestOptions());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->passes.size(), 2u);
  EXPECT_EQ(report->passes[0].name, "cse");
  EXPECT_EQ(report->passes[0].outcome, PassRecord::Outcome::kChanged);
  EXPECT_EQ(report->passes[0].nodes_before, 7);
  EXPECT_EQ(report->passes[0].nodes_after, 6);
  EXPECT_EQ(report->passes[1].name, "dce");
  EXPECT_EQ(report->passes[1].nodes_after, 5);
  const std::string table = report->ToString();
  EXPECT_TRUE(testing::FileCheck(table, R"(
    CHECK: pipeline test
    CHECK: pass
    CHECK-NEXT: cse {{.*}} changed {{.*}} 7 -> 6
    CHECK-NEXT: dce {{.*}} changed {{.*}} 6 -> 5
  )").ok()) << table;
}

TEST(Pipeline, VerifiesAfterAChangedPassAndNamesIt) {
  std::unique_ptr<Module> m = Parse(kRedundant);
  Pipeline p;
  p.Add(std::make_unique<LambdaPass>("break-types", [](Module& m) -> absl::StatusOr<bool> {
    m.functions()[0]->FindNode("a")->set_type({DType::kF32, {5}});
    return true;
  }));
  absl::StatusOr<PipelineReport> report = p.Run(*m, TestOptions());
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::StartsWith(report.status().message(), "after break-types: ")) << report.status();
  EXPECT_NE(report.status().message().find("%a"), std::string::npos) << report.status();

  CompileOptions unchecked;
  unchecked.verify_each = false;
  EXPECT_TRUE(p.Run(*Parse(kRedundant), unchecked).ok());
}

TEST(Pipeline, CatchesAPassThatHidesItsChanges) {
  Pipeline p;
  p.Add(std::make_unique<LambdaPass>("lying-pass", [](Module& m) -> absl::StatusOr<bool> {
    m.functions()[0]->FindNode("dead")->set_scope("moved");
    return false;
  }));
  absl::StatusOr<PipelineReport> report = p.Run(*Parse(kRedundant), TestOptions());
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().message(), "lying-pass changed the module but reported no change");
  EXPECT_TRUE(p.Run(*Parse(kRedundant), CompileOptions{}).ok());  // the check is opt-in
}

TEST(Pipeline, APassErrorNamesThePass) {
  Pipeline p;
  p.Add(std::make_unique<LambdaPass>("failing", [](Module&) -> absl::StatusOr<bool> {
    return absl::InvalidArgumentError("no good");
  }));
  absl::StatusOr<PipelineReport> report = p.Run(*Parse(kRedundant), TestOptions());
  EXPECT_EQ(report.status(), absl::InvalidArgumentError("failing: no good"));
}

TEST(Pipeline, DumpsNumberedFilesThatReparse) {
  const std::string dir = TempDir("dumps");
  CompileOptions o = TestOptions();
  o.dump_dir = dir;
  std::unique_ptr<Module> m = Parse(kRedundant);
  absl::StatusOr<PipelineReport> report = BuildDefaultPipeline(o).Run(*m, o);
  ASSERT_TRUE(report.ok()) << report.status();
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path().filename());
  std::sort(files.begin(), files.end());
  // simplify runs canonicalize, cse, dce for two rounds (the second changes nothing), then
  // itself finishes, then the final dce, lower-gemm, gemm-bias-epilogue, elide-grad-zeroing,
  // narrow-activations-bf16, select-fp8-gemm, fuse-fp8-scale-update, fuse-residual-norm, merge-sibling-gemms, chunk-lm-head and expand-rope
  // (no gemms, norms, losses or ropes here: dumped unchanged), then fusion makes its fusion nodes, and rematerialize (nothing
  // to recompute here: dumped unchanged), then group-optimizer-updates (no optimizer here:
  // dumped unchanged).
  const std::vector<std::string> expected = {
      "000-input.kir",          "001-after-canonicalize.kir", "002-after-cse.kir",
      "003-after-dce.kir",      "004-after-canonicalize.kir", "005-after-cse.kir",
      "006-after-dce.kir",      "007-after-simplify.kir",     "008-after-dce.kir",
      "009-after-lower-gemm.kir", "010-after-gemm-bias-epilogue.kir", "011-after-elide-grad-zeroing.kir",
      "012-after-narrow-activations-bf16.kir", "013-after-select-fp8-gemm.kir", "014-after-fuse-fp8-scale-update.kir",
      "015-after-fuse-residual-norm.kir", "016-after-merge-sibling-gemms.kir", "017-after-chunk-lm-head.kir",
      "018-after-expand-rope.kir", "019-after-fuse-loops.kir", "020-after-fuse-cache-write.kir",
      "021-after-merge-cache-write-siblings.kir", "022-after-fuse-gemv-glu.kir", "023-after-rematerialize.kir",
      "024-after-group-optimizer-updates.kir"};
  EXPECT_EQ(files, expected);
  for (const std::string& file : files) {
    absl::StatusOr<std::string> text = ReadFileToString((std::filesystem::path(dir) / file).string());
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_TRUE(ParseModule(*text).ok()) << file;
  }
  EXPECT_EQ(*ReadFileToString(dir + "/000-input.kir"), PrintModule(*Parse(kRedundant)));
  EXPECT_EQ(*ReadFileToString(dir + "/019-after-fuse-loops.kir"), PrintModule(*m));
  EXPECT_NE(ReadFileToString(dir + "/019-after-fuse-loops.kir")->find("= fusion("), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Pipeline, DumpRegexSelectsPasses) {
  const std::string dir = TempDir("regex");
  CompileOptions o = TestOptions();
  o.dump_dir = dir;
  o.dump_regex = "^cse$";
  ASSERT_TRUE(RunDefaultPipeline(*Parse(kRedundant), o).ok());
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"000-input.kir", "002-after-cse.kir", "005-after-cse.kir"}));
  std::filesystem::remove_all(dir);

  o.dump_regex = "(";
  absl::StatusOr<PipelineReport> bad = RunDefaultPipeline(*Parse(kRedundant), o);
  EXPECT_NE(bad.status().message().find("dump regex '(' is not a valid regular expression"), std::string::npos)
      << bad.status();
}

TEST(Pipeline, DisabledPassesAreSkippedAndShown) {
  CompileOptions o = TestOptions();
  o.disabled_passes = {"cse"};
  std::unique_ptr<Module> m = Parse(kRedundant);
  absl::StatusOr<PipelineReport> report = RunDefaultPipeline(*m, o);
  ASSERT_TRUE(report.ok()) << report.status();
  const PassRecord* cse = FindRecord(*report, "cse");
  ASSERT_NE(cse, nullptr);
  EXPECT_EQ(cse->outcome, PassRecord::Outcome::kDisabled);
  // Without cse, both exps stay.
  EXPECT_TRUE(testing::FileCheck(PrintModule(*m), "CHECK: %a = exp\nCHECK: %b = exp").ok()) << PrintModule(*m);
  const std::string table = report->ToString();
  EXPECT_TRUE(testing::FileCheck(table, "CHECK: {{^  cse .*disabled}}").ok()) << table;
}

// A pass that is off by default (Pass::off_by_default) runs only where enabled_passes names
// it, is shown as off otherwise, and is marked in Describe; enabling an unknown pass or one
// that runs anyway is an error, and disabling wins over enabling.
class OffByDefaultPass : public LambdaPass {
 public:
  using LambdaPass::LambdaPass;
  bool off_by_default() const override { return true; }
};

TEST(Pipeline, AnOffByDefaultPassRunsOnlyWhenEnabled) {
  int runs = 0;
  Pipeline p("p");
  p.Add(std::make_unique<OffByDefaultPass>("trial", [&](Module&) -> absl::StatusOr<bool> {
     ++runs;
     return false;
   }))
      .Add(std::make_unique<DcePass>());
  EXPECT_EQ(p.Describe(), "trial [off by default], dce");

  std::unique_ptr<Module> m = Parse(kRedundant);
  absl::StatusOr<PipelineReport> off = p.Run(*m, TestOptions());
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(runs, 0);
  ASSERT_NE(FindRecord(*off, "trial"), nullptr);
  EXPECT_EQ(FindRecord(*off, "trial")->outcome, PassRecord::Outcome::kOff);
  EXPECT_TRUE(testing::FileCheck(off->ToString(), "CHECK: {{^trial .*off}}").ok()) << off->ToString();

  CompileOptions enabled = TestOptions();
  enabled.enabled_passes = {"trial"};
  absl::StatusOr<PipelineReport> on = p.Run(*m, enabled);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(FindRecord(*on, "trial")->outcome, PassRecord::Outcome::kUnchanged);

  enabled.disabled_passes = {"trial"};
  absl::StatusOr<PipelineReport> both = p.Run(*m, enabled);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(FindRecord(*both, "trial")->outcome, PassRecord::Outcome::kDisabled);

  CompileOptions typo = TestOptions();
  typo.enabled_passes = {"trail"};
  absl::StatusOr<PipelineReport> unknown = p.Run(*m, typo);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(), "cannot enable unknown pass 'trail'; pipeline p has: trial, dce");

  CompileOptions on_anyway = TestOptions();
  on_anyway.enabled_passes = {"dce"};
  absl::StatusOr<PipelineReport> already = p.Run(*m, on_anyway);
  ASSERT_FALSE(already.ok());
  EXPECT_EQ(already.status().message(), "cannot enable pass 'dce': it is not off by default (it runs unless disabled)");
}

TEST(Pipeline, DisablingAnUnknownPassListsTheKnownOnes) {
  CompileOptions o = TestOptions();
  o.disabled_passes = {"cse", "fusion-typo"};
  absl::StatusOr<PipelineReport> report = RunDefaultPipeline(*Parse(kRedundant), o);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().message(),
            "cannot disable unknown pass 'fusion-typo'; pipeline default has: simplify, canonicalize, cse, dce, "
            "lower-gemm, gemm-bias-epilogue, elide-grad-zeroing, narrow-activations-bf16, select-fp8-gemm, fuse-fp8-scale-update, fuse-residual-norm, "
            "merge-sibling-gemms, chunk-lm-head, expand-rope, fuse-loops, fuse-cache-write, "
            "merge-cache-write-siblings, fuse-gemv-glu, fuse-norm-between-gemvs, rematerialize, "
      "group-optimizer-updates");
}

TEST(Pipeline, ABadDumpRegexIsAnErrorInKilnsWordsEvenWithoutADumpFolder) {
  CompileOptions o = TestOptions();
  o.dump_regex = "(";
  absl::StatusOr<PipelineReport> bad = RunDefaultPipeline(*Parse(kRedundant), o);
  EXPECT_EQ(bad.status(),
            absl::InvalidArgumentError("dump regex '(' is not a valid regular expression: a '(' is not closed, or a ')' has no '('"));
  o.dump_regex = "a{2,1}";
  EXPECT_NE(RunDefaultPipeline(*Parse(kRedundant), o).status().message().find("not a valid regular expression: "),
            std::string::npos);
}

constexpr absl::string_view kTwoFunctions = R"(module @m
func @first {
  %x = parameter() {index=0} : f32[4]
  %dead = neg(%x) : f32[4]
  return %x
}
func @second {
  %x = parameter() {index=0} : f32[4]
  return %x
}
func @third {
  %x = parameter() {index=0} : f32[4]
  return %x
}
)";

// Visits functions through FunctionPass; fails on a function named `fail_on`.
class RecordingPass : public FunctionPass {
 public:
  explicit RecordingPass(std::string fail_on = "") : fail_on_(std::move(fail_on)) {}
  absl::string_view name() const override { return "recording"; }
  absl::StatusOr<bool> RunOnFunction(Function& f) override {
    visited_.push_back(f.name());
    if (f.name() == fail_on_) return absl::InvalidArgumentError("no good");
    return RemoveDeadNodes(f);
  }
  std::vector<std::string> visited_;
  int runs_started_ = 0;

 private:
  void StartRun() override {
    ++runs_started_;
    visited_.clear();
  }
  std::string fail_on_;
};

TEST(FunctionPass, VisitsEveryFunctionInOrderAndReportsAnyChange) {
  std::unique_ptr<Module> m = Parse(kTwoFunctions);
  RecordingPass pass;
  EXPECT_TRUE(pass.Run(*m).value_or(false));  // @first lost %dead
  EXPECT_EQ(pass.visited_, (std::vector<std::string>{"first", "second", "third"}));
  EXPECT_FALSE(pass.Run(*m).value_or(true));
  EXPECT_EQ(pass.visited_.size(), 3u);  // started afresh
  EXPECT_EQ(pass.runs_started_, 2);
}

TEST(FunctionPass, AnErrorStopsTheRunAndNamesTheFunctionAndThePass) {
  Pipeline p;
  auto failing = std::make_unique<RecordingPass>("second");
  RecordingPass* pass = failing.get();
  p.Add(std::move(failing));
  absl::StatusOr<PipelineReport> report = p.Run(*Parse(kTwoFunctions), TestOptions());
  EXPECT_EQ(report.status(), absl::InvalidArgumentError("recording: @second: no good"));
  EXPECT_EQ(pass->visited_, (std::vector<std::string>{"first", "second"}));
}

// A compile of several pipelines with a step between them, as passes/training_compile.h
// runs one: one numbering for all the dumps, one report per pipeline.
TEST(Pipeline, PipelinesOfOneCompileShareTheDumpNumbering) {
  const std::string dir = TempDir("shared");
  CompileOptions o = TestOptions();
  o.dump_dir = dir;
  Pipeline first("first");
  first.Add(std::make_unique<CsePass>());
  Pipeline second("second");
  second.Add(std::make_unique<CsePass>()).Add(std::make_unique<DcePass>());
  ASSERT_TRUE(CheckDisabledPasses(o, {&first, &second}).ok());
  absl::StatusOr<std::unique_ptr<PassRunner>> runner = PassRunner::Create(o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::unique_ptr<Module> m = Parse(kRedundant);
  ASSERT_TRUE((*runner)->DumpInput(*m).ok());
  absl::StatusOr<PipelineReport> first_report = first.Run(*m, **runner);
  ASSERT_TRUE(first_report.ok()) << first_report.status();
  ASSERT_TRUE((*runner)->DumpAfterStep(*m, "build-something").ok());
  absl::StatusOr<PipelineReport> second_report = second.Run(*m, **runner);
  ASSERT_TRUE(second_report.ok()) << second_report.status();

  EXPECT_EQ(first_report->pipeline, "first");
  ASSERT_EQ(first_report->passes.size(), 1u);
  EXPECT_EQ(second_report->pipeline, "second");
  ASSERT_EQ(second_report->passes.size(), 2u);
  EXPECT_EQ(second_report->passes[1].name, "dce");
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"000-input.kir", "001-after-cse.kir", "002-after-build-something.kir",
                                             "003-after-cse.kir", "004-after-dce.kir"}));
  std::filesystem::remove_all(dir);
}

TEST(Pipeline, ADisabledNameMustBeInSomePipelineOfTheCompile) {
  Pipeline first("first");
  first.Add(std::make_unique<CsePass>());
  Pipeline second("second");
  second.Add(std::make_unique<DcePass>());
  CompileOptions o;
  o.disabled_passes = {"dce", "cse"};  // each in one of them
  EXPECT_TRUE(CheckDisabledPasses(o, {&first, &second}).ok());
  o.disabled_passes = {"dce", "nope"};
  EXPECT_EQ(CheckDisabledPasses(o, {&first, &second}),
            absl::InvalidArgumentError(
                "cannot disable unknown pass 'nope'; pipeline first has: cse; pipeline second has: dce"));
}

// A pass that always changes the module: appends one more unused constant.
std::unique_ptr<Pass> NeverSettles() {
  return std::make_unique<LambdaPass>("never-settles", [](Module& m) -> absl::StatusOr<bool> {
    Function& f = *m.functions()[0];
    f.AppendNode(Opcode::kConstant, {}, AttrMap{{"value", 1.0}}, {DType::kF32, {}});
    return true;
  });
}

std::vector<std::unique_ptr<Pass>> Group(std::unique_ptr<Pass> a, std::unique_ptr<Pass> b) {
  std::vector<std::unique_ptr<Pass>> v;
  v.push_back(std::move(a));
  v.push_back(std::move(b));
  return v;
}

TEST(Pipeline, FixpointStopsAtItsCapWithANoteOrAnError) {
  Pipeline p;
  p.Add(std::make_unique<FixpointPass>("loop", Group(NeverSettles(), std::make_unique<DcePass>())));
  CompileOptions o = TestOptions();
  o.fixpoint_max_rounds = 3;
  std::unique_ptr<Module> m = Parse(kRedundant);
  absl::StatusOr<PipelineReport> report = p.Run(*m, o);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->notes.size(), 1u);
  EXPECT_EQ(report->notes[0], "loop still changed the module after 3 rounds (fixpoint_max_rounds); stopped there");
  ASSERT_EQ(report->passes.size(), 7u);  // the group, then 2 members x 3 rounds
  EXPECT_EQ(report->passes[0].name, "loop");
  EXPECT_EQ(report->passes[5].round, 3);
  EXPECT_EQ(report->passes[5].depth, 1);
  EXPECT_NE(report->ToString().find("note: loop still changed"), std::string::npos);

  o.fixpoint_cap_is_error = true;
  report = p.Run(*Parse(kRedundant), o);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(report.status().message().find("loop still changed the module after 3 rounds"), std::string::npos);
}

TEST(Pipeline, FixpointEndsWithTheFirstRoundThatChangesNothing) {
  Pipeline p;
  p.Add(std::make_unique<FixpointPass>("simplify", Group(std::make_unique<CsePass>(), std::make_unique<DcePass>())));
  absl::StatusOr<PipelineReport> report = p.Run(*Parse(kRedundant), TestOptions());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->passes.size(), 5u);
  EXPECT_EQ(report->passes[0].outcome, PassRecord::Outcome::kChanged);
  EXPECT_EQ(report->passes[3].round, 2);
  EXPECT_EQ(report->passes[3].outcome, PassRecord::Outcome::kUnchanged);
  EXPECT_EQ(report->passes[4].outcome, PassRecord::Outcome::kUnchanged);

  // Run standalone, outside a pipeline, it does the same work.
  FixpointPass alone("simplify", Group(std::make_unique<CsePass>(), std::make_unique<DcePass>()));
  std::unique_ptr<Module> m = Parse(kRedundant);
  EXPECT_TRUE(alone.Run(*m).value_or(false));
  EXPECT_FALSE(alone.Run(*m).value_or(true));
}

TEST(Pipeline, DefaultPipelineSimplifies) {
  std::unique_ptr<Module> m = Parse(kRedundant);
  ASSERT_TRUE(RunDefaultPipeline(*m, TestOptions()).ok());
  const std::string out = PrintModule(*m);
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK:      %x = parameter()
    CHECK-NEXT: %d = fusion(%x) {kind=loop} : f32[4] {
    CHECK-NEXT:   %x = parameter() {index=0} : f32[4]
    CHECK-NEXT:   %a = exp(%x)
    CHECK-NEXT:   %d = add(%a, %a)
    CHECK-NEXT:   return %d
    CHECK-NEXT: }
    CHECK-NEXT: return %d
  )").ok()) << out;
}

}  // namespace
}  // namespace kiln
