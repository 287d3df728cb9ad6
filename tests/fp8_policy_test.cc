// The FP8 policy (passes/fp8_policy.h), its three ops (ir/op_table.h: fp8_quantize,
// fp8_dequantize, fp8_scale_update, on the CPU reference backend) and select-fp8-gemm
// (passes/select_fp8_gemm.h): the step the policy builds, the gemms the pass makes, that
// the pass is exact against the policy (what `kiln check --training --precision fp8`
// proves), and that fp8 differs from bf16 where it should and nowhere else.
#include "passes/fp8_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/match.h"

#include "codegen/capabilities.h"
#include "codegen/compile_program.h"
#include "frontends/fp8_report.h"
#include "frontends/llama.h"
#include "frontends/weight_init.h"
#include "ir/builder.h"
#include "ir/fp8_scaling.h"
#include "ir/reference_backend.h"
#include "ir/verifier.h"
#include "passes/select_fp8_gemm.h"
#include "passes/training_compile.h"
#include "runtime/differential_check.h"

namespace kiln {
namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

Symbol Sym(DType t) { return Symbol{std::string(DTypeName(t))}; }

// fp8_quantize(x, state) then fp8_dequantize, in one function; returns (q, amax, scale_inv[, q_t], dq).
std::vector<HostTensor> Quantize(const std::vector<double>& x, std::vector<int64_t> dims, double exponent, DType format,
                                 bool transposed = false) {
  Module m;
  Function* f = m.AddFunction("main");
  Builder b(f);
  Node* xp = *b.Parameter("x", {DType::kF32, dims});
  Node* state = *b.Parameter("state", {DType::kF32, {4}});
  AttrMap attrs{{"out_dtype", Sym(format)}};
  if (transposed) attrs.Set("transposed", int64_t{1});
  std::vector<Node*> q = *b.MultiResultOp(Opcode::kFp8Quantize, {xp, state}, attrs);
  Node* dq = *b.Op(Opcode::kFp8Dequantize, {q[0], q[2]}, AttrMap{{"out_dtype", Sym(DType::kF32)}});
  std::vector<Node*> outs = q;
  outs.push_back(dq);
  EXPECT_TRUE(b.Return(outs).ok());
  EXPECT_TRUE(VerifyModule(m).ok()) << VerifyModule(m);
  absl::StatusOr<std::vector<HostTensor>> r = EvaluateFunction(
      *f, {HostTensor::FromValues({DType::kF32, dims}, x), HostTensor::FromValues({DType::kF32, {4}}, {exponent, 0, 0, 0})});
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

TEST(Fp8Ops, QuantizeRoundsTheScaledValueOnceAndSaturates) {
  // Scale 2^2: 0.3 * 4 = 1.2 rounds to e4m3's 1.25 (spacing 1/8 in [1, 2)); 200 * 4 = 800
  // saturates to 448; 1e-4 * 4 is below e4m3's smallest subnormal (2^-9) by half: 0.
  std::vector<HostTensor> r = Quantize({0.3, -200.0, 1e-4, 0.0}, {4}, 2.0, DType::kF8E4M3);
  EXPECT_EQ(r[0][0], 1.25);
  EXPECT_EQ(r[0][1], -448.0);
  EXPECT_EQ(r[0][2], 0.0);
  EXPECT_EQ(r[1][0], 200.0);   // amax of x, unscaled
  EXPECT_EQ(r[2][0], 0.25);    // scale_inv 2^-2
  EXPECT_EQ(r[3][0], 0.3125);  // dequantized: 1.25 / 4, on the grid of x's scaled format
  // e5m2 keeps range, not precision: 0.3 * 4 = 1.2 -> 1.25 (spacing 1/4), 800 -> 768.
  std::vector<HostTensor> e5 = Quantize({0.3, -200.0}, {2}, 2.0, DType::kF8E5M2);
  EXPECT_EQ(e5[0][0], 1.25);
  EXPECT_EQ(e5[0][1], -768.0);
}

TEST(Fp8Ops, QuantizeKeepsNanAndItsAmaxSaysSo) {
  std::vector<HostTensor> r = Quantize({1.0, kNaN, -3.0}, {3}, 0.0, DType::kF8E4M3);
  EXPECT_EQ(r[0][0], 1.0);
  EXPECT_TRUE(std::isnan(r[0][1]));
  EXPECT_TRUE(std::isnan(r[1][0]));  // an overflowed step: fp8_scale_update backs off
  // The exponent is floor(state[0]), clamped: 2.7 -> 2, 1000 -> 64.
  EXPECT_EQ(Quantize({1.0}, {1}, 2.7, DType::kF8E4M3)[2][0], 0.25);
  EXPECT_EQ(Quantize({1.0}, {1}, 1000.0, DType::kF8E4M3)[2][0], std::ldexp(1.0, -64));
}

TEST(Fp8Ops, TransposedCopyIsTheLastDimFirst) {
  // x [2, 2, 3] viewed as [4, 3]: q_t [3, 4], q_t[c, r] = q[r, c].
  std::vector<double> x;
  for (int i = 0; i < 12; ++i) x.push_back(i * 0.25);
  std::vector<HostTensor> r = Quantize(x, {2, 2, 3}, 0.0, DType::kF8E4M3, /*transposed=*/true);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[3].type(), (TensorType{DType::kF8E4M3, {3, 4}}));
  for (int row = 0; row < 4; ++row) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(r[3][c * 4 + row], r[0][row * 3 + c]) << row << "," << c;
  }
}

std::vector<double> Update(std::vector<double> state, double amax, DType format = DType::kF8E4M3, int margin = 0) {
  Fp8ScaleUpdate(state.data(), static_cast<int64_t>(state.size()), amax, format, margin);
  return state;
}

TEST(Fp8Ops, ScaleUpdateTakesTheLargestPowerOfTwoThatFitsTheHistory) {
  // [e, overflows, history (newest first)]
  EXPECT_EQ(Update({0, 0, 0, 0}, 1.0), (std::vector<double>{8, 0, 1, 0}));  // 256 <= 448 < 512
  EXPECT_EQ(Update({8, 0, 1, 0}, 3.5), (std::vector<double>{7, 0, 3.5, 1}));  // 3.5 * 128 = 448 exactly
  EXPECT_EQ(Update({7, 0, 3.5, 1}, 0.5), (std::vector<double>{7, 0, 0.5, 3.5}));  // 3.5 is still in the history
  EXPECT_EQ(Update({8, 0, 0.5, 3.5}, 0.5), (std::vector<double>{9, 0, 0.5, 0.5}));
  EXPECT_EQ(Update({0, 0, 0, 0}, 1.0, DType::kF8E5M2), (std::vector<double>{15, 0, 1, 0}));  // 32768 <= 57344
  EXPECT_EQ(Update({0, 0, 0, 0}, 1.0, DType::kF8E4M3, /*margin=*/2), (std::vector<double>{6, 0, 1, 0}));
  // Nothing seen yet (all zero): the scale stays.
  EXPECT_EQ(Update({3, 0, 0, 0}, 0.0), (std::vector<double>{3, 0, 0, 0}));
  // Clamped to 2^64 for a tiny amax.
  EXPECT_EQ(Update({0, 0, 0, 0}, 1e-30)[0], kFp8MaxExponent);
}

TEST(Fp8Ops, ScaleUpdateBacksOffAndCountsAnOverflow) {
  EXPECT_EQ(Update({8, 0, 1, 0.5}, kInf), (std::vector<double>{7, 1, 1, 0.5}));
  EXPECT_EQ(Update({7, 1, 1, 0.5}, kNaN), (std::vector<double>{6, 2, 1, 0.5}));
  EXPECT_EQ(Update({kFp8MinExponent, 0, 1, 0}, kInf)[0], kFp8MinExponent);
}

// llama-tiny's training step under a precision, built (policy applied) but not optimized.
struct Step {
  std::unique_ptr<Module> module;
  TrainingStepLayout layout;
  const Function* step = nullptr;
};

CompileOptions Options(Precision precision, std::string skip = "lm_head") {
  CompileOptions o;
  o.precision = precision;
  o.fp8.skip_regex = std::move(skip);
  o.capabilities = &CodegenCapabilities();
  o.target = *TargetForArch("sm_90a");
  return o;
}

Step BuildStep(const CompileOptions& options, int64_t accum = 1, bool optimize = false) {
  ModelConfig config = *PresetConfig("llama-tiny");
  Step s;
  s.module = *BuildLlamaModule(config, {.batch = 2, .seq_len = 16, .precision = options.precision});
  TrainingStepOptions step_options;
  step_options.accum_steps = accum;
  absl::StatusOr<TrainingCompile> compile = TrainingCompile::Create(step_options, options);
  EXPECT_TRUE(compile.ok()) << compile.status();
  EXPECT_TRUE(compile->BuildStep(*s.module).ok());
  if (optimize) EXPECT_TRUE(compile->RunMainPipeline(*s.module).ok());
  s.layout = compile->layout();
  s.step = s.module->FindFunction("train_step");
  return s;
}

int Count(const Function& f, Opcode op, const std::function<bool(const Node&)>& also = nullptr) {
  int n = 0;
  for (const auto& node : f.nodes()) n += node->opcode() == op && (also == nullptr || also(*node));
  return n;
}

TEST(Fp8Policy, QuantizesEveryLinearGemmOperandOnceWithItsFormat) {
  Step s = BuildStep(Options(Precision::kFp8));
  ASSERT_NE(s.step, nullptr);
  EXPECT_TRUE(VerifyFunction(*s.step).ok()) << VerifyFunction(*s.step);
  // Per layer: attention's input (shared by q, k, v), its four weights, the o projection's
  // input, and the four output gradients; the MLP's input (shared by gate and up), its three
  // weights, the down projection's input, and three gradients: 18, for 2 layers.
  EXPECT_EQ(s.layout.num_fp8_states(), 36);
  EXPECT_EQ(Count(*s.step, Opcode::kFp8Quantize), 36);
  EXPECT_EQ(Count(*s.step, Opcode::kFp8ScaleUpdate), 36);
  int weights = 0, gradients = 0;
  for (const Fp8Tensor& t : s.layout.fp8_tensors) {
    const bool is_weight = absl::StrContains(t.name, "_proj.weight");
    const bool is_gradient = absl::StrContains(t.name, ".grad.");
    EXPECT_FALSE(is_weight && is_gradient) << t.name;
    EXPECT_EQ(t.format, is_gradient ? DType::kF8E5M2 : DType::kF8E4M3) << t.name;
    EXPECT_EQ(t.scope.find("lm_head"), std::string::npos) << t.name;
    weights += is_weight;
    gradients += is_gradient;
  }
  EXPECT_EQ(weights, 2 * 7);
  EXPECT_EQ(gradients, 2 * 7);
  // The LM head's three GEMMs keep their bf16 operands; every other linear GEMM reads FP8.
  for (const auto& n : s.step->nodes()) {
    if (n->opcode() != Opcode::kDotGeneral || !n->attrs().GetInts("lhs_batch")->empty()) continue;
    const bool dequantized = n->operand(0)->opcode() == Opcode::kFp8Dequantize &&
                             n->operand(1)->opcode() == Opcode::kFp8Dequantize;
    EXPECT_EQ(dequantized, n->scope() != "lm_head") << n->name() << " @" << n->scope();
  }
  // The states: after lr, f32 [16 + 2], donated to their updates.
  const std::vector<Node*> params = s.step->parameters();
  ASSERT_EQ(static_cast<int64_t>(params.size()), s.layout.first_fp8_state() + 36);
  EXPECT_EQ(s.layout.first_fp8_state(), s.layout.lr_index() + 1);
  EXPECT_EQ(params[s.layout.first_fp8_state()]->type(), (TensorType{DType::kF32, {18}}));
  const std::vector<int64_t>& aliases = s.step->output_aliases();
  const int64_t first_output = 2 + 3 * s.layout.num_params;
  ASSERT_EQ(static_cast<int64_t>(aliases.size()), first_output + 36);
  for (int64_t i = 0; i < 36; ++i) {
    EXPECT_EQ(aliases[first_output + i], s.layout.first_fp8_state() + i);
    EXPECT_EQ(s.step->outputs()[first_output + i]->opcode(), Opcode::kFp8ScaleUpdate);
  }
}

TEST(Fp8Policy, MicroBatchesShareTheStatesAndTakeTheMaxAmax) {
  Step s = BuildStep(Options(Precision::kFp8), /*accum=*/2);
  EXPECT_TRUE(VerifyFunction(*s.step).ok()) << VerifyFunction(*s.step);
  EXPECT_EQ(s.layout.num_fp8_states(), 36);
  EXPECT_EQ(Count(*s.step, Opcode::kFp8Quantize), 72);
  EXPECT_EQ(Count(*s.step, Opcode::kFp8ScaleUpdate), 36);
  for (const auto& n : s.step->nodes()) {
    if (n->opcode() == Opcode::kFp8ScaleUpdate) EXPECT_EQ(n->operand(1)->opcode(), Opcode::kMax) << n->name();
  }
}

TEST(Fp8Policy, BadOptionsAreClearErrors) {
  EXPECT_FALSE(Fp8Policy::Create({.history_length = 0}).ok());
  EXPECT_FALSE(Fp8Policy::Create({.margin = -1}).ok());
  absl::StatusOr<std::unique_ptr<Fp8Policy>> bad = Fp8Policy::Create({.skip_regex = "lm_(head"});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "lm_(head")) << bad.status();
  CompileOptions o = Options(Precision::kFp8);
  o.fp8.history_length = -3;
  EXPECT_FALSE(TrainingCompile::Create({}, o).ok());
}

// Realistic inputs for the step (as kiln check draws them): non-negative second moments, a
// step count >= 1, a small learning rate; FP8 states random in [-1, 1) (exponent -1 or 0).
DifferentialCheckOptions StepCheck(const TrainingStepLayout& l) {
  DifferentialCheckOptions check;
  for (int64_t i = 0; i < l.num_params; ++i) check.ranges[l.first_v() + i] = {0.0, 1e-2};
  check.ranges[l.t_index()] = {1.0, 100.0};
  check.ranges[l.lr_index()] = {1e-4, 1e-2};
  return check;
}

TEST(SelectFp8Gemm, EveryPolicyGemmBecomesAnFp8GemmExactly) {
  const CompileOptions options = Options(Precision::kFp8);
  Step before = BuildStep(options);
  Step after = BuildStep(options, 1, /*optimize=*/true);
  const Function& f = *after.step;
  // 14 linear layers x (forward, input gradient, weight gradient); the LM head's 3 stay bf16.
  EXPECT_EQ(Count(f, Opcode::kGemm, [](const Node& n) { return n.attrs().Has("scaled"); }), 42);
  EXPECT_EQ(Count(f, Opcode::kFp8Dequantize), 0);
  for (const auto& n : f.nodes()) {
    if (n->opcode() != Opcode::kGemm || !n->attrs().Has("scaled")) continue;
    EXPECT_EQ(*n->attrs().GetSymbol("a_layout"), "mk") << n->name();  // Hopper's TN
    EXPECT_EQ(*n->attrs().GetSymbol("b_layout"), "nk") << n->name();
    EXPECT_TRUE(IsFp8(n->operand(0)->type().dtype) && IsFp8(n->operand(1)->type().dtype)) << n->name();
    EXPECT_FALSE(n->operand(0)->type().dtype == DType::kF8E5M2 && n->operand(1)->type().dtype == DType::kF8E5M2);
  }
  // The weight gradient reads the activation's and the gradient's transposed copies, the
  // input gradient the weight's: every quantize writes one.
  EXPECT_EQ(Count(f, Opcode::kFp8Quantize, [](const Node& n) { return n.attrs().Has("transposed"); }), 36);
  // Exact against the policy, as `kiln check` runs it (f32 in double on both sides: the
  // pipeline's other passes reorder f32 sums).
  DifferentialCheckOptions check = StepCheck(before.layout);
  check.reference.f32_as_f64 = true;
  check.abs_tolerance = check.rel_tolerance = 1e-9;
  absl::Status same = CheckMeaningPreserved(*before.step, f, check);
  EXPECT_TRUE(same.ok()) << same;
}

bool UpdatesState(const Node& n) { return n.attrs().Has("update_state"); }

// fuse-fp8-scale-update: with one micro-batch each state's update runs in its quantize's
// kernel, over the donated state: the compiled step launches one kernel per quantize and none
// for the updates, and copies no state at the finish (bf16's step copies as many values).
// The step stays exact against the policy (EveryPolicyGemmBecomesAnFp8GemmExactly checks the
// optimized step's next states too).
TEST(FuseFp8ScaleUpdate, EachQuantizeKernelUpdatesItsStateInPlace) {
  Step fp8 = BuildStep(Options(Precision::kFp8), 1, /*optimize=*/true);
  Step bf16 = BuildStep(Options(Precision::kBf16), 1, /*optimize=*/true);
  EXPECT_EQ(Count(*fp8.step, Opcode::kFp8ScaleUpdate), 0);
  EXPECT_EQ(Count(*fp8.step, Opcode::kFp8Quantize, UpdatesState), 36);
  const int64_t first_output = 2 + 3 * fp8.layout.num_params;
  for (int64_t i = 0; i < 36; ++i) {
    const Node* out = fp8.step->outputs()[first_output + i];
    ASSERT_EQ(out->opcode(), Opcode::kGetResult);
    EXPECT_EQ(out->operand(0)->opcode(), Opcode::kFp8Quantize);
    EXPECT_EQ(out->result_index(), out->operand(0)->num_results() - 1);
    EXPECT_EQ(out->operand(0)->operand(1), fp8.step->parameters()[fp8.layout.first_fp8_state() + i]);
  }
  const ProgramOptions codegen{.target = *TargetForArch("sm_90a")};
  absl::StatusOr<CompiledProgram> fp8_program = CompileProgram(*fp8.step, codegen);
  ASSERT_TRUE(fp8_program.ok()) << fp8_program.status();
  absl::StatusOr<CompiledProgram> bf16_program = CompileProgram(*bf16.step, codegen);
  ASSERT_TRUE(bf16_program.ok()) << bf16_program.status();
  auto count = [](const CompiledProgram& p, ProgramStep::Kind kind, Opcode op) {
    int64_t n = 0;
    for (const ProgramStep& s : p.steps) n += s.kind == kind && (op == Opcode::kParameter || s.node->opcode() == op);
    return n;
  };
  EXPECT_EQ(count(*fp8_program, ProgramStep::Kind::kKernel, Opcode::kFp8Quantize), 36);
  EXPECT_EQ(count(*fp8_program, ProgramStep::Kind::kKernel, Opcode::kFp8ScaleUpdate), 0);
  EXPECT_EQ(count(*fp8_program, ProgramStep::Kind::kCopy, Opcode::kParameter),
            count(*bf16_program, ProgramStep::Kind::kCopy, Opcode::kParameter));
  EXPECT_EQ(fp8_program->plan.in_place_outputs, bf16_program->plan.in_place_outputs + 36);
}

// The report's saturation line: a state whose newest amax is past the range its earlier
// history's scale gives (its largest values clipped, no overflow counted) is named, with how
// far past; a state whose newest amax fits, or that has no history yet, is not.
TEST(Fp8Report, NamesTheTensorsThatSaturatedAtTheLastStep) {
  Step s = BuildStep(Options(Precision::kFp8), 1, /*optimize=*/true);
  std::vector<HostTensor> states;
  for (int64_t i = 0; i < s.layout.num_fp8_states(); ++i) states.emplace_back(TensorType{DType::kF32, {18}});
  auto history = [](HostTensor& state, double newest, double before) {
    std::vector<double>& v = state.mutable_values();
    v[2] = newest;
    for (size_t j = 3; j < v.size(); ++j) v[j] = before;
  };
  ASSERT_EQ(s.layout.fp8_tensors[0].format, DType::kF8E4M3);
  history(states[0], 3.0, 1.0);  // e4m3: scale 2^8 from amax 1, 3 x 2^8 = 768 > 448: 1.71x
  history(states[1], 1.5, 1.0);  // 1.5 x 2^8 = 384: fits
  const std::string report = FormatFp8Report(*s.step, s.layout, {}, states);
  EXPECT_TRUE(absl::StrContains(report, absl::StrCat("saturated at the last step (amax past the scale's range, the "
                                                     "largest values clipped): 1; worst ",
                                                     s.layout.fp8_tensors[0].name, ", amax 1.71x the range")))
      << report;
  history(states[0], 1.0, 1.0);
  EXPECT_TRUE(absl::StrContains(FormatFp8Report(*s.step, s.layout, {}, states), "values clipped): 0\n"));
}

// Two micro-batches' quantizes share each state, whose update reads the max of their amaxes:
// the updates stay nodes of their own.
TEST(FuseFp8ScaleUpdate, MicroBatchesKeepTheirUpdateNodes) {
  Step s = BuildStep(Options(Precision::kFp8), /*accum=*/2, /*optimize=*/true);
  EXPECT_EQ(Count(*s.step, Opcode::kFp8ScaleUpdate), 36);
  EXPECT_EQ(Count(*s.step, Opcode::kFp8Quantize, UpdatesState), 0);
}

// --fp8-grad-format e4m3: every tensor e4m3, and cuBLASLt's e4m3 x e4m3 takes every GEMM.
TEST(SelectFp8Gemm, E4m3GradientsAreFp8GemmsToo) {
  CompileOptions options = Options(Precision::kFp8);
  options.fp8.gradient_format = DType::kF8E4M3;
  Step s = BuildStep(options, 1, /*optimize=*/true);
  for (const Fp8Tensor& t : s.layout.fp8_tensors) EXPECT_EQ(t.format, DType::kF8E4M3) << t.name;
  EXPECT_EQ(Count(*s.step, Opcode::kGemm, [](const Node& n) { return n.attrs().Has("scaled"); }), 42);
  options.fp8.gradient_format = DType::kBF16;
  EXPECT_FALSE(TrainingCompile::Create({}, options).ok());
}

TEST(SelectFp8Gemm, WithoutFp8TensorCoresTheDequantizedGemmsStayAndSayWhy) {
  Step s = BuildStep(Options(Precision::kFp8));
  SelectFp8GemmPass pass(&CodegenCapabilities(), *TargetForArch("sm_80"));
  // The policy's dot_generals must be gemms first.
  CompileOptions o = Options(Precision::kFp8);
  o.target = *TargetForArch("sm_80");
  Step lowered = BuildStep(o, 1, /*optimize=*/true);
  EXPECT_EQ(Count(*lowered.step, Opcode::kGemm, [](const Node& n) { return n.attrs().Has("scaled"); }), 0);
  EXPECT_GT(Count(*lowered.step, Opcode::kFp8Dequantize), 0);
  absl::StatusOr<bool> changed = pass.Run(*lowered.module);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  ASSERT_FALSE(pass.last_decisions().empty());
  EXPECT_TRUE(absl::StrContains(pass.last_decisions()[0], "no FP8 tensor cores")) << pass.last_decisions()[0];
  DifferentialCheckOptions check = StepCheck(s.layout);
  check.reference.f32_as_f64 = true;
  check.abs_tolerance = check.rel_tolerance = 1e-9;
  absl::Status same = CheckMeaningPreserved(*s.step, *lowered.step, check);
  EXPECT_TRUE(same.ok()) << same;
}

// fp8 against bf16 from the same inputs: skipping every scope is bf16 bit for bit; the
// policy moves the loss by FP8's rounding (a few 1e-3 relative at llama-tiny's init) and
// leaves the step's structure (parameter updates) otherwise the same.
TEST(Fp8Policy, DiffersFromBf16WhereItShould) {
  Step bf16 = BuildStep(Options(Precision::kBf16));
  Step none = BuildStep(Options(Precision::kFp8, /*skip=*/".*"));
  Step fp8 = BuildStep(Options(Precision::kFp8));
  EXPECT_EQ(none.layout.num_fp8_states(), 0);
  // A first training step as `kiln train` runs it: initialized weights (random [-1, 1)
  // weights would saturate the softmaxes, where any rounding moves the gradient by its own
  // size), zero moments, random tokens.
  DifferentialCheckOptions check = StepCheck(bf16.layout);
  check.ranges[bf16.layout.first_batch_input()] = check.ranges[bf16.layout.first_batch_input() + 1] = {0, 256};
  std::vector<HostTensor> inputs = RandomInputs(*bf16.step, check);
  std::vector<HostTensor> weights = InitLlamaWeights(*PresetConfig("llama-tiny"), 1);
  for (int64_t i = 0; i < bf16.layout.num_params; ++i) {
    inputs[bf16.layout.first_param() + i] = weights[i];
    inputs[bf16.layout.first_m() + i] = HostTensor(weights[i].type());
    inputs[bf16.layout.first_v() + i] = HostTensor(weights[i].type());
  }
  inputs[bf16.layout.t_index()] = HostTensor::FromValues({DType::kF32, {}}, {0.0});
  absl::StatusOr<std::vector<HostTensor>> b = EvaluateFunction(*bf16.step, inputs);
  absl::StatusOr<std::vector<HostTensor>> n = EvaluateFunction(*none.step, inputs);
  ASSERT_TRUE(b.ok() && n.ok());
  for (size_t i = 0; i < b->size(); ++i) EXPECT_EQ((*b)[i].values(), (*n)[i].values()) << "output " << i;
  // The FP8 step takes the states too: zero, the first step's.
  std::vector<HostTensor> fp8_inputs = inputs;
  const std::vector<Node*> params = fp8.step->parameters();
  for (int64_t i = 0; i < fp8.layout.num_fp8_states(); ++i) {
    fp8_inputs.emplace_back(params[fp8.layout.first_fp8_state() + i]->type());
  }
  absl::StatusOr<std::vector<HostTensor>> q = EvaluateFunction(*fp8.step, fp8_inputs);
  ASSERT_TRUE(q.ok()) << q.status();
  // The first step quantizes with scale 1 (no history yet, as Transformer Engine's first
  // step does), which flushes gradients below e5m2's 2^-16 to zero. Once the states hold an
  // amax, the scales fit the tensors: the same step again with the states it returned.
  std::vector<HostTensor> first_states;
  for (int64_t i = 0; i < fp8.layout.num_fp8_states(); ++i) {
    fp8_inputs[fp8.layout.first_fp8_state() + i] = (*q)[2 + 3 * fp8.layout.num_params + i];
  }
  q = EvaluateFunction(*fp8.step, fp8_inputs);
  ASSERT_TRUE(q.ok()) << q.status();
  const double loss_bf16 = (*b)[0][0], loss_fp8 = (*q)[0][0];
  EXPECT_NE(loss_bf16, loss_fp8);
  EXPECT_LT(std::fabs(loss_fp8 - loss_bf16) / std::fabs(loss_bf16), 2e-2) << loss_bf16 << " vs " << loss_fp8;
  // The gradients differ by FP8's rounding: each first moment m' = b1 m + (1 - b1) c g (c the
  // clipping factor), so m' - b1 m is the scaled gradient. Over all parameters its relative
  // error is a few percent, not zero and not more.
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < bf16.layout.num_params; ++i) {
    const HostTensor& m = inputs[bf16.layout.first_m() + i];
    const HostTensor& mb = (*b)[1 + bf16.layout.num_params + i];
    const HostTensor& mq = (*q)[1 + bf16.layout.num_params + i];
    for (int64_t j = 0; j < m.num_elements(); ++j) {
      const double gb = mb[j] - 0.9 * m[j], gq = mq[j] - 0.9 * m[j];
      diff += (gq - gb) * (gq - gb);
      norm += gb * gb;
    }
  }
  const double rel = std::sqrt(diff / norm);
  std::printf("fp8 against bf16: loss %.6f vs %.6f, gradient relative error %.4f\n", loss_fp8, loss_bf16, rel);
  EXPECT_GT(rel, 1e-4);
  EXPECT_LT(rel, 0.15);
  // The states' updates: a history of the step's finite amax (twice: the same inputs) and
  // an exponent that fits it.
  for (int64_t i = 0; i < fp8.layout.num_fp8_states(); ++i) {
    const HostTensor& state = (*q)[2 + 3 * fp8.layout.num_params + i];
    const double amax = std::max(state[kFp8StateHeader], state[kFp8StateHeader + 1]);
    ASSERT_TRUE(std::isfinite(amax) && amax > 0) << fp8.layout.fp8_tensors[i].name;
    const DType format = fp8.layout.fp8_tensors[i].format;
    EXPECT_LE(std::ldexp(amax, static_cast<int>(state[0])), Fp8MaxFinite(format));
    EXPECT_GT(std::ldexp(amax, static_cast<int>(state[0]) + 1), Fp8MaxFinite(format));
    EXPECT_EQ(state[1], 0);  // no overflow
  }
}

}  // namespace
}  // namespace kiln
