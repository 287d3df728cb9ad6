// The CPU reference backend op by op, against hand-written expectations, naive loops and
// finite differences.
#include "ir/reference_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "ir/builder.h"
#include "ir/numerics.h"
#include "ir/text_format.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

HostTensor F32(std::vector<int64_t> dims, std::vector<double> values) {
  return HostTensor::FromValues({kF32, std::move(dims)}, std::move(values));
}
HostTensor I32(std::vector<int64_t> dims, std::vector<double> values) {
  return HostTensor::FromValues({kI32, std::move(dims)}, std::move(values));
}

// One function under construction, evaluated on demand.
class Fn {
 public:
  Fn() : b(module.AddFunction("f")) {}
  Node* Param(const std::string& name, TensorType type) { return Ok(b.Parameter(name, std::move(type))); }
  static Node* Ok(absl::StatusOr<Node*> n) {
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? *n : nullptr;
  }
  static std::vector<Node*> Ok(absl::StatusOr<std::vector<Node*>> results) {
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? *results : std::vector<Node*>{};
  }
  absl::StatusOr<std::vector<HostTensor>> Eval(std::vector<Node*> outputs, std::vector<HostTensor> args,
                                               ReferenceOptions options = {}) {
    absl::Status st = b.Return(std::move(outputs));
    if (!st.ok()) return st;
    return EvaluateFunction(*module.functions()[0], args, options);
  }
  // Evaluates and expects success; returns the first output's values.
  std::vector<double> Values(Node* out, std::vector<HostTensor> args, ReferenceOptions options = {}) {
    auto r = Eval({out}, std::move(args), options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)[0].values() : std::vector<double>{};
  }

  Module module{"m"};
  Builder b;
};

void ExpectNear(const std::vector<double>& got, const std::vector<double>& expected, double tol) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], tol * (1 + std::fabs(expected[i]))) << "element " << i;
  }
}

TEST(ReferenceBackend, ConstantsAndIota) {
  Fn f;
  Node* splat = Fn::Ok(f.b.Constant(0.1, {DType::kBF16, {2}}));
  Node* dense = Fn::Ok(f.b.ConstantValues({1.5, -2.7, 3.2}, {kI32, {3}}));
  Node* iota = Fn::Ok(f.b.Iota({kF32, {2, 3}}, 1));
  auto r = f.Eval({splat, dense, iota}, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(RoundToDType(0.1, DType::kBF16), RoundToDType(0.1, DType::kBF16)));
  EXPECT_THAT((*r)[1].values(), ElementsAre(1, -2, 3));
  EXPECT_THAT((*r)[2].values(), ElementsAre(0, 1, 2, 0, 1, 2));
}

TEST(ReferenceBackend, UnaryOps) {
  const std::vector<double> in = {0.25, 1.0, 4.0};
  for (auto [op, fn] : std::vector<std::pair<Opcode, std::function<double(double)>>>{
           {Opcode::kNeg, [](double v) { return -v; }},
           {Opcode::kAbs, [](double v) { return std::fabs(v); }},
           {Opcode::kExp, [](double v) { return std::exp(v); }},
           {Opcode::kLog, [](double v) { return std::log(v); }},
           {Opcode::kSqrt, [](double v) { return std::sqrt(v); }},
           {Opcode::kRsqrt, [](double v) { return 1 / std::sqrt(v); }},
           {Opcode::kTanh, [](double v) { return std::tanh(v); }},
           {Opcode::kSigmoid, [](double v) { return 1 / (1 + std::exp(-v)); }}}) {
    Fn f;
    Node* x = f.Param("x", {kF32, {3}});
    std::vector<double> expected;
    for (double v : in) expected.push_back(RoundToDType(fn(v), kF32));
    EXPECT_EQ(f.Values(Fn::Ok(f.b.Unary(op, x)), {F32({3}, in)}), expected) << OpName(op);
  }
}

TEST(ReferenceBackend, BinaryOpsIncludingIntegerDivisionAndNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Fn f;
  Node* a = f.Param("a", {kF32, {3}});
  Node* c = f.Param("c", {kF32, {3}});
  Node* max = Fn::Ok(f.b.Binary(Opcode::kMax, a, c));
  Node* min = Fn::Ok(f.b.Binary(Opcode::kMin, a, c));
  Node* sub = Fn::Ok(f.b.Sub(a, c));
  Node* i = f.Param("i", {kI32, {4}});
  Node* j = f.Param("j", {kI32, {4}});
  Node* idiv = Fn::Ok(f.b.Div(i, j));
  Node* iadd = Fn::Ok(f.b.Add(i, i));
  auto r = f.Eval({max, min, sub, idiv, iadd},
                  {F32({3}, {1, nan, -2}), F32({3}, {2, 5, -3}), I32({4}, {7, -7, 2147483647, 9}),
                   I32({4}, {2, 2, 1, -4})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0][0], 2);
  EXPECT_TRUE(std::isnan((*r)[0][1])) << "max propagates NaN";
  EXPECT_EQ((*r)[0][2], -2);
  EXPECT_EQ((*r)[1][0], 1);
  EXPECT_TRUE(std::isnan((*r)[1][1])) << "min propagates NaN";
  EXPECT_EQ((*r)[2][0], -1);
  EXPECT_THAT((*r)[3].values(), ElementsAre(3, -3, 2147483647, -2)) << "truncates toward zero";
  EXPECT_THAT((*r)[4].values(), ElementsAre(14, -14, 2147483647, 18)) << "i32 overflow saturates";
}

TEST(ReferenceBackend, IntegerDivisionByZeroNamesTheNode) {
  Fn f;
  Node* i = f.Param("i", {kI32, {2}});
  Node* q = Fn::Ok(f.b.Named("quotient").Div(i, i));
  auto r = f.Eval({q}, {I32({2}, {3, 0})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("%quotient"));
  EXPECT_THAT(r.status().message(), HasSubstr("division by zero at [1]"));
}

TEST(ReferenceBackend, CompareSelectConvert) {
  Fn f;
  Node* a = f.Param("a", {kF32, {4}});
  Node* c = f.Param("c", {kF32, {4}});
  Node* lt = Fn::Ok(f.b.Compare(a, c, "lt"));
  Node* ne = Fn::Ok(f.b.Compare(a, c, "ne"));
  Node* sel = Fn::Ok(f.b.Select(lt, a, c));
  Node* to_bf16 = Fn::Ok(f.b.Convert(a, DType::kBF16));
  Node* to_i32 = Fn::Ok(f.b.Convert(a, kI32));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto r = f.Eval({lt, ne, sel, to_bf16, to_i32},
                  {F32({4}, {1 + 0x1p-8, -2.5, nan, 3}), F32({4}, {2, -3, 0, 3})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(1, 0, 0, 0));
  EXPECT_THAT((*r)[1].values(), ElementsAre(1, 1, 1, 0));
  EXPECT_EQ((*r)[2][0], 1 + 0x1p-8);
  EXPECT_EQ((*r)[2][1], -3);
  EXPECT_EQ((*r)[3][0], 1.0) << "bf16 tie rounds to even";
  EXPECT_THAT((*r)[4].values(), ElementsAre(1, -2, 0, 3));
}

TEST(ReferenceBackend, BroadcastMapsSizeOneDims) {
  Fn f;
  Node* col = f.Param("col", {kF32, {2, 1}});
  Node* row = f.Param("row", {kF32, {3}});
  // col's dim 0 -> result dim 0, its size-1 dim 1 -> result dim 2 (size 2): repeats.
  Node* a = Fn::Ok(f.b.Broadcast(col, {0, 2}, {2, 3, 2}));
  Node* c = Fn::Ok(f.b.Broadcast(row, {1}, {2, 3}));
  auto r = f.Eval({a, c}, {F32({2, 1}, {10, 20}), F32({3}, {1, 2, 3})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(10, 10, 10, 10, 10, 10, 20, 20, 20, 20, 20, 20));
  EXPECT_THAT((*r)[1].values(), ElementsAre(1, 2, 3, 1, 2, 3));
}

TEST(ReferenceBackend, ReshapeAndTranspose) {
  Fn f;
  Node* x = f.Param("x", {kF32, {2, 3}});
  Node* t = Fn::Ok(f.b.Transpose(x, {1, 0}));
  Node* r3 = Fn::Ok(f.b.Reshape(x, {1, 2, 3}));
  Node* t3 = Fn::Ok(f.b.Transpose(r3, {2, 0, 1}));  // result dim i is operand dim perm[i]
  auto r = f.Eval({t, t3}, {F32({2, 3}, {0, 1, 2, 3, 4, 5})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(0, 3, 1, 4, 2, 5));
  EXPECT_EQ((*r)[1].type().ToString(), "f32[3,1,2]");
  EXPECT_THAT((*r)[1].values(), ElementsAre(0, 3, 1, 4, 2, 5));
}

TEST(ReferenceBackend, StridedSliceAndConcatenate) {
  Fn f;
  Node* x = f.Param("x", {kF32, {4, 5}});
  Node* s = Fn::Ok(f.b.Slice(x, {1, 0}, {4, 5}, {2, 2}));  // rows 1,3; cols 0,2,4
  Node* head = Fn::Ok(f.b.Slice(x, {0, 0}, {2, 1}));
  Node* tail = Fn::Ok(f.b.Slice(x, {0, 3}, {2, 5}));
  Node* cat = Fn::Ok(f.b.Concatenate({head, tail}, 1));
  std::vector<double> in(20);
  for (int i = 0; i < 20; ++i) in[i] = i;
  auto r = f.Eval({s, cat}, {F32({4, 5}, in)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(5, 7, 9, 15, 17, 19));
  EXPECT_THAT((*r)[1].values(), ElementsAre(0, 3, 4, 5, 8, 9));
}

TEST(ReferenceBackend, ReduceOverAnyDims) {
  Fn f;
  Node* x = f.Param("x", {kF32, {2, 3, 2}});
  Node* middle = Fn::Ok(f.b.ReduceSum(x, {1}));
  Node* outer = Fn::Ok(f.b.ReduceSum(x, {2, 0}));
  Node* all = Fn::Ok(f.b.ReduceSum(x, {0, 1, 2}));
  Node* last_max = Fn::Ok(f.b.ReduceMax(x, {2}));
  Node* leading = Fn::Ok(f.b.ReduceSum(x, {0, 1}));
  Node* leading_max = Fn::Ok(f.b.ReduceMax(x, {0}));
  std::vector<double> in(12);
  for (int i = 0; i < 12; ++i) in[i] = i;
  auto r = f.Eval({middle, outer, all, last_max, leading, leading_max}, {F32({2, 3, 2}, in)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(6, 9, 24, 27));
  EXPECT_THAT((*r)[1].values(), ElementsAre(14, 22, 30));
  EXPECT_THAT((*r)[2].values(), ElementsAre(66));
  EXPECT_THAT((*r)[3].values(), ElementsAre(1, 3, 5, 7, 9, 11));
  EXPECT_THAT((*r)[4].values(), ElementsAre(30, 36));
  EXPECT_THAT((*r)[5].values(), ElementsAre(6, 7, 8, 9, 10, 11));
}

// out[b, m, n] = sum_{k1, k2} lhs[k1, b, m, k2] * rhs[k2, n, b, k1], by the definition.
std::vector<double> NaiveBatchedDot(const HostTensor& lhs, const HostTensor& rhs) {
  const int64_t K1 = lhs.type().dims[0], B = lhs.type().dims[1], M = lhs.type().dims[2], K2 = lhs.type().dims[3];
  const int64_t N = rhs.type().dims[1];
  std::vector<double> out(B * M * N, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double sum = 0;
        for (int64_t k1 = 0; k1 < K1; ++k1)
          for (int64_t k2 = 0; k2 < K2; ++k2)
            sum += lhs[((k1 * B + b) * M + m) * K2 + k2] * rhs[((k2 * N + n) * B + b) * K1 + k1];
        out[(b * M + m) * N + n] = sum;
      }
  return out;
}

// Batch dims and two contracting dims in scattered positions, on shapes that cross the
// GEMM's panel and cache-block edges (k = 2*150 > 256, n = 300 > 256, m = 100 > 96,
// partial tiles).
TEST(ReferenceBackend, DotGeneralMatchesNaiveLoop) {
  for (auto [k1, b, m, k2, n] : std::vector<std::array<int64_t, 5>>{{3, 2, 4, 5, 6}, {2, 2, 100, 150, 300}}) {
    Fn f;
    Node* lhs = f.Param("lhs", {kF32, {k1, b, m, k2}});
    Node* rhs = f.Param("rhs", {kF32, {k2, n, b, k1}});
    Node* dot = Fn::Ok(f.b.DotGeneral(lhs, rhs, {{1}, {2}, {0, 3}, {3, 0}}));
    ASSERT_EQ(dot->type().dims, (std::vector<int64_t>{b, m, n}));
    const HostTensor x = HostTensor::Random(lhs->type(), 1);
    const HostTensor y = HostTensor::Random(rhs->type(), 2);
    const std::vector<double> got = f.Values(dot, {x, y}, {.num_threads = 2, .f32_as_f64 = true});
    ExpectNear(got, NaiveBatchedDot(x, y), 1e-13);
    auto one_thread = EvaluateFunction(*f.module.functions()[0], {x, y}, {.num_threads = 1, .f32_as_f64 = true});
    ASSERT_TRUE(one_thread.ok()) << one_thread.status();
    EXPECT_EQ((*one_thread)[0].values(), got) << "results must not depend on the thread count";
  }
}

TEST(ReferenceBackend, DotGeneralWithEmptyContractionIsZero) {
  Fn f;
  Node* a = f.Param("a", {kF32, {2, 0}});
  Node* c = f.Param("c", {kF32, {0, 3}});
  HostTensor a_value({kF32, {2, 0}}), c_value({kF32, {0, 3}});
  EXPECT_THAT(f.Values(Fn::Ok(f.b.DotGeneral(a, c, {{}, {}, {1}, {0}})), {a_value, c_value}),
              ElementsAre(0, 0, 0, 0, 0, 0));
}

// The mixed-precision policy: bf16 operands are exact in double and their products are
// exact too, so bf16 x bf16 -> f32 is the exactly rounded sum of the rounded operands.
TEST(ReferenceBackend, Bf16DotWithF32OutIsTheRoundedExactProduct) {
  Fn f;
  Node* a = f.Param("a", {kF32, {5, 16}});
  Node* w = f.Param("w", {kF32, {16, 7}});
  Node* dot = Fn::Ok(f.b.DotGeneral(Fn::Ok(f.b.Convert(a, DType::kBF16)), Fn::Ok(f.b.Convert(w, DType::kBF16)),
                                    {{}, {}, {1}, {0}}, kF32));
  const HostTensor x = HostTensor::Random(a->type(), 3);
  const HostTensor y = HostTensor::Random(w->type(), 4);
  std::vector<double> expected(5 * 7);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j) {
      double sum = 0;
      for (int k = 0; k < 16; ++k) {
        sum += RoundToDType(x[i * 16 + k], DType::kBF16) * RoundToDType(y[k * 7 + j], DType::kBF16);
      }
      expected[i * 7 + j] = RoundToDType(sum, kF32);
    }
  EXPECT_EQ(f.Values(dot, {x, y}), expected);
}

TEST(ReferenceBackend, GatherRowsAndOutOfRangeIndexIsNamed) {
  Fn f;
  Node* table = f.Param("table", {kF32, {4, 2}});
  Node* ids = f.Param("ids", {kI32, {3}});
  Node* g = Fn::Ok(f.b.Named("embed").Gather(table, ids));
  const HostTensor t = F32({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  EXPECT_THAT(f.Values(g, {t, I32({3}, {2, 0, 2})}), ElementsAre(20, 21, 0, 1, 20, 21));
  auto bad = EvaluateFunction(*f.module.functions()[0], {t, I32({3}, {1, 4, 0})});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("%embed"));
  EXPECT_THAT(bad.status().message(), HasSubstr("index 4 at [1] is out of range [0, 4)"));
}

TEST(ReferenceBackend, ScatterAddSumsDuplicatesAndDropsOutOfRange) {
  Fn f;
  Node* ids = f.Param("ids", {kI32, {5}});
  Node* upd = f.Param("upd", {kF32, {5, 2}});
  Node* s = Fn::Ok(f.b.ScatterAdd(ids, upd, {kF32, {4, 2}}));
  EXPECT_THAT(f.Values(s, {I32({5}, {1, 3, 1, 7, -1}), F32({5, 2}, {1, 2, 10, 20, 100, 200, 5, 5, 6, 6})}),
              ElementsAre(0, 0, 101, 202, 0, 0, 10, 20));
}

// Central finite differences of sum(f(x) * dy) along each element of x.
std::vector<double> NumericGradient(const std::function<std::vector<double>(const HostTensor&)>& fn,
                                    const HostTensor& x, const std::vector<double>& dy) {
  std::vector<double> grad(x.num_elements());
  const double h = 1e-6;
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    HostTensor plus = x, minus = x;
    plus.mutable_values()[i] += h;
    minus.mutable_values()[i] -= h;
    const std::vector<double> fp = fn(plus), fm = fn(minus);
    double diff = 0;
    for (size_t j = 0; j < dy.size(); ++j) diff += (fp[j] - fm[j]) * dy[j];
    grad[i] = diff / (2 * h);
  }
  return grad;
}

const ReferenceOptions kDouble = {.f32_as_f64 = true};

TEST(ReferenceBackend, RmsNormByHand) {
  Fn f;
  Node* x = f.Param("x", {kF32, {2, 4}});
  Node* w = f.Param("w", {kF32, {4}});
  Node* y = Fn::Ok(f.b.RmsNorm(x, w, 3.0));
  // Row 0: mean(x^2) = 1, + eps 3 -> rsqrt(4) = 0.5. Row 1: mean = 4, + 3 -> rsqrt(7).
  const double r7 = 1 / std::sqrt(7.0);
  ExpectNear(f.Values(y, {F32({2, 4}, {1, 1, 1, 1, 2, -2, 2, -2}), F32({4}, {1, 2, 3, 4})}, kDouble),
             {0.5, 1, 1.5, 2, 2 * r7, -4 * r7, 6 * r7, -8 * r7}, 1e-15);
}

TEST(ReferenceBackend, RmsNormGradientsMatchFiniteDifferences) {
  const HostTensor x = HostTensor::Random({kF32, {3, 5}}, 5);
  const HostTensor w = HostTensor::Random({kF32, {5}}, 6);
  const HostTensor dy = HostTensor::Random({kF32, {3, 5}}, 7);
  auto forward = [&](const HostTensor& xv, const HostTensor& wv) {
    Fn f;
    Node* px = f.Param("x", xv.type());
    Node* pw = f.Param("w", wv.type());
    return f.Values(Fn::Ok(f.b.RmsNorm(px, pw, 1e-2)), {xv, wv}, kDouble);
  };
  Fn f;
  Node* px = f.Param("x", x.type());
  Node* pw = f.Param("w", w.type());
  Node* pdy = f.Param("dy", dy.type());
  Node* dx = Fn::Ok(f.b.Op(Opcode::kRmsNormGradInput, {px, pw, pdy}, AttrMap{{"eps", 1e-2}}));
  Node* dw = Fn::Ok(f.b.Op(Opcode::kRmsNormGradWeight, {px, pw, pdy}, AttrMap{{"eps", 1e-2}}));
  auto r = f.Eval({dx, dw}, {x, w, dy}, kDouble);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNear((*r)[0].values(), NumericGradient([&](const HostTensor& v) { return forward(v, w); }, x, dy.values()),
             1e-7);
  ExpectNear((*r)[1].values(), NumericGradient([&](const HostTensor& v) { return forward(x, v); }, w, dy.values()),
             1e-7);
}

// layer_norm_grad_input against llm.c's layernorm_backward written out in double (xhat, the
// row means of dnorm and dnorm * xhat), which the reference computes in another arrangement
// (rms_norm's gradient of the centered row, dnorm centered); dw and db of {weight_grad=1}
// against the sums over rows of dy * xhat and dy.
TEST(ReferenceBackend, LayerNormGradInputByHand) {
  constexpr int64_t kRows = 3, kD = 5;
  const double eps = 1e-2;
  const HostTensor x = HostTensor::Random({kF32, {kRows, kD}}, 31);
  const HostTensor w = HostTensor::Random({kF32, {kD}}, 32);
  const HostTensor dy = HostTensor::Random({kF32, {kRows, kD}}, 33);
  std::vector<double> dx(kRows * kD), dw(kD, 0.0), db(kD, 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    const double* xr = x.values().data() + r * kD;
    const double* dyr = dy.values().data() + r * kD;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < kD; ++i) mean += xr[i] / kD;
    for (int64_t i = 0; i < kD; ++i) var += (xr[i] - mean) * (xr[i] - mean) / kD;
    const double rstd = 1 / std::sqrt(var + eps);
    double dnorm_mean = 0, dnorm_xhat_mean = 0;
    for (int64_t i = 0; i < kD; ++i) {
      const double xhat = (xr[i] - mean) * rstd, dnorm = w.values()[i] * dyr[i];
      dnorm_mean += dnorm / kD;
      dnorm_xhat_mean += dnorm * xhat / kD;
    }
    for (int64_t i = 0; i < kD; ++i) {
      const double xhat = (xr[i] - mean) * rstd, dnorm = w.values()[i] * dyr[i];
      dx[r * kD + i] = rstd * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
      dw[i] += dyr[i] * xhat;
      db[i] += dyr[i];
    }
  }
  Fn f;
  Node* px = f.Param("x", x.type());
  Node* pw = f.Param("w", w.type());
  Node* pdy = f.Param("dy", dy.type());
  Node* plain = Fn::Ok(f.b.Op(Opcode::kLayerNormGradInput, {px, pw, pdy}, AttrMap{{"eps", eps}}));
  std::vector<Node*> merged = Fn::Ok(f.b.MultiResultOp(Opcode::kLayerNormGradInput, {px, pw, pdy},
                                                      AttrMap{{"eps", eps}, {"weight_grad", int64_t{1}}}));
  ASSERT_EQ(merged.size(), 3u);
  auto r = f.Eval({plain, merged[0], merged[1], merged[2]}, {x, w, dy}, kDouble);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNear((*r)[0].values(), dx, 1e-14);
  EXPECT_EQ((*r)[1].values(), (*r)[0].values());  // dx the same with and without dw, db
  ExpectNear((*r)[2].values(), dw, 1e-14);
  ExpectNear((*r)[3].values(), db, 1e-14);
}

// layer_norm_grad_input's three results are layer_norm's gradients (x, w, b): central finite
// differences of sum(layer_norm(x, w, b) * dy).
TEST(ReferenceBackend, LayerNormGradInputMatchesFiniteDifferences) {
  const HostTensor x = HostTensor::Random({kF32, {2, 3, 6}}, 41);
  const HostTensor w = HostTensor::Random({kF32, {6}}, 42);
  const HostTensor b = HostTensor::Random({kF32, {6}}, 43);
  const HostTensor dy = HostTensor::Random({kF32, {2, 3, 6}}, 44);
  auto forward = [&](const HostTensor& xv, const HostTensor& wv, const HostTensor& bv) {
    Fn f;
    Node* px = f.Param("x", xv.type());
    Node* pw = f.Param("w", wv.type());
    Node* pb = f.Param("b", bv.type());
    return f.Values(Fn::Ok(f.b.LayerNorm(px, pw, pb, 1e-2)), {xv, wv, bv}, kDouble);
  };
  Fn f;
  Node* px = f.Param("x", x.type());
  Node* pw = f.Param("w", w.type());
  Node* pdy = f.Param("dy", dy.type());
  std::vector<Node*> g = Fn::Ok(f.b.MultiResultOp(Opcode::kLayerNormGradInput, {px, pw, pdy},
                                                 AttrMap{{"eps", 1e-2}, {"weight_grad", int64_t{1}}}));
  auto r = f.Eval(g, {x, w, dy}, kDouble);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNear((*r)[0].values(),
             NumericGradient([&](const HostTensor& v) { return forward(v, w, b); }, x, dy.values()), 1e-7);
  ExpectNear((*r)[1].values(),
             NumericGradient([&](const HostTensor& v) { return forward(x, v, b); }, w, dy.values()), 1e-7);
  ExpectNear((*r)[2].values(),
             NumericGradient([&](const HostTensor& v) { return forward(x, w, v); }, b, dy.values()), 1e-7);
}

// The residual form is add(dres, layer_norm_grad_input) bit for bit, its copy convert(dx), its
// dw and db the plain {weight_grad=1} node's; in f32 and in the double mode alike. Against
// the decomposition it replaces (LayerNormVjp's: rms_norm gradients of the centered x, dx
// centered again, db a reduce_sum): equal to double rounding in the double mode, to f32
// rounding in f32.
TEST(ReferenceBackend, LayerNormGradInputFormsAndTheDecomposition) {
  for (const ReferenceOptions& options : {ReferenceOptions{}, kDouble}) {
    Fn f;
    const TensorType rows{kF32, {4, 3, 8}};
    Node* px = f.Param("x", rows);
    Node* pw = f.Param("w", {kF32, {8}});
    Node* pdy = f.Param("dy", rows);
    Node* pres = f.Param("dres", rows);
    const AttrMap eps{{"eps", 1e-2}};
    AttrMap with_dw = eps;
    with_dw.Set("weight_grad", int64_t{1});
    AttrMap all = with_dw;
    all.Set("copy_dtype", Symbol{"bf16"});
    Node* plain = Fn::Ok(f.b.Op(Opcode::kLayerNormGradInput, {px, pw, pdy}, eps));
    Node* added = Fn::Ok(f.b.Add(pres, plain));
    Node* added_bf16 = Fn::Ok(f.b.Convert(added, DType::kBF16));
    std::vector<Node*> m = Fn::Ok(f.b.MultiResultOp(Opcode::kLayerNormGradInput, {px, pw, pdy}, with_dw));
    std::vector<Node*> am = Fn::Ok(f.b.MultiResultOp(Opcode::kAddLayerNormGradInput, {pres, px, pw, pdy}, all));
    ASSERT_EQ(am.size(), 4u);
    Node* res_only = Fn::Ok(f.b.Op(Opcode::kAddLayerNormGradInput, {pres, px, pw, pdy}, eps));
    // The decomposition.
    auto center = [&](Node* v) {
      Node* sum = Fn::Ok(f.b.ReduceSum(v, {2}));
      Node* mean = Fn::Ok(f.b.Mul(Fn::Ok(f.b.Broadcast(sum, {0, 1}, rows.dims)), Fn::Ok(f.b.Constant(1.0 / 8, rows))));
      return Fn::Ok(f.b.Sub(v, mean));
    };
    Node* c = center(px);
    Node* dc = Fn::Ok(f.b.Op(Opcode::kRmsNormGradInput, {c, pw, pdy}, eps));
    Node* dx_decomposed = center(dc);
    Node* dw_decomposed = Fn::Ok(f.b.Op(Opcode::kRmsNormGradWeight, {c, pw, pdy}, eps));
    Node* db_decomposed = Fn::Ok(f.b.ReduceSum(pdy, {0, 1}));
    auto r = f.Eval({plain, added, added_bf16, m[0], m[1], m[2], am[0], am[1], am[2], am[3], res_only, dx_decomposed,
                     dw_decomposed, db_decomposed},
                    {HostTensor::Random(rows, 51), HostTensor::Random({kF32, {8}}, 52), HostTensor::Random(rows, 53),
                     HostTensor::Random(rows, 54)},
                    options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)[3].values(), (*r)[0].values());  // dx, with dw and db
    EXPECT_EQ((*r)[6].values(), (*r)[1].values());  // dres + dx
    EXPECT_EQ((*r)[10].values(), (*r)[1].values());
    EXPECT_EQ((*r)[7].values(), (*r)[2].values());  // its copy
    EXPECT_EQ((*r)[8].values(), (*r)[4].values());  // dw
    EXPECT_EQ((*r)[9].values(), (*r)[5].values());  // db
    const double tolerance = options.f32_as_f64 ? 1e-12 : 1e-5;
    ExpectNear((*r)[0].values(), (*r)[11].values(), tolerance);
    ExpectNear((*r)[4].values(), (*r)[12].values(), tolerance);
    ExpectNear((*r)[5].values(), (*r)[13].values(), tolerance);
  }
}

// The input gradients {weight_grad=1}: dw is rms_norm_grad_weight's value bit for bit (one
// definition, rounded to w's dtype: f32 and bf16 weights), dx (and the copy) the plain
// gradients' bit for bit; in f32 and in the double mode alike.
TEST(ReferenceBackend, InputGradientsWithTheWeightGradientEqualTheUnmergedOps) {
  for (DType wt : {kF32, DType::kBF16}) {
    for (const ReferenceOptions& options : {ReferenceOptions{}, kDouble}) {
      Fn f;
      Node* px = f.Param("x", {kF32, {4, 3, 7}});
      Node* pw = f.Param("w", {wt, {7}});
      Node* pdy = f.Param("dy", {kF32, {4, 3, 7}});
      Node* pres = f.Param("dres", {kF32, {4, 3, 7}});
      const AttrMap eps{{"eps", 1e-2}};
      AttrMap with_dw = eps;
      with_dw.Set("weight_grad", int64_t{1});
      AttrMap with_copy = with_dw;
      with_copy.Set("copy_dtype", Symbol{"bf16"});
      AttrMap copy_only = eps;
      copy_only.Set("copy_dtype", Symbol{"bf16"});
      Node* gi = Fn::Ok(f.b.Op(Opcode::kRmsNormGradInput, {px, pw, pdy}, eps));
      Node* gw = Fn::Ok(f.b.Op(Opcode::kRmsNormGradWeight, {px, pw, pdy}, eps));
      absl::StatusOr<std::vector<Node*>> ac = f.b.MultiResultOp(Opcode::kAddRmsNormGradInput, {pres, px, pw, pdy}, copy_only);
      absl::StatusOr<std::vector<Node*>> m = f.b.MultiResultOp(Opcode::kRmsNormGradInput, {px, pw, pdy}, with_dw);
      absl::StatusOr<std::vector<Node*>> am =
          f.b.MultiResultOp(Opcode::kAddRmsNormGradInput, {pres, px, pw, pdy}, with_copy);
      ASSERT_TRUE(ac.ok() && m.ok() && am.ok()) << ac.status() << m.status() << am.status();
      ASSERT_EQ(m->size(), 2u);
      ASSERT_EQ(am->size(), 3u);
      EXPECT_EQ((*m)[1]->type(), gw->type());
      auto r = f.Eval({gi, gw, (*ac)[0], (*ac)[1], (*m)[0], (*m)[1], (*am)[0], (*am)[1], (*am)[2]},
                      {HostTensor::Random({kF32, {4, 3, 7}}, 21), HostTensor::Random({wt, {7}}, 22),
                       HostTensor::Random({kF32, {4, 3, 7}}, 23), HostTensor::Random({kF32, {4, 3, 7}}, 24)},
                      options);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ((*r)[4].values(), (*r)[0].values());  // dx
      EXPECT_EQ((*r)[5].values(), (*r)[1].values());  // dw
      EXPECT_EQ((*r)[6].values(), (*r)[2].values());  // dres + dx
      EXPECT_EQ((*r)[7].values(), (*r)[3].values());  // its copy
      EXPECT_EQ((*r)[8].values(), (*r)[1].values());  // dw
      EXPECT_NE((*r)[1].values(), std::vector<double>(7, 0.0));
    }
  }
}

TEST(ReferenceBackend, SoftmaxRowsSumToOneAndLargeInputsAreStable) {
  Fn f;
  Node* x = f.Param("x", {kF32, {2, 3}});
  Node* y = Fn::Ok(f.b.Softmax(x));
  const std::vector<double> got = f.Values(y, {F32({2, 3}, {1000, 1001, 1002, -0.5, 0.25, 3})}, kDouble);
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  ExpectNear({got[0], got[1], got[2]}, {1 / z, std::exp(1.0) / z, std::exp(2.0) / z}, 1e-15);
  EXPECT_NEAR(got[3] + got[4] + got[5], 1.0, 1e-15);
  EXPECT_LT(got[3], got[4]);
}

TEST(ReferenceBackend, SoftmaxGradMatchesFiniteDifferences) {
  const HostTensor x = HostTensor::Random({kF32, {2, 4}}, 8, -3, 3);
  const HostTensor dy = HostTensor::Random({kF32, {2, 4}}, 9);
  auto softmax = [](const HostTensor& v) {
    Fn f;
    return f.Values(Fn::Ok(f.b.Softmax(f.Param("x", v.type()))), {v}, kDouble);
  };
  Fn f;
  Node* y = f.Param("y", x.type());
  Node* pdy = f.Param("dy", dy.type());
  Node* dx = Fn::Ok(f.b.Op(Opcode::kSoftmaxGrad, {y, pdy}));
  const HostTensor y_value = HostTensor::FromValues(x.type(), softmax(x));
  ExpectNear(f.Values(dx, {y_value, dy}, kDouble), NumericGradient(softmax, x, dy.values()), 1e-7);
}

TEST(ReferenceBackend, CrossEntropyIsLogsumexpMinusLabelLogit) {
  Fn f;
  Node* logits = f.Param("logits", {kF32, {3, 3}});
  Node* labels = f.Param("labels", {kI32, {3}});
  Node* loss = Fn::Ok(f.b.Named("xent").CrossEntropy(logits, labels));
  const std::vector<double> l = {0.5, -1, 2, 3, 0, 0, 1000, 0, -1000};
  Node* lse = loss->operand(0)->result(1);
  EXPECT_EQ(loss->name(), "xent");
  EXPECT_EQ(lse->name(), "xent.lse");
  auto r = f.Eval({loss, lse}, {F32({3, 3}, l), I32({3}, {2, 0, 0})}, kDouble);
  ASSERT_TRUE(r.ok()) << r.status();
  const double lse0 = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0)), lse1 = std::log(std::exp(3.0) + 2);
  ExpectNear((*r)[0].values(), {lse0 - 2, lse1 - 3, 0.0}, 1e-15);
  ExpectNear((*r)[1].values(), {lse0, lse1, 1000.0}, 1e-15);
  auto bad = EvaluateFunction(*f.module.functions()[0], {F32({3, 3}, l), I32({3}, {0, 3, 0})});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("%xent"));
  EXPECT_THAT(bad.status().message(), HasSubstr("label 3 of row 1 is out of range [0, 3)"));
}

// {classes=C}: the columns after the first C are padding. The loss is the loss of the
// first C columns alone, whatever the padding holds; its gradient there is 0; a label in
// the padding is out of range.
TEST(ReferenceBackend, CrossEntropyClassesSkipThePaddingColumns) {
  const std::vector<double> padded = {0.5, -1, 2, 99, -7, 3, 0, 0, 1e30, 5};
  const std::vector<double> unpadded = {0.5, -1, 2, 3, 0, 0};
  const HostTensor labels = I32({2}, {2, 0});
  const HostTensor dloss = F32({2}, {0.5, -2});
  auto per_row = [&](const std::vector<double>& l, int64_t width, int64_t classes) {
    Fn f;
    Node* logits = f.Param("logits", {kF32, {2, width}});
    Node* plabels = f.Param("labels", {kI32, {2}});
    Node* pd = f.Param("dloss", dloss.type());
    Node* loss = Fn::Ok(f.b.CrossEntropy(logits, plabels, classes));
    Node* lse = loss->operand(0)->result(1);
    Node* grad = Fn::Ok(f.b.CrossEntropyGrad(logits, plabels, pd, lse, classes));
    absl::StatusOr<std::vector<HostTensor>> r =
        f.Eval({loss, lse, grad}, {F32({2, width}, l), labels, dloss}, kDouble);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::make_tuple((*r)[0].values(), (*r)[1].values(), (*r)[2].values())
                  : std::make_tuple(std::vector<double>{}, std::vector<double>{}, std::vector<double>{});
  };
  const auto [loss, lse, grad] = per_row(padded, 5, 3);
  const auto [want_loss, want_lse, want_grad] = per_row(unpadded, 3, 0);
  ExpectNear(loss, want_loss, 0);
  ExpectNear(lse, want_lse, 0);
  ExpectNear(grad, {want_grad[0], want_grad[1], want_grad[2], 0, 0, want_grad[3], want_grad[4], want_grad[5], 0, 0}, 0);

  Fn f;
  Node* logits = f.Param("logits", {kF32, {2, 5}});
  Node* plabels = f.Param("labels", {kI32, {2}});
  auto bad = f.Eval({Fn::Ok(f.b.CrossEntropy(logits, plabels, 3))}, {F32({2, 5}, padded), I32({2}, {0, 3})});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("label 3 of row 1 is out of range [0, 3)"));
  Fn g;
  EXPECT_FALSE(g.b.CrossEntropy(g.Param("logits", {kF32, {2, 5}}), g.Param("labels", {kI32, {2}}), 6).ok());
}

TEST(ReferenceBackend, CrossEntropyGradIsSoftmaxMinusOneHotTimesDloss) {
  const HostTensor logits = HostTensor::Random({kF32, {2, 4}}, 10, -2, 2);
  const HostTensor labels = I32({2}, {3, 1});
  const HostTensor dloss = F32({2}, {0.5, -2});
  auto loss = [&](const HostTensor& v) {
    Fn f;
    Node* pl = f.Param("logits", v.type());
    Node* plabels = f.Param("labels", labels.type());
    return f.Values(Fn::Ok(f.b.CrossEntropy(pl, plabels)), {v, labels}, kDouble);
  };
  Fn f;
  Node* pl = f.Param("logits", logits.type());
  Node* plabels = f.Param("labels", labels.type());
  Node* pd = f.Param("dloss", dloss.type());
  Node* ce = Fn::Ok(f.b.CrossEntropy(pl, plabels));
  Node* grad = Fn::Ok(f.b.CrossEntropyGrad(pl, plabels, pd, ce->operand(0)->result(1)));
  ExpectNear(f.Values(grad, {logits, labels, dloss}, kDouble), NumericGradient(loss, logits, dloss.values()), 1e-7);
}

// The gradient reads lse as given: exp(z - lse) - onehot, so an lse one larger than the row's
// scales the softmax part by 1/e (what makes it elementwise, and its VJP treat lse as an
// operand); lse of the wrong shape is rejected.
TEST(ReferenceBackend, CrossEntropyGradReadsTheLseItIsGiven) {
  Fn f;
  Node* pl = f.Param("logits", {kF32, {1, 2}});
  Node* plabels = f.Param("labels", {kI32, {1}});
  Node* pd = f.Param("dloss", {kF32, {1}});
  Node* plse = f.Param("lse", {kF32, {1}});
  Node* grad = Fn::Ok(f.b.CrossEntropyGrad(pl, plabels, pd, plse));
  const double lse = RoundToDType(std::log(std::exp(0.0) + std::exp(1.0)) + 1, kF32);  // as the f32 parameter holds it
  ExpectNear(f.Values(grad, {F32({1, 2}, {0, 1}), I32({1}, {1}), F32({1}, {2}), F32({1}, {lse})}, kDouble),
             {2 * std::exp(0 - lse), 2 * (std::exp(1 - lse) - 1)}, 1e-15);
  Fn g;
  Node* bad_lse = g.Param("lse", {kF32, {2}});
  EXPECT_FALSE(g.b.CrossEntropyGrad(g.Param("logits", {kF32, {1, 2}}), g.Param("labels", {kI32, {1}}),
                                    g.Param("dloss", {kF32, {1}}), bad_lse)
                   .ok());
}

// {out_dtype=bf16}: the f32 gradient rounded once more, so exactly convert() of the f32
// gradient (what narrow-activations-bf16 relies on), not the exact gradient rounded straight
// to bf16. Enough random rows that the two roundings differ somewhere (checked below, so
// the comparison is known to see the difference), with padding columns.
TEST(ReferenceBackend, CrossEntropyGradOutDtypeIsTheConvertOfTheF32Gradient) {
  constexpr int64_t kRows = 16384, kWidth = 64, kClasses = 61;
  const HostTensor logits = HostTensor::Random({kF32, {kRows, kWidth}}, 21, -4, 4);
  const HostTensor labels = HostTensor::Random({kI32, {kRows}}, 22, 0, kClasses);
  const HostTensor dloss = HostTensor::Random({kF32, {kRows}}, 23, -1, 1);
  auto gradients = [&](ReferenceOptions options) {
    Fn f;
    Node* pl = f.Param("logits", logits.type());
    Node* plabels = f.Param("labels", labels.type());
    Node* pd = f.Param("dloss", dloss.type());
    Node* lse = Fn::Ok(f.b.CrossEntropy(pl, plabels, kClasses))->operand(0)->result(1);
    Node* wide = Fn::Ok(f.b.CrossEntropyGrad(pl, plabels, pd, lse, kClasses));
    Node* converted = Fn::Ok(f.b.Convert(wide, DType::kBF16));
    Node* narrow = Fn::Ok(f.b.Op(Opcode::kCrossEntropyGrad, {pl, plabels, pd, lse},
                                 AttrMap{{"classes", kClasses}, {"out_dtype", Symbol{"bf16"}}}));
    EXPECT_EQ(narrow->type(), (TensorType{DType::kBF16, {kRows, kWidth}}));
    absl::StatusOr<std::vector<HostTensor>> r = f.Eval({converted, narrow}, {logits, labels, dloss}, options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::make_pair((*r)[0].values(), (*r)[1].values())
                  : std::make_pair(std::vector<double>{}, std::vector<double>{});
  };
  const auto [converted, narrow] = gradients({});
  ASSERT_EQ(converted.size(), narrow.size());
  int64_t different = 0;
  for (size_t i = 0; i < narrow.size(); ++i) different += converted[i] != narrow[i];
  EXPECT_EQ(different, 0) << "of " << narrow.size();
  // Under f32_as_f64 the f32 step keeps double precision: the exact gradient rounded
  // straight to bf16, which differs from the above in a few halfway cases.
  const auto [unused, rounded_once] = gradients(kDouble);
  int64_t double_rounded = 0;
  for (size_t i = 0; i < narrow.size(); ++i) double_rounded += rounded_once[i] != narrow[i];
  EXPECT_GT(double_rounded, 0) << "no halfway case among " << narrow.size() << " values: the test cannot tell";

  Fn g;
  std::vector<Node*> operands = {g.Param("logits", {kF32, {2, 5}}), g.Param("labels", {kI32, {2}}),
                                 g.Param("d", {kF32, {2}}), g.Param("lse", {kF32, {2}})};
  EXPECT_FALSE(g.b.Op(Opcode::kCrossEntropyGrad, operands, AttrMap{{"out_dtype", Symbol{"i32"}}}).ok());
}

// attention {out_dtype=bf16} is its f32 O rounded once: convert(attention) bit for bit, with
// the same LSE, and under f32_as_f64 too (there the f32 O is kept in double, and so is what
// the narrow O rounds from). narrow-activations-bf16 relies on it.
TEST(ReferenceBackend, AttentionOutDtypeIsTheConvertOfTheF32Output) {
  const DType bf16 = DType::kBF16;
  const HostTensor q = HostTensor::Random({bf16, {1, 4, 64, 16}}, 31, -2, 2);
  const HostTensor k = HostTensor::Random({bf16, {1, 2, 64, 16}}, 32, -2, 2);
  const HostTensor v = HostTensor::Random({bf16, {1, 2, 64, 16}}, 33, -1, 1);
  for (const ReferenceOptions& options : {ReferenceOptions{}, kDouble}) {
    Fn f;
    Node* pq = f.Param("q", q.type());
    Node* pk = f.Param("k", k.type());
    Node* pv = f.Param("v", v.type());
    const std::vector<Node*> wide = Fn::Ok(f.b.MultiResultOp(Opcode::kAttention, {pq, pk, pv}, {{"scale", 0.25}}));
    const std::vector<Node*> narrow = Fn::Ok(f.b.MultiResultOp(
        Opcode::kAttention, {pq, pk, pv}, {{"scale", 0.25}, {"out_dtype", Symbol{"bf16"}}}, {"narrow", "narrow.lse"}));
    ASSERT_EQ(narrow.size(), 2u);
    EXPECT_EQ(narrow[0]->type(), (TensorType{bf16, {1, 4, 64, 16}}));
    EXPECT_EQ(narrow[1]->type(), (TensorType{kF32, {1, 4, 64}}));
    Node* converted = Fn::Ok(f.b.Convert(wide[0], bf16));
    absl::StatusOr<std::vector<HostTensor>> r =
        f.Eval({converted, narrow[0], wide[1], narrow[1], wide[0]}, {q, k, v}, options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)[0].values(), (*r)[1].values()) << "f32_as_f64 " << options.f32_as_f64;
    EXPECT_EQ((*r)[2].values(), (*r)[3].values());
    // Not vacuous: O has values that bf16 cannot hold.
    EXPECT_NE((*r)[4].values(), (*r)[1].values());
  }
}

// attention_delta rounds O to bf16 as it rounds dO (ir/op_table.h): Delta = sum bf16(dO) bf16(O),
// the same from an f32 O and from that O stored bf16. By hand: O = [1 + 2^-10, 0.5] (bf16:
// [1, 0.5]), dO = [1, 2]: Delta = 1 + 1 = 2, not 2 + 2^-10.
TEST(ReferenceBackend, AttentionDeltaRoundsOToBf16) {
  const DType bf16 = DType::kBF16;
  Fn f;
  Node* o = f.Param("o", {kF32, {1, 1, 1, 2}});
  Node* dout = f.Param("dout", {kF32, {1, 1, 1, 2}});
  Node* from_f32 = Fn::Ok(f.b.Op(Opcode::kAttentionDelta, {o, dout}));
  Node* from_bf16 = Fn::Ok(f.b.Op(Opcode::kAttentionDelta, {Fn::Ok(f.b.Convert(o, bf16)), dout}));
  absl::StatusOr<std::vector<HostTensor>> r =
      f.Eval({from_f32, from_bf16}, {F32({1, 1, 1, 2}, {1 + std::ldexp(1.0, -10), 0.5}), F32({1, 1, 1, 2}, {1, 2})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(2.0));
  EXPECT_THAT((*r)[1].values(), ElementsAre(2.0));
}

// bf16 logits (the LM head's output under autocast): the loss and lse are those of the same
// values held in f32, and the bf16 gradient is the f32 gradient of those values rounded once
// (convert() of it, bit for bit), as the kernels compute in f32 and round on store; with
// {out_dtype=f32} it is that f32 gradient itself.
TEST(ReferenceBackend, CrossEntropyOfBf16LogitsIsThatOfTheirF32Values) {
  constexpr int64_t kRows = 512, kWidth = 40, kClasses = 37;
  const HostTensor logits = HostTensor::Random({DType::kBF16, {kRows, kWidth}}, 31, -6, 6);
  const HostTensor labels = HostTensor::Random({kI32, {kRows}}, 32, 0, kClasses);
  const HostTensor dloss = HostTensor::Random({kF32, {kRows}}, 33, -1, 1);
  Fn f;
  Node* narrow = f.Param("logits", logits.type());
  Node* plabels = f.Param("labels", labels.type());
  Node* pd = f.Param("dloss", dloss.type());
  Node* wide = Fn::Ok(f.b.Convert(narrow, kF32));
  Node* loss_narrow = Fn::Ok(f.b.CrossEntropy(narrow, plabels, kClasses));
  Node* loss_wide = Fn::Ok(f.b.CrossEntropy(wide, plabels, kClasses));
  Node* lse_narrow = loss_narrow->operand(0)->result(1);
  Node* lse_wide = loss_wide->operand(0)->result(1);
  Node* grad_narrow = Fn::Ok(f.b.CrossEntropyGrad(narrow, plabels, pd, lse_narrow, kClasses));
  EXPECT_EQ(grad_narrow->type().dtype, DType::kBF16);
  Node* grad_wide = Fn::Ok(f.b.CrossEntropyGrad(wide, plabels, pd, lse_wide, kClasses));
  Node* grad_wide_rounded = Fn::Ok(f.b.Convert(grad_wide, DType::kBF16));
  Node* grad_f32_of_narrow = Fn::Ok(f.b.Op(Opcode::kCrossEntropyGrad, {narrow, plabels, pd, lse_narrow},
                                           AttrMap{{"classes", kClasses}, {"out_dtype", Symbol{"f32"}}}));
  auto r = f.Eval({loss_narrow, loss_wide, lse_narrow, lse_wide, grad_narrow, grad_wide_rounded, grad_f32_of_narrow,
                   grad_wide},
                  {logits, labels, dloss});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].values(), (*r)[1].values());
  EXPECT_EQ((*r)[2].values(), (*r)[3].values());
  EXPECT_EQ((*r)[4].values(), (*r)[5].values());
  EXPECT_EQ((*r)[6].values(), (*r)[7].values());
}

TEST(ReferenceBackend, RopeByHandInverseAndPositionZero) {
  Fn f;
  Node* x = f.Param("x", {kF32, {1, 2, 1, 4}});
  Node* pos = f.Param("pos", {kI32, {2}});
  Node* fwd = Fn::Ok(f.b.Rope(x, pos, 10000.0));
  Node* back = Fn::Ok(f.b.Rope(fwd, pos, 10000.0, /*inverse=*/true));
  auto r = f.Eval({fwd, back}, {F32({1, 2, 1, 4}, {1, 2, 3, 4, 1, 2, 3, 4}), I32({2}, {0, 1})}, kDouble);
  ASSERT_TRUE(r.ok()) << r.status();
  // Position 0 is the identity; position 1 rotates pair (0, 2) by 1 rad and pair (1, 3) by
  // 10000^(-2/4) = 0.01 rad.
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  ExpectNear((*r)[0].values(), {1, 2, 3, 4, c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + s1, 4 * c2 + 2 * s2}, 1e-15);
  ExpectNear((*r)[1].values(), {1, 2, 3, 4, 1, 2, 3, 4}, 1e-15);
}

TEST(ReferenceBackend, RopeInverseUndoesRopeOnRandomInput) {
  Fn f;
  Node* x = f.Param("x", {kF32, {2, 5, 3, 8}});
  Node* pos = f.Param("pos", {kI32, {5}});
  Node* back = Fn::Ok(f.b.Rope(Fn::Ok(f.b.Rope(x, pos, 500.0)), pos, 500.0, true));
  const HostTensor xv = HostTensor::Random(x->type(), 11);
  ExpectNear(f.Values(back, {xv, HostTensor::Random(pos->type(), 12, 0, 4096)}, kDouble), xv.values(), 1e-12);
}

// Values chosen so that sqrt(v') is exact: beta1 = 0.5, beta2 = 0.75, eps = 1 (large, so the
// third element's 0 / (0 + eps) shows it is added), step_size 0.5, decay 0.75, sqrt_bc2 0.5;
// g is given doubled with grad_scale 0.5, so the update reads g = {2, -1, 0}.
TEST(ReferenceBackend, AdamWUpdateByHand) {
  Fn f;
  std::vector<Node*> in;
  for (const char* name : {"p", "g", "m", "v"}) in.push_back(f.Param(name, {kF32, {3}}));
  for (const char* name : {"step_size", "decay", "sqrt_bc2", "grad_scale"}) in.push_back(f.Param(name, {kF32, {}}));
  absl::StatusOr<std::vector<Node*>> updated =
      f.b.MultiResultOp(Opcode::kAdamWUpdate, in, AttrMap{{"beta1", 0.5}, {"beta2", 0.75}, {"eps", 1.0}});
  ASSERT_TRUE(updated.ok()) << updated.status();
  const std::vector<Node*> outs = *updated;
  auto r = f.Eval(outs,
                  {F32({3}, {2, -4, 1}), F32({3}, {4, -2, 0}), F32({3}, {1, 0, 0}), F32({3}, {4, 1, 0}),
                   F32({}, {0.5}), F32({}, {0.75}), F32({}, {0.5}), F32({}, {0.5})},
                  kDouble);
  ASSERT_TRUE(r.ok()) << r.status();
  // m' = 0.5 m + 0.5 g; v' = 0.75 v + 0.25 g^2; p' = 0.75 p - 0.5 m' / (sqrt(v') / 0.5 + 1).
  ExpectNear((*r)[1].values(), {1.5, -0.5, 0}, 1e-15);
  ExpectNear((*r)[2].values(), {4, 1, 0}, 1e-15);
  ExpectNear((*r)[0].values(), {1.5 - 0.5 * 1.5 / 5, -3 + 0.5 * 0.5 / 3, 0.75}, 1e-15);
}

TEST(ReferenceBackend, F32AsF64KeepsDoublePrecisionButNarrowTypesStillRound) {
  Fn f;
  Node* a = f.Param("a", {kF32, {1}});
  Node* sum = Fn::Ok(f.b.Add(a, a));
  Node* narrow = Fn::Ok(f.b.Convert(sum, DType::kBF16));
  HostTensor arg({kF32, {1}});
  arg.mutable_values()[0] = 0.5 + 0x1p-40;  // not an f32: allowed under f32_as_f64
  auto wide = f.Eval({sum, narrow}, {arg}, kDouble);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ((*wide)[0][0], 1 + 0x1p-39);
  EXPECT_EQ((*wide)[1][0], 1.0);
  auto rounded = EvaluateFunction(*f.module.functions()[0], {arg});
  ASSERT_TRUE(rounded.ok());
  EXPECT_EQ((*rounded)[0][0], 1.0);
}

TEST(ReferenceBackend, ArgumentErrorsNameTheParameter) {
  Fn f;
  Node* x = f.Param("x", {kF32, {2}});
  Node* w = f.Param("weights", {kF32, {2, 2}});
  ASSERT_TRUE(f.b.Return({Fn::Ok(f.b.Add(x, x)), w}).ok());
  const Function& fn = *f.module.functions()[0];
  auto too_few = EvaluateFunction(fn, {F32({2}, {1, 2})});
  ASSERT_FALSE(too_few.ok());
  EXPECT_EQ(too_few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_few.status().message(), HasSubstr("takes 2 argument(s) (%x: f32[2], %weights: f32[2,2]), got 1"));
  auto wrong_type = EvaluateFunction(fn, {F32({2}, {1, 2}), F32({4}, {1, 2, 3, 4})});
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_EQ(wrong_type.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_type.status().message(),
              HasSubstr("argument 1 for parameter %weights of function f must be f32[2,2], got f32[4]"));
}

TEST(ReferenceBackend, OutputsMayRepeatAndBeParameters) {
  Fn f;
  Node* x = f.Param("x", {kF32, {2}});
  Node* y = Fn::Ok(f.b.Mul(x, x));
  auto r = f.Eval({y, x, y}, {F32({2}, {3, -4})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(9, 16));
  EXPECT_THAT((*r)[1].values(), ElementsAre(3, -4));
  EXPECT_THAT((*r)[2].values(), ElementsAre(9, 16));
}

// Only what the outputs depend on runs: a dead gather with a bad index is not an error,
// so dead-code elimination preserves meaning.
TEST(ReferenceBackend, DeadNodesDoNotRun) {
  Fn f;
  Node* table = f.Param("table", {kF32, {2, 1}});
  Node* ids = f.Param("ids", {kI32, {1}});
  Fn::Ok(f.b.Gather(table, ids));
  Node* live = Fn::Ok(f.b.Unary(Opcode::kNeg, table));
  EXPECT_THAT(f.Values(live, {F32({2, 1}, {1, 2}), I32({1}, {99})}), ElementsAre(-1, -2));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The gemm's FP8 slots (ir/op_table.h): D = d_scale (alpha a_scale b_scale A B + beta C), and
// the amax of the bracket as a second result, before d_scale.
TEST(ReferenceBackend, GemmScalesAndAmax) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %a = parameter() {index=0} : f8e4m3[1,2]
  %b = parameter() {index=1} : f8e4m3[2,2]
  %c = parameter() {index=2} : f32[1,2]
  %sa = parameter() {index=3} : f32[]
  %sb = parameter() {index=4} : f32[]
  %sd = parameter() {index=5} : f32[]
  %d, %amax = gemm(%a, %b, %c, %sa, %sb, %sd) {a_layout=mk, alpha=1.0, amax=1, b_layout=nk, batch=1, beta=1.0, epilogue=none, k=2, m=1, n=2, scaled=1} : (f32[1,2], f32[])
  return %d, %amax
})");
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->functions()[0];
  // A = [1, 2]; B (as [N, K]) = [[1, 1], [2, -3]]: A B = [3, -4]; with a_scale 2, b_scale 0.5
  // and C = [1, 1]: [4, -3]; amax 4; d_scale 0.25: D = [1, -0.75].
  std::vector<HostTensor> args = {
      HostTensor::FromValues({DType::kF8E4M3, {1, 2}}, {1, 2}),
      HostTensor::FromValues({DType::kF8E4M3, {2, 2}}, {1, 1, 2, -3}),
      HostTensor::FromValues({DType::kF32, {1, 2}}, {1, 1}),
      HostTensor::FromValues({DType::kF32, {}}, {2}),
      HostTensor::FromValues({DType::kF32, {}}, {0.5}),
      HostTensor::FromValues({DType::kF32, {}}, {0.25})};
  absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(f, args);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].values(), (std::vector<double>{1, -0.75}));
  EXPECT_EQ((*out)[1].values(), (std::vector<double>{4}));
  // fp8 operands without the scales are refused where they are written.
  absl::StatusOr<std::unique_ptr<Module>> unscaled = ParseModule(R"(module @m
func @main {
  %a = parameter() {index=0} : f8e4m3[1,2]
  %b = parameter() {index=1} : f8e4m3[2,2]
  %d = gemm(%a, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=2, m=1, n=2} : f32[1,2]
  return %d
})");
  ASSERT_FALSE(unscaled.ok());
  EXPECT_NE(unscaled.status().message().find("fp8 takes scaled=1"), std::string::npos) << unscaled.status();
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// ReferenceOptions::after_node: called once per computed node of the function, in node order,
// right after its value exists and before its users read it; it may change the value in place
// (what the data-parallel runner's all-reduce does), never its type.
constexpr char kHookFunction[] = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[2]
  %y = parameter() {index=1} : f32[2]
  %dead = neg(%x) : f32[2]
  %g = fusion(%x, %y) {kind=loop} : f32[2] {
    %x = parameter() {index=0} : f32[2]
    %y = parameter() {index=1} : f32[2]
    %s = add(%x, %y) : f32[2]
    %g = mul(%s, %s) : f32[2]
    return %g
  }
  %out = add(%g, %x) : f32[2]
  return %out
}
)";

TEST(ReferenceBackend, AfterNodeHookSeesEachLiveNodeOnceButNotFusionInternals) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(kHookFunction);
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->functions()[0];
  std::vector<std::string> seen;
  ReferenceOptions options;
  options.after_node = [&](const Node& node, absl::Span<HostTensor> results) {
    seen.push_back(node.name());
    EXPECT_EQ(results.size(), 1u);
    return absl::OkStatus();
  };
  const std::vector<HostTensor> args = {F32({2}, {1, 2}), F32({2}, {3, 4})};
  absl::StatusOr<std::vector<HostTensor>> hooked = EvaluateFunction(f, args, options);
  ASSERT_TRUE(hooked.ok()) << hooked.status();
  EXPECT_THAT(seen, ElementsAre("x", "y", "g", "out"));  // %dead never runs; %s is the fusion's
  absl::StatusOr<std::vector<HostTensor>> plain = EvaluateFunction(f, args);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*hooked)[0].values(), (*plain)[0].values());  // a hook that changes nothing changes nothing
  EXPECT_THAT((*plain)[0].values(), ElementsAre(17, 38));
}

TEST(ReferenceBackend, AfterNodeHookMayChangeAValueBeforeItsUsersReadIt) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(kHookFunction);
  ASSERT_TRUE(m.ok()) << m.status();
  ReferenceOptions options;
  options.after_node = [](const Node& node, absl::Span<HostTensor> results) {
    if (node.name() == "g") {
      for (double& v : results[0].mutable_values()) v /= 2;  // 16, 36 -> 8, 18
    }
    return absl::OkStatus();
  };
  absl::StatusOr<std::vector<HostTensor>> r =
      EvaluateFunction(*(*m)->functions()[0], {F32({2}, {1, 2}), F32({2}, {3, 4})}, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT((*r)[0].values(), ElementsAre(9, 20));  // %out read the changed %g
}

TEST(ReferenceBackend, AfterNodeHookErrorsAndTypeChangesNameTheNode) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(kHookFunction);
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->functions()[0];
  const std::vector<HostTensor> args = {F32({2}, {1, 2}), F32({2}, {3, 4})};
  ReferenceOptions fails;
  fails.after_node = [](const Node& node, absl::Span<HostTensor>) {
    return node.name() == "g" ? absl::UnavailableError("peer went away") : absl::OkStatus();
  };
  absl::StatusOr<std::vector<HostTensor>> r = EvaluateFunction(f, args, fails);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("node %g (fusion): after_node hook: peer went away"));

  ReferenceOptions reshapes;
  reshapes.after_node = [](const Node& node, absl::Span<HostTensor> results) {
    if (node.name() == "g") results[0] = F32({3}, {1, 2, 3});
    return absl::OkStatus();
  };
  r = EvaluateFunction(f, args, reshapes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("node %g (fusion): the after_node hook changed result 0 from f32[2] to f32[3]"));
}

}  // namespace
}  // namespace kiln
