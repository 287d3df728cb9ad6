// The numbers autodiff produces (passes/autodiff.h): for every differentiable op, a small
// function using it is differentiated, and the gradient (run by the CPU reference backend
// in double precision) is compared with float64 central finite differences of the same
// function. Then the whole llama-tiny loss, for sampled entries of every weight.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "frontends/gpt2.h"
#include "frontends/llama.h"
#include "ir/builder.h"
#include "ir/status_macros.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#include "passes/autodiff.h"
#include "passes/training_step.h"
#include "tests/testing/all_ops.h"
#include "ir/reference_backend.h"

namespace kiln {
namespace {

// A power of two, so that x +- h is exact for the inputs below (multiples of h, |x| < 4):
// the finite difference then sees exactly the step it divides by.
constexpr double kStep = 1.0 / (1 << 20);
constexpr double kRelativeTolerance = 1e-6;
// Gradients smaller than this are compared absolutely (to 1e-8): below it, the rounding of a
// loss of order 1 in double, divided by the step, is a visible part of the difference.
constexpr double kGradientFloor = 1e-2;
const ReferenceOptions kFloat64{.f32_as_f64 = true};

struct ParamSpec {
  TensorType type;
  double lo = -1.0, hi = 1.0;     // uniform range (integers: [ceil(lo), ceil(hi) - 1])
  bool away_from_zero = false;    // floats: magnitude in [0.25, 1.25), random sign
};

struct FdCase {
  std::string name;
  std::vector<ParamSpec> params;
  // Builds the output from the parameters; the loss is sum(output * fixed random weights).
  std::function<absl::StatusOr<Node*>(Builder&, const std::vector<Node*>&)> body;
};

// Names the case in gtest's failure messages (instead of a byte dump).
void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

double Quantize(double x) { return std::round(x / kStep) * kStep; }

HostTensor RandomArgument(const ParamSpec& spec, uint64_t seed) {
  HostTensor t = HostTensor::Random(spec.type, seed, spec.lo, spec.hi);
  if (!IsFloat(spec.type.dtype)) return t;
  for (double& v : t.mutable_values()) {
    if (spec.away_from_zero) v = (v < 0 ? -1 : 1) * (0.25 + std::fabs(v));
    v = Quantize(v);
  }
  return t;
}

// @forward(params) -> sum(body(params) * weights), in a module of its own.
absl::StatusOr<std::unique_ptr<Module>> BuildForward(const FdCase& c) {
  auto m = std::make_unique<Module>(c.name);
  Builder b(m->AddFunction("forward"));
  std::vector<Node*> params;
  for (size_t i = 0; i < c.params.size(); ++i) {
    absl::StatusOr<Node*> p = b.Parameter(absl::StrCat("p", i), c.params[i].type);
    if (!p.ok()) return p.status();
    params.push_back(*p);
  }
  absl::StatusOr<Node*> out = c.body(b, params);
  if (!out.ok()) return out.status();
  const HostTensor weights = HostTensor::Random((*out)->type(), /*seed=*/99);
  absl::StatusOr<Node*> w = b.ConstantValues(weights.values(), (*out)->type());
  if (!w.ok()) return w.status();
  absl::StatusOr<Node*> weighted = b.Mul(*out, *w);
  if (!weighted.ok()) return weighted.status();
  std::vector<int64_t> all_dims((*out)->type().rank());
  for (size_t d = 0; d < all_dims.size(); ++d) all_dims[d] = static_cast<int64_t>(d);
  absl::StatusOr<Node*> loss = b.ReduceSum(*weighted, all_dims);
  if (!loss.ok()) return loss.status();
  absl::Status st = b.Return({*loss});
  if (!st.ok()) return st;
  return m;
}

absl::StatusOr<double> Loss(const Function& forward, const std::vector<HostTensor>& args) {
  absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(forward, args, kFloat64);
  if (!out.ok()) return out.status();
  return (*out)[0][0];
}

// Checks the gradient of output `loss_output` of `forward` with respect to the parameters in
// `wrt` at `args`, at the flat element indices `sample(p)` of each (all when empty).
void ExpectGradientsMatchFiniteDifferences(Module& m, const Function& forward, const std::vector<int64_t>& wrt,
                                           std::vector<HostTensor> args,
                                           const std::function<std::vector<int64_t>(int64_t)>& sample) {
  absl::StatusOr<Function*> grad_fn = BuildGradientFunction(m, forward, 0, wrt, "gradient");
  ASSERT_TRUE(grad_fn.ok()) << grad_fn.status();
  ASSERT_TRUE(VerifyModule(m).ok()) << VerifyModule(m) << "\n" << PrintModule(m);
  absl::StatusOr<std::vector<HostTensor>> grads = EvaluateFunction(**grad_fn, args, kFloat64);
  ASSERT_TRUE(grads.ok()) << grads.status();
  for (size_t k = 0; k < wrt.size(); ++k) {
    const int64_t p = wrt[k];
    const HostTensor& grad = (*grads)[1 + k];
    ASSERT_EQ(grad.type(), args[p].type());
    for (int64_t i : sample(p)) {
      const double x = args[p][i];
      args[p].mutable_values()[i] = x + kStep;
      absl::StatusOr<double> up = Loss(forward, args);
      args[p].mutable_values()[i] = x - kStep;
      absl::StatusOr<double> down = Loss(forward, args);
      args[p].mutable_values()[i] = x;
      ASSERT_TRUE(up.ok() && down.ok()) << up.status() << down.status();
      const double finite_difference = (*up - *down) / (2 * kStep);
      EXPECT_NEAR(grad[i], finite_difference, kRelativeTolerance * std::max(kGradientFloor, std::fabs(finite_difference)))
          << "parameter " << p << " (" << forward.parameters()[p]->name() << ") element " << i;
    }
  }
}

TensorType F32(std::vector<int64_t> dims) { return {DType::kF32, std::move(dims)}; }
TensorType I32(std::vector<int64_t> dims) { return {DType::kI32, std::move(dims)}; }

const std::vector<int64_t> kShape = {2, 3, 4};

FdCase Unary(Opcode op, double lo = -1, double hi = 1, bool away_from_zero = false) {
  return {std::string(OpName(op)), {{F32(kShape), lo, hi, away_from_zero}},
          [op](Builder& b, const std::vector<Node*>& p) { return b.Unary(op, p[0]); }};
}

FdCase Binary(Opcode op, double b_lo = -1, double b_hi = 1) {
  return {std::string(OpName(op)), {{F32(kShape)}, {F32(kShape), b_lo, b_hi}},
          [op](Builder& b, const std::vector<Node*>& p) { return b.Binary(op, p[0], p[1]); }};
}

// One function per op family; the op table test below checks that together they use
// every op of the table.
std::vector<FdCase> AllCases() {
  using P = const std::vector<Node*>&;
  return {
      Unary(Opcode::kNeg),
      Unary(Opcode::kAbs, -1, 1, /*away_from_zero=*/true),
      Unary(Opcode::kExp),
      Unary(Opcode::kLog, 0.5, 2),
      Unary(Opcode::kSqrt, 0.5, 2),
      Unary(Opcode::kRsqrt, 0.5, 2),
      Unary(Opcode::kTanh),
      Unary(Opcode::kSigmoid),
      Unary(Opcode::kGelu, -3, 3),
      Binary(Opcode::kAdd),
      Binary(Opcode::kSub),
      Binary(Opcode::kMul),
      Binary(Opcode::kDiv, 0.5, 2),
      Binary(Opcode::kMax),
      Binary(Opcode::kMin),
      {"select_compare_iota",
       {{F32(kShape)}, {F32(kShape)}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // Where x < iota/4 take x * iota/4, else y: iota and compare carry no gradient.
         ASSIGN_OR_RETURN(Node * ramp, b.Iota(F32(kShape), 2));
         ASSIGN_OR_RETURN(Node * quarter, b.Constant(0.25, F32(kShape)));
         ASSIGN_OR_RETURN(Node * threshold, b.Mul(ramp, quarter));
         ASSIGN_OR_RETURN(Node * below, b.Compare(p[0], threshold, "lt"));
         ASSIGN_OR_RETURN(Node * scaled, b.Mul(p[0], threshold));
         return b.Select(below, scaled, p[1]);
       }},
      {"convert_f32_to_f32",  // the only float convert that does not round; structure in autodiff_test
       {{F32(kShape)}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         const TensorType t = F32(kShape);
         ASSIGN_OR_RETURN(Node * e, b.Unary(Opcode::kExp, p[0]));
         return b.Op(Opcode::kConvert, {e}, {}, &t);
       }},
      {"broadcast_expands_size_one_and_adds_dims",
       {{F32({3, 1})}},
       [](Builder& b, P p) { return b.Broadcast(p[0], {1, 2}, kShape); }},
      {"reshape", {{F32(kShape)}}, [](Builder& b, P p) { return b.Reshape(p[0], {6, 4}); }},
      {"transpose", {{F32(kShape)}}, [](Builder& b, P p) { return b.Transpose(p[0], {2, 0, 1}); }},
      {"slice_with_stride_that_ends_inside",
       {{F32({2, 3, 7})}},
       [](Builder& b, P p) { return b.Slice(p[0], {0, 1, 1}, {2, 3, 7}, {1, 1, 3}); }},
      {"slice_with_stride_that_runs_past_the_end",
       {{F32({3, 5})}},
       [](Builder& b, P p) { return b.Slice(p[0], {1, 0}, {3, 5}, {1, 2}); }},
      {"concatenate",
       {{F32(kShape)}, {F32({2, 2, 4})}},
       [](Builder& b, P p) { return b.Concatenate({p[0], p[1], p[0]}, 1); }},
      {"reduce_sum", {{F32(kShape)}}, [](Builder& b, P p) { return b.ReduceSum(p[0], {0, 2}); }},
      {"reduce_max", {{F32(kShape)}}, [](Builder& b, P p) { return b.ReduceMax(p[0], {1}); }},
      {"dot_general_matmul",
       {{F32({3, 4})}, {F32({4, 5})}},
       [](Builder& b, P p) { return b.DotGeneral(p[0], p[1], {{}, {}, {1}, {0}}); }},
      {"dot_general_batched_transposed_rhs",
       {{F32(kShape)}, {F32({2, 5, 4})}},
       [](Builder& b, P p) { return b.DotGeneral(p[0], p[1], {{0}, {0}, {2}, {2}}); }},
      {"dot_general_scattered_dims",  // batch and contracting dims in odd places on both sides
       {{F32({4, 2, 3, 2})}, {F32({3, 5, 2, 2})}},
       [](Builder& b, P p) { return b.DotGeneral(p[0], p[1], {{1}, {2}, {2, 3}, {0, 3}}); }},
      {"gather",
       {{F32({5, 4})}, {I32({2, 3}), 0, 5}},
       [](Builder& b, P p) { return b.Gather(p[0], p[1]); }},
      {"scatter_add",
       {{I32({2, 3}), 0, 5}, {F32(kShape)}},
       [](Builder& b, P p) { return b.ScatterAdd(p[0], p[1], F32({5, 4})); }},
      {"rms_norm", {{F32(kShape)}, {F32({4})}}, [](Builder& b, P p) { return b.RmsNorm(p[0], p[1], 1e-5); }},
      {"rms_norm_grad_input",
       {{F32(kShape)}, {F32({4})}, {F32(kShape)}},
       [](Builder& b, P p) { return b.Op(Opcode::kRmsNormGradInput, {p[0], p[1], p[2]}, AttrMap{{"eps", 1e-5}}); }},
      {"rms_norm_grad_weight",
       {{F32(kShape)}, {F32({4})}, {F32(kShape)}},
       [](Builder& b, P p) { return b.Op(Opcode::kRmsNormGradWeight, {p[0], p[1], p[2]}, AttrMap{{"eps", 1e-5}}); }},
      {"layer_norm",
       {{F32(kShape)}, {F32({4})}, {F32({4})}},
       [](Builder& b, P p) { return b.LayerNorm(p[0], p[1], p[2], 1e-5); }},
      {"layer_norm_of_a_product",  // longer rows, and an input that is itself differentiated
       {{F32({3, 8})}, {F32({8})}, {F32({8})}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         ASSIGN_OR_RETURN(Node * y, b.Mul(p[0], p[0]));
         return b.LayerNorm(y, p[1], p[2], 1e-5);
       }},
      {"softmax", {{F32(kShape)}}, [](Builder& b, P p) { return b.Softmax(p[0]); }},
      {"softmax_grad",
       {{F32(kShape)}, {F32(kShape)}},
       [](Builder& b, P p) { return b.Op(Opcode::kSoftmaxGrad, {p[0], p[1]}); }},
      {"cross_entropy",
       {{F32({6, 5})}, {I32({6}), 0, 5}},
       [](Builder& b, P p) { return b.CrossEntropy(p[0], p[1]); }},
      {"cross_entropy_padded",
       {{F32({6, 5})}, {I32({6}), 0, 3}},
       [](Builder& b, P p) { return b.CrossEntropy(p[0], p[1], /*classes=*/3); }},
      {"cross_entropy_lse",  // the log-sum-exp result (a z-loss would use it), padded
       {{F32({6, 5})}, {I32({6}), 0, 3}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         ASSIGN_OR_RETURN(Node * loss, b.CrossEntropy(p[0], p[1], /*classes=*/3));
         return loss->operand(0)->result(1);
       }},
      {"cross_entropy_grad",  // lse an operand of its own
       {{F32({6, 5})}, {I32({6}), 0, 5}, {F32({6})}, {F32({6})}},
       [](Builder& b, P p) { return b.CrossEntropyGrad(p[0], p[1], p[2], p[3]); }},
      {"cross_entropy_grad_padded",
       {{F32({6, 5})}, {I32({6}), 0, 3}, {F32({6})}, {F32({6})}},
       [](Builder& b, P p) { return b.CrossEntropyGrad(p[0], p[1], p[2], p[3], /*classes=*/3); }},
      {"cross_entropy_grad_of_its_loss",  // the second derivative, through cross_entropy's lse
       {{F32({6, 5})}, {I32({6}), 0, 3}, {F32({6})}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         ASSIGN_OR_RETURN(Node * loss, b.CrossEntropy(p[0], p[1], /*classes=*/3));
         return b.CrossEntropyGrad(p[0], p[1], p[2], loss->operand(0)->result(1), /*classes=*/3);
       }},
      {"rope",
       {{F32({2, 3, 2, 4})}, {I32({3}), 0, 50}},
       [](Builder& b, P p) { return b.Rope(p[0], p[1], 10000.0); }},
      {"rope_inverse",
       {{F32({2, 3, 2, 4})}, {I32({3}), 0, 50}},
       [](Builder& b, P p) { return b.Rope(p[0], p[1], 10000.0, /*inverse=*/true); }},
      {"rope_table_scaling",  // expand-rope's table has no operand to differentiate (positions are
                              // integers); x times its broadcast covers it
       {{F32({2, 3, 2, 4})}, {I32({3}), 0, 50}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         ASSIGN_OR_RETURN(Node * table, b.Op(Opcode::kRopeTable, {p[1]},
                                             AttrMap{{"theta", 10000.0}, {"head_dim", int64_t{4}}, {"inverse", int64_t{0}}}));
         ASSIGN_OR_RETURN(Node * wide, b.Broadcast(table, {1, 3}, {2, 3, 2, 4}));
         return b.Mul(p[0], wide);
       }},
      {"adamw_update_feeding_compare",
       {{F32(kShape)}, {F32(kShape)}, {F32(kShape)}, {F32(kShape), 0.25, 1}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // Where the AdamW step lowers p take g, else m. adamw_update is non-differentiable
         // (an optimizer step is applied to gradients, never differentiated); like compare it
         // is covered by a use whose result carries no gradient.
         ASSIGN_OR_RETURN(Node * step_size, b.Constant(0.1, F32({})));
         ASSIGN_OR_RETURN(Node * decay, b.Constant(0.9, F32({})));
         ASSIGN_OR_RETURN(Node * sqrt_bc2, b.Constant(0.5, F32({})));
         ASSIGN_OR_RETURN(std::vector<Node*> updated,
                          b.MultiResultOp(Opcode::kAdamWUpdate, {p[0], p[1], p[2], p[3], step_size, decay, sqrt_bc2, sqrt_bc2},
                                          AttrMap{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}}));
         Node* p_new = updated[0];
         ASSIGN_OR_RETURN(Node * lowered, b.Compare(p_new, p[0], "lt"));
         return b.Select(lowered, p[1], p[2]);
       }},
      {"sum_of_squares_feeding_compare",
       {{F32(kShape)}, {F32(kShape)}, {F32(kShape), 0, 4}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // sum_of_squares (the global gradient norm's square) is not differentiable; like
         // adamw_update it is covered by a use whose result carries no gradient.
         ASSIGN_OR_RETURN(Node * squares, b.Op(Opcode::kSumOfSquares, {p[0], p[1]}));
         ASSIGN_OR_RETURN(Node * wide, b.BroadcastScalar(squares, kShape));
         ASSIGN_OR_RETURN(Node * above, b.Compare(wide, p[2], "gt"));
         return b.Select(above, p[0], p[1]);
       }},
      {"fp8_scaling_feeding_compare",
       {{F32(kShape), 0.25, 1}, {F32(kShape), -4, -2}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // The FP8 ops are not differentiable (the FP8 policy adds them after autodiff); like
         // compare they are covered by a use whose result carries no gradient: x quantized,
         // dequantized and shifted by the next state's sum (about 10, as the amax of x in
         // [0.25, 1) gives the exponent 8 or 9), always above p1.
         ASSIGN_OR_RETURN(Node * state, b.ConstantValues({0.5, 0, 1, 2}, F32({4})));
         ASSIGN_OR_RETURN(std::vector<Node*> q, b.MultiResultOp(Opcode::kFp8Quantize, {p[0], state},
                                                                AttrMap{{"out_dtype", Symbol{"f8e4m3"}}}));
         ASSIGN_OR_RETURN(Node * dq, b.Op(Opcode::kFp8Dequantize, {q[0], q[2]}, AttrMap{{"out_dtype", Symbol{"f32"}}}));
         ASSIGN_OR_RETURN(Node * next, b.Op(Opcode::kFp8ScaleUpdate, {state, q[1]},
                                            AttrMap{{"fp8_format", Symbol{"f8e4m3"}}, {"margin", int64_t{0}}}));
         ASSIGN_OR_RETURN(Node * total, b.ReduceSum(next, {0}));
         ASSIGN_OR_RETURN(Node * wide, b.BroadcastScalar(total, kShape));
         ASSIGN_OR_RETURN(Node * shifted, b.Add(dq, wide));
         ASSIGN_OR_RETURN(Node * above, b.Compare(shifted, p[1], "gt"));
         return b.Select(above, p[0], p[1]);
       }},
      {"gemm_feeding_compare",
       {{F32({4, 3})}, {F32({5, 3})}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // gemm is the backend form lower-gemm makes after autodiff (its rule says to
         // differentiate the dot_general); like compare it is covered by a use whose result
         // carries no gradient.
         const TensorType out = F32({4, 5});
         ASSIGN_OR_RETURN(Node * d, b.Op(Opcode::kGemm, {p[0], p[1]},
                                         AttrMap{{"batch", int64_t{1}}, {"m", int64_t{4}}, {"n", int64_t{5}},
                                                 {"k", int64_t{3}}, {"a_layout", Symbol{"mk"}},
                                                 {"b_layout", Symbol{"nk"}}, {"alpha", 1.0}, {"beta", 0.0},
                                                 {"epilogue", Symbol{"none"}}},
                                         &out));
         ASSIGN_OR_RETURN(Node * zero, b.Constant(0.0, out));
         ASSIGN_OR_RETURN(Node * positive, b.Compare(d, zero, "gt"));
         ASSIGN_OR_RETURN(Node * ones, b.Constant(1.0, out));
         return b.Select(positive, ones, zero);
       }},
      {"fused_residual_norms_feeding_compare",
       {{F32({3, 8})}, {F32({3, 8})}, {F32({8})}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // fuse-residual-norm makes these from the finished training step (their rule says to
         // differentiate the add and the norm); like gemm they are covered by a use whose
         // result carries no gradient.
         const AttrMap eps{{"eps", 1e-5}};
         ASSIGN_OR_RETURN(std::vector<Node*> rms, b.MultiResultOp(Opcode::kAddRmsNorm, {p[0], p[1], p[2]}, eps));
         ASSIGN_OR_RETURN(std::vector<Node*> ln,
                          b.MultiResultOp(Opcode::kAddLayerNorm, {rms[0], rms[1], p[2], p[2]}, eps));
         ASSIGN_OR_RETURN(Node * dx, b.Op(Opcode::kAddRmsNormGradInput, {ln[0], ln[1], p[2], p[0]}, eps));
         // And layer_norm's fused backward (its values are checked against finite differences
         // in tests/reference_backend_test.cc, LayerNormGradInputMatchesFiniteDifferences).
         ASSIGN_OR_RETURN(Node * lx, b.Op(Opcode::kLayerNormGradInput, {dx, p[2], p[0]}, eps));
         ASSIGN_OR_RETURN(dx, b.Op(Opcode::kAddLayerNormGradInput, {lx, dx, p[2], p[1]}, eps));
         ASSIGN_OR_RETURN(Node * positive, b.Compare(dx, p[1], "lt"));
         return b.Select(positive, p[0], p[1]);
       }},
      {"attention_family_feeding_compare",
       {{F32({1, 2, 4, 4})}, {F32({1, 2, 4, 4})}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // attention's inputs are bf16 and its definition rounds P and dS to bf16, so a finite
         // difference cannot see its gradient; tests/select_flash_attention_test.cc checks its
         // VJP against the decomposed attention's instead. Here, like adamw_update, the family
         // is covered by a use whose result carries no gradient.
         ASSIGN_OR_RETURN(Node * q, b.Convert(p[0], DType::kBF16));
         ASSIGN_OR_RETURN(std::vector<Node*> attention,
                          b.MultiResultOp(Opcode::kAttention, {q, q, q}, AttrMap{{"scale", 0.5}}));
         Node* o = attention[0];
         ASSIGN_OR_RETURN(Node * delta, b.Op(Opcode::kAttentionDelta, {o, q}));
         ASSIGN_OR_RETURN(std::vector<Node*> grads, b.MultiResultOp(Opcode::kAttentionGrad,
                                                                    {q, q, q, q, attention[1], delta},
                                                                    AttrMap{{"scale", 0.5}}));
         Node* dq = grads[0];
         ASSIGN_OR_RETURN(Node * positive, b.Compare(dq, o, "lt"));
         return b.Select(positive, p[0], p[1]);
       }},
      {"paged_kv_feeding_compare",
       {{F32({1, 2, 1, 2, 4})}, {F32({3, 1, 4})}, {F32({1, 2, 2, 4})}, {F32({1, 2, 2, 4})}, {F32({1, 2, 2, 4})}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // kv_cache_write and paged_attention run only in the inference functions and are
         // not differentiable; like adamw_update they are covered by a use whose result
         // carries no gradient (attention's output is within [-1, 1], never below -2).
         ASSIGN_OR_RETURN(Node * slots, b.ConstantValues({0, 3, -1}, I32({3})));
         ASSIGN_OR_RETURN(Node * tables, b.ConstantValues({1, 0}, I32({1, 2})));
         ASSIGN_OR_RETURN(Node * positions, b.ConstantValues({1, 3}, I32({1, 2})));
         ASSIGN_OR_RETURN(Node * pool, b.Op(Opcode::kKvCacheWrite, {p[0], p[1], slots}, AttrMap{{"layer", int64_t{0}}}));
         ASSIGN_OR_RETURN(Node * o, b.Op(Opcode::kPagedAttention, {p[2], pool, pool, tables, positions},
                                         AttrMap{{"layer", int64_t{0}}, {"scale", 0.5}}));
         ASSIGN_OR_RETURN(Node * floor, b.Constant(-2.0, F32({1, 2, 2, 4})));
         ASSIGN_OR_RETURN(Node * above, b.Compare(o, floor, "gt"));
         return b.Select(above, p[3], p[4]);
       }},
      {"sample_tokens_feeding_compare",
       {{F32({2, 5})}, {F32({2})}, {F32({2})}},
       [](Builder& b, P p) -> absl::StatusOr<Node*> {
         // A token id carries no gradient either: a use whose result does not depend on it
         // (every row has a token, never -1), one row greedy and one sampled.
         ASSIGN_OR_RETURN(Node * sampling, b.ConstantValues({0, 0, 1, 0.8, 3, 0.9}, F32({2, 3})));
         ASSIGN_OR_RETURN(Node * draws, b.ConstantValues({7, 0, 0, 8, 0, 1}, I32({2, 3})));
         ASSIGN_OR_RETURN(Node * tokens, b.Op(Opcode::kSampleTokens, {p[0], sampling, draws}, AttrMap{}));
         ASSIGN_OR_RETURN(Node * zero, b.ConstantValues({0, 0}, I32({2})));
         ASSIGN_OR_RETURN(Node * drawn, b.Compare(tokens, zero, "ge"));
         return b.Select(drawn, p[1], p[2]);
       }},
  };
}

class AutodiffFdTest : public ::testing::TestWithParam<FdCase> {};

TEST_P(AutodiffFdTest, GradientMatchesFiniteDifferences) {
  const FdCase& c = GetParam();
  absl::StatusOr<std::unique_ptr<Module>> m = BuildForward(c);
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& forward = *(*m)->FindFunction("forward");
  std::vector<HostTensor> args;
  std::vector<int64_t> wrt;
  for (size_t i = 0; i < c.params.size(); ++i) {
    args.push_back(RandomArgument(c.params[i], /*seed=*/17 + i));
    if (IsFloat(c.params[i].type.dtype)) wrt.push_back(static_cast<int64_t>(i));
  }
  ExpectGradientsMatchFiniteDifferences(**m, forward, wrt, std::move(args), [&](int64_t p) {
    std::vector<int64_t> all(c.params[p].type.num_elements());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    return all;
  });
}

INSTANTIATE_TEST_SUITE_P(EveryOp, AutodiffFdTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<FdCase>& info) { return info.param.name; });

// DESIGN.md principle 1: every op of the table has a VJP rule (or is declared
// non-differentiable), and the cases above exercise every op.
TEST(AutodiffOpTableTest, EveryOpHasAVjpRuleAndAFiniteDifferenceCase) {
  std::set<Opcode> exercised;
  for (const FdCase& c : AllCases()) {
    absl::StatusOr<std::unique_ptr<Module>> m = BuildForward(c);
    ASSERT_TRUE(m.ok()) << c.name << ": " << m.status();
    for (const auto& n : (*m)->functions()[0]->nodes()) exercised.insert(n->opcode());
  }
  for (int i = 0; i < kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    EXPECT_TRUE(HasVjpRule(op)) << OpName(op) << " has no VJP rule";
    // A fusion's rule is an error by design (fuse-loops runs after autodiff), which
    // AutodiffOpTableTest.AFusionIsNotDifferentiated checks instead.
    if (op == Opcode::kFusion) continue;
    EXPECT_TRUE(exercised.count(op)) << OpName(op) << " has no finite-difference case";
  }
}

TEST(AutodiffOpTableTest, AFusionIsNotDifferentiated) {
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  Function* f = m->FindFunction("fusion");
  ASSERT_NE(f, nullptr);
  // The loss: the reduction fusion's f32 result, summed; differentiated by its input %x.
  Builder b(f);
  absl::StatusOr<Node*> loss = b.ReduceSum(f->outputs()[1], {0});
  ASSERT_TRUE(loss.ok()) << loss.status();
  absl::StatusOr<std::vector<Node*>> grads = AppendBackward(*f, *loss, {f->parameters()[0]});
  ASSERT_FALSE(grads.ok());
  EXPECT_NE(grads.status().message().find("is a fusion: autodiff differentiates the ops before fuse-loops"),
            std::string::npos)
      << grads.status();
}

// The whole llama-tiny training loss (embedding, RMSNorm, RoPE, GQA attention, SwiGLU, LM
// head, cross-entropy), for a few sampled entries of every weight tensor.
TEST(AutodiffLlamaTest, TinyLossGradientMatchesFiniteDifferences) {
  absl::StatusOr<ModelConfig> config = PresetConfig("llama-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Module>> m =
      BuildLlamaModule(*config, {.batch = 2, .seq_len = 8, .precision = Precision::kFp32});
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& forward = *(*m)->FindFunction("forward");
  const std::vector<Node*> params = forward.parameters();
  std::vector<HostTensor> args;
  std::vector<int64_t> weights;
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorType& t = params[i]->type();
    if (IsFloat(t.dtype)) {
      // Small weights, like an initialized model, keep activations in a smooth regime.
      args.push_back(RandomArgument({t, -0.5, 0.5}, /*seed=*/1000 + i));
      weights.push_back(static_cast<int64_t>(i));
    } else {
      args.push_back(RandomArgument({t, 0, static_cast<double>(config->vocab_size)}, /*seed=*/1000 + i));
    }
  }
  const HostTensor tokens = args[0];
  ASSERT_EQ(params[0]->name(), "tokens");
  ExpectGradientsMatchFiniteDifferences(**m, forward, weights, std::move(args), [&](int64_t p) {
    const std::vector<int64_t>& dims = params[p]->type().dims;
    const int64_t n = params[p]->type().num_elements();
    if (params[p]->name() == "model.embed_tokens.weight") {
      // Only the rows of tokens in the batch have a gradient: sample those.
      const int64_t row = dims[1];
      return std::vector<int64_t>{static_cast<int64_t>(tokens[0]) * row,
                                  static_cast<int64_t>(tokens[5]) * row + row / 2,
                                  static_cast<int64_t>(tokens[tokens.num_elements() - 1]) * row + row - 1};
    }
    // Three entries spread over the tensor: first, middle, a pseudo-random one.
    return std::vector<int64_t>{0, n / 2, (p * 7919) % n};
  });
}

// The whole GPT-2 loss (learned positions, LayerNorm, fused c_attn, biases, GELU, the head
// tied to wte), a vocabulary of 250 padded to 256. wte's gradient has both uses: a row of a
// token in the batch gets the embedding's and the head's, a row of an absent token the
// head's only, a padding row none (sampled: the finite differences see all of them).
TEST(AutodiffGpt2Test, TinyLossGradientMatchesFiniteDifferences) {
  ModelConfig config = PresetConfig("gpt2-tiny").value();
  config.vocab_size = 250;
  config.n_layers = 1;
  ASSERT_EQ(config.padded_vocab_size(), 256);
  absl::StatusOr<std::unique_ptr<Module>> m =
      BuildGpt2Module(config, {.batch = 2, .seq_len = 8, .precision = Precision::kFp32});
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& forward = *(*m)->FindFunction("forward");
  const std::vector<Node*> params = forward.parameters();
  std::vector<HostTensor> args;
  std::vector<int64_t> weights;
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorType& t = params[i]->type();
    if (IsFloat(t.dtype)) {
      args.push_back(RandomArgument({t, -0.5, 0.5}, /*seed=*/3000 + i));
      weights.push_back(static_cast<int64_t>(i));
    } else {
      args.push_back(RandomArgument({t, 0, static_cast<double>(config.vocab_size)}, /*seed=*/3000 + i));
    }
  }
  const HostTensor tokens = args[0];
  ASSERT_EQ(params[2]->name(), "transformer.wte.weight");
  std::set<int64_t> present(tokens.values().begin(), tokens.values().end());
  int64_t absent = 0;
  while (present.count(absent)) ++absent;
  ExpectGradientsMatchFiniteDifferences(**m, forward, weights, std::move(args), [&](int64_t p) {
    const std::vector<int64_t>& dims = params[p]->type().dims;
    const int64_t n = params[p]->type().num_elements();
    if (params[p]->name() == "transformer.wte.weight") {
      const int64_t row = dims[1];
      return std::vector<int64_t>{static_cast<int64_t>(tokens[0]) * row + 3, static_cast<int64_t>(tokens[5]) * row,
                                  absent * row + row / 2, 252 * row + 1};  // present, present, absent, padding
    }
    return std::vector<int64_t>{0, n / 2, (p * 7919) % n};
  });
}

// Autocast: the bf16 build's gradients (bf16 GEMM operands, f32 accumulation) stay within
// bf16 rounding of the fp32 build's, weight by weight. A gradient that went through bf16
// twice, or lost its accumulation precision, would still pass; one routed wrongly would not.
TEST(AutodiffLlamaTest, Bf16AutocastGradientsTrackFp32) {
  absl::StatusOr<ModelConfig> config = PresetConfig("llama-tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<std::vector<HostTensor>> grads_by_precision;
  std::vector<HostTensor> args;
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    absl::StatusOr<std::unique_ptr<Module>> m =
        BuildLlamaModule(*config, {.batch = 2, .seq_len = 8, .precision = precision});
    ASSERT_TRUE(m.ok()) << m.status();
    const Function& forward = *(*m)->FindFunction("forward");
    const std::vector<Node*> params = forward.parameters();
    std::vector<int64_t> weights;
    for (size_t i = 0; i < params.size(); ++i) {
      if (IsFloat(params[i]->type().dtype)) weights.push_back(static_cast<int64_t>(i));
      if (precision != Precision::kFp32) continue;
      const double hi = IsFloat(params[i]->type().dtype) ? 0.5 : static_cast<double>(config->vocab_size);
      args.push_back(RandomArgument({params[i]->type(), IsFloat(params[i]->type().dtype) ? -0.5 : 0, hi}, 2000 + i));
    }
    absl::StatusOr<Function*> grad_fn = BuildGradientFunction(**m, forward, 0, weights, "gradient");
    ASSERT_TRUE(grad_fn.ok()) << grad_fn.status();
    ASSERT_TRUE(VerifyModule(**m).ok()) << VerifyModule(**m);
    absl::StatusOr<std::vector<HostTensor>> grads = EvaluateFunction(**grad_fn, args);
    ASSERT_TRUE(grads.ok()) << grads.status();
    grads_by_precision.push_back(*std::move(grads));
  }
  const std::vector<HostTensor>& fp32 = grads_by_precision[0];
  const std::vector<HostTensor>& bf16 = grads_by_precision[1];
  ASSERT_EQ(fp32.size(), bf16.size());
  for (size_t k = 1; k < fp32.size(); ++k) {
    ASSERT_EQ(fp32[k].type(), bf16[k].type()) << "gradient " << k;
    double diff2 = 0, norm2 = 0;
    for (int64_t i = 0; i < fp32[k].num_elements(); ++i) {
      diff2 += (fp32[k][i] - bf16[k][i]) * (fp32[k][i] - bf16[k][i]);
      norm2 += fp32[k][i] * fp32[k][i];
    }
    // bf16 keeps 8 significant bits (relative rounding 2^-9 per operand).
    EXPECT_LT(std::sqrt(diff2), 0.05 * std::sqrt(norm2)) << "gradient " << k;
    EXPECT_GT(norm2, 0) << "gradient " << k;
  }
}

}  // namespace
}  // namespace kiln
