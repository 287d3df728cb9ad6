// Every op of ir/op_table.h on the GPU (codegen kernels, cuBLASLt GEMMs, the arena) against
// the CPU reference backend, on fresh random inputs, with the arena poisoned (0xFF bytes are
// NaN in every float width) so that an element a kernel forgets to write shows. Also the
// executable's contract: donation, outputs that are parameters, errors.
//
// Tolerances by what the op computes (codegen/kernel_source.h states the numerics):
//   exact     data movement, compare, select, convert, iota, constants, neg/abs, the f32
//             IEEE ops (add, sub, mul, div, sqrt, max, min), indexing
//   8 ulps    f32 exp, log, tanh, rsqrt, sigmoid (CUDA's functions are within 2 ulps)
//   sums      reductions and composites: accumulation order differs (rel 2e-5, abs 1e-5)
//   bf16/f16  results computed in f32 and rounded once may land one ulp away (rel 1e-2)
// Without a GPU every test skips, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codegen/compile_function.h"
#include "frontends/llama.h"
#include "frontends/weight_init.h"
#include "ir/builder.h"
#include "ir/status_macros.h"
#include "ir/verifier.h"
#include "passes/training_step.h"
#include "ir/text_format.h"
#include "passes/expand_rope.h"
#include "passes/fusion.h"
#include "passes/rematerialize.h"
#include "passes/lower_gemm.h"
#include "frontends/gpu_compile.h"
#include "runtime/cuda/executable.h"
#include "ir/reference_backend.h"
#include "tests/testing/gpu.h"
#include "tests/testing/lowered_for_gpu.h"
#include "tests/testing/reduction_shapes.h"
#include "runtime/training/dataset.h"
#include "tests/testing/all_ops.h"

namespace kiln {
namespace {

CudaDevice* Device() { return testing::TestDevice(); }

struct Tolerance {
  double rtol = 0, atol = 0;
};
constexpr Tolerance kExact{0, 0};
constexpr Tolerance kFewUlps{8 * 0x1p-23, 0};
constexpr Tolerance kSums{2e-5, 1e-5};
constexpr Tolerance kNarrow{1e-2, 1e-5};

// Exact stays exact in every dtype; an approximate op with a narrow float result is allowed
// the narrow format's rounding on top.
Tolerance ForDType(Tolerance t, DType d) {
  const bool exact = t.rtol == 0 && t.atol == 0;
  if (exact || !IsFloat(d) || d == DType::kF32) return t;
  return Tolerance{std::max(t.rtol, kNarrow.rtol), std::max(t.atol, kNarrow.atol)};
}

// Empty when every element matches; else the count and the first mismatches.
std::string Mismatches(const HostTensor& got, const HostTensor& want, Tolerance tol) {
  if (got.type() != want.type()) return absl::StrCat("type ", got.type().ToString(), " vs ", want.type().ToString());
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isnan(w) ? std::isnan(g)
                    : std::isinf(w) ? g == w
                                    : std::abs(g - w) <= tol.atol + tol.rtol * std::abs(w);
    if (ok) continue;
    if (++bad <= 5) absl::StrAppend(&first, "\n  [", i, "] gpu ", g, " reference ", w);
  }
  return bad == 0 ? "" : absl::StrCat(bad, " of ", want.num_elements(), " elements differ:", first);
}

// Random arguments for f's parameters; `ranges` by parameter index (default [-2, 2)).
std::vector<HostTensor> RandomArgs(const Function& f, uint64_t seed, const std::vector<std::pair<double, double>>& ranges) {
  std::vector<HostTensor> args;
  for (const Node* p : f.parameters()) {
    const size_t i = args.size();
    const auto [lo, hi] = i < ranges.size() ? ranges[i] : std::pair<double, double>{-2.0, 2.0};
    args.push_back(HostTensor::Random(p->type(), seed * 1000 + i, lo, hi));
  }
  return args;
}

// Runs f on both backends; one failure message per output that differs.
void ExpectMatchesReference(const Function& f, const std::vector<HostTensor>& args,
                            const std::function<Tolerance(int)>& tolerance_of_output) {
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
  ASSERT_TRUE(want.ok()) << want.status();
  const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
  absl::StatusOr<std::vector<HostTensor>> got =
      EvaluateOnGpu(*lowered->functions()[0], args, *Device(), {.poison_arena = true});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    const Tolerance tol = ForDType(tolerance_of_output(static_cast<int>(o)), (*want)[o].type().dtype);
    EXPECT_EQ(Mismatches((*got)[o], (*want)[o], tol), "")
        << "@" << f.name() << " output " << o << " (%" << f.outputs()[o]->name() << ", " << f.outputs()[o]->op_name() << ")";
  }
}

// One small function per op (and per interesting dtype or shape).
struct OpCase {
  std::string name;
  Tolerance tol;
  std::function<absl::Status(Builder&)> build;  // adds parameters and returns
  std::vector<std::pair<double, double>> ranges = {};
};

// Parameters p0, p1, ... in this order (arguments of one call are evaluated in no fixed
// order, so parameters are never created inside another call's argument list).
std::vector<Node*> Params(Builder& b, std::vector<TensorType> types) {
  std::vector<Node*> params;
  for (TensorType& t : types) params.push_back(*b.Parameter(absl::StrCat("p", params.size()), std::move(t)));
  return params;
}

absl::Status Ret(Builder& b, absl::StatusOr<Node*> out) {
  if (!out.ok()) return out.status();
  return b.Return({*out});
}

// attention (GQA: 4 query heads on 2 kv heads, 128 tokens, head dim `d`), its delta and its
// gradients, all returned: O, LSE, Delta, dq, dk, dv. With bf16_o, O is stored bf16
// ({out_dtype=bf16}) and the delta reads it so.
absl::Status AttentionFamily(Builder& b, int64_t d, double scale, bool bf16_o) {
  const DType bf16 = DType::kBF16;
  std::vector<Node*> p =
      Params(b, {{bf16, {1, 4, 128, d}}, {bf16, {1, 2, 128, d}}, {bf16, {1, 2, 128, d}}, {bf16, {1, 4, 128, d}}});
  AttrMap attrs{{"scale", scale}};
  if (bf16_o) attrs.Set("out_dtype", Symbol{"bf16"});
  ASSIGN_OR_RETURN(std::vector<Node*> attention, b.MultiResultOp(Opcode::kAttention, {p[0], p[1], p[2]}, attrs));
  ASSIGN_OR_RETURN(Node * delta, b.Op(Opcode::kAttentionDelta, {attention[0], p[3]}));
  ASSIGN_OR_RETURN(std::vector<Node*> grads,
                   b.MultiResultOp(Opcode::kAttentionGrad, {p[0], p[1], p[2], p[3], attention[1], delta},
                                   AttrMap{{"scale", scale}}));
  std::vector<Node*> outs = {attention[0], attention[1], delta};
  outs.insert(outs.end(), grads.begin(), grads.end());
  return b.Return(outs);
}

std::vector<OpCase> OpCases() {
  const DType f32 = DType::kF32, bf16 = DType::kBF16, i32 = DType::kI32;
  std::vector<OpCase> cases;
  struct UnaryRange { Opcode op; double lo, hi; Tolerance f32_tol; };
  for (const UnaryRange& u : {UnaryRange{Opcode::kNeg, -3, 3, kExact}, UnaryRange{Opcode::kAbs, -3, 3, kExact},
                              UnaryRange{Opcode::kExp, -8, 8, kFewUlps}, UnaryRange{Opcode::kLog, 1e-3, 50, kFewUlps},
                              UnaryRange{Opcode::kSqrt, 0, 50, kExact}, UnaryRange{Opcode::kRsqrt, 1e-3, 50, kFewUlps},
                              UnaryRange{Opcode::kTanh, -4, 4, kFewUlps}, UnaryRange{Opcode::kSigmoid, -8, 8, kFewUlps},
                              UnaryRange{Opcode::kGelu, -6, 6, kFewUlps}}) {
    for (DType d : {f32, bf16}) {
      cases.push_back({absl::StrCat(OpName(u.op), "_", DTypeName(d)), u.f32_tol,
                       [u, d](Builder& b) { return Ret(b, b.Unary(u.op, *b.Parameter("x", {d, {3, 67}}))); },
                       {{u.lo, u.hi}}});
    }
  }
  // GELU rounded to bf16 (the fast-intrinsic form, kernel_source.cc's GeluToNarrow) over a
  // range where exp(-2u) overflows f32 (x below ~ -9.4) and a tensor on the 16-byte path.
  cases.push_back({"gelu_bf16_wide", kFewUlps,
                   [](Builder& b) { return Ret(b, b.Unary(Opcode::kGelu, *b.Parameter("x", {bf16, {64, 1024}}))); },
                   {{-12, 12}}});
  for (Opcode op : {Opcode::kAdd, Opcode::kSub, Opcode::kMul, Opcode::kDiv, Opcode::kMax, Opcode::kMin}) {
    for (DType d : {f32, bf16, i32}) {
      if (d == i32 && op == Opcode::kDiv) continue;  // see the i32 division case below
      cases.push_back({absl::StrCat(OpName(op), "_", DTypeName(d)), kExact,
                       [op, d](Builder& b) {
                         std::vector<Node*> p = Params(b, {{d, {5, 33}}, {d, {5, 33}}});
                         return Ret(b, b.Binary(op, p[0], p[1]));
                       },
                       {{-100, 100}, {-100, 100}}});
    }
  }
  cases.push_back({"div_i32", kExact,
                   [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{i32, {40}}, {i32, {40}}});
                     return Ret(b, b.Div(p[0], p[1]));
                   },
                   {{-100, 100}, {1, 9}}});
  for (const char* dir : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    for (DType d : {f32, i32}) {
      // i32 values from {0, 1, 2} make ties common.
      cases.push_back({absl::StrCat("compare_", dir, "_", DTypeName(d)), kExact,
                       [dir, d](Builder& b) {
                         std::vector<Node*> p = Params(b, {{d, {4, 50}}, {d, {4, 50}}});
                         return Ret(b, b.Compare(p[0], p[1], dir));
                       },
                       {{0, 3}, {0, 3}}});
    }
  }
  cases.push_back({"select", kExact, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{DType::kPred, {6, 7}}, {f32, {6, 7}}, {f32, {6, 7}}});
                     return Ret(b, b.Select(p[0], p[1], p[2]));
                   }});
  struct Conversion { DType from, to; double lo, hi; };
  for (const Conversion& c :
       {Conversion{f32, bf16, -1e3, 1e3}, Conversion{f32, DType::kF16, -7e4, 7e4}, Conversion{f32, DType::kF8E4M3, -600, 600},
        Conversion{f32, DType::kF8E5M2, -7e4, 7e4}, Conversion{f32, i32, -1e4, 1e4}, Conversion{f32, DType::kI64, -1e4, 1e4},
        Conversion{f32, DType::kPred, -1, 1}, Conversion{bf16, f32, -1e3, 1e3}, Conversion{i32, f32, -1e6, 1e6},
        Conversion{i32, bf16, -1e6, 1e6}, Conversion{DType::kPred, f32, 0, 1}, Conversion{bf16, DType::kF8E4M3, -600, 600}}) {
    // A conversion rounds once, as the reference does: exact, whatever the result dtype.
    cases.push_back({absl::StrCat("convert_", DTypeName(c.from), "_", DTypeName(c.to)), kExact,
                     [c](Builder& b) { return Ret(b, b.Convert(*b.Parameter("x", {c.from, {7, 19}}), c.to)); },
                     {{c.lo, c.hi}}});
  }
  cases.push_back({"broadcast", kExact, [](Builder& b) {
                     return Ret(b, b.Broadcast(*b.Parameter("x", {f32, {3, 1}}), {1, 2}, {2, 3, 5}));
                   }});
  cases.push_back({"reshape_of_parameter", kExact,
                   [](Builder& b) { return Ret(b, b.Reshape(*b.Parameter("x", {f32, {4, 6}}), {2, 12})); }});
  cases.push_back({"reshape_of_value", kExact, [](Builder& b) {
                     return Ret(b, b.Reshape(*b.Unary(Opcode::kNeg, *b.Parameter("x", {bf16, {4, 6}})), {24}));
                   }});
  cases.push_back({"transpose", kExact, [](Builder& b) {
                     return Ret(b, b.Transpose(*b.Parameter("x", {bf16, {2, 3, 41}}), {2, 0, 1}));
                   }});
  cases.push_back({"slice", kExact, [](Builder& b) {
                     return Ret(b, b.Slice(*b.Parameter("x", {f32, {7, 9}}), {1, 2}, {6, 9}, {2, 3}));
                   }});
  cases.push_back({"concatenate", kExact, [](Builder& b) {
                     return Ret(b, b.Concatenate(Params(b, {{i32, {2, 3}}, {i32, {2, 1}}, {i32, {2, 4}}}), 1));
                   }});
  cases.push_back({"reduce_sum_f32", kSums, [](Builder& b) {
                     return Ret(b, b.ReduceSum(*b.Parameter("x", {f32, {4, 5, 6}}), {0, 2}));
                   }});
  cases.push_back({"reduce_sum_bf16", kSums, [](Builder& b) {
                     return Ret(b, b.ReduceSum(*b.Parameter("x", {bf16, {4, 5, 6}}), {1}));
                   }});
  cases.push_back({"reduce_sum_long_rows", {2e-5, 1e-3}, [](Builder& b) {
                     return Ret(b, b.ReduceSum(*b.Parameter("x", {f32, {33, 4099}}), {1}));
                   }});
  cases.push_back({"reduce_sum_leading", {2e-5, 1e-3}, [](Builder& b) {
                     return Ret(b, b.ReduceSum(*b.Parameter("x", {f32, {4099, 35}}), {0}));
                   }});
  cases.push_back({"reduce_max", kExact, [](Builder& b) {
                     return Ret(b, b.ReduceMax(*b.Parameter("x", {f32, {4, 5, 6}}), {1}));
                   }});
  cases.push_back({"iota_i32", kExact, [](Builder& b) { return Ret(b, b.Iota({i32, {3, 4}}, 1)); }});
  cases.push_back({"iota_bf16", kExact, [](Builder& b) { return Ret(b, b.Iota({bf16, {300}}, 0)); }});
  cases.push_back({"constant_splat", kExact, [](Builder& b) { return Ret(b, b.Constant(-2.75, {f32, {5, 3}})); }});
  cases.push_back({"constant_dense", kExact, [](Builder& b) {
                     return Ret(b, b.ConstantValues({1, -2.5, 3e-8, -0.0, 1e30, 7}, {bf16, {2, 3}}));
                   }});
  cases.push_back({"dot_general_f32", kSums, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{f32, {2, 3, 16}}, {f32, {2, 16, 5}}});
                     return Ret(b, b.DotGeneral(p[0], p[1], {{0}, {0}, {2}, {1}}));
                   }});
  cases.push_back({"gemm_accumulate_bf16", kSums, [](Builder& b) {
                     // D = 0.5 A Bᵀ + 2 C, A [2, 24, 16] (km: [batch, K, M] = [2,16,24]), B [2, 8, 16] (nk).
                     std::vector<Node*> p = Params(b, {{bf16, {2, 16, 24}}, {bf16, {2, 8, 16}}, {f32, {2, 24, 8}}});
                     const TensorType out{f32, {2, 24, 8}};
                     return Ret(b, b.Op(Opcode::kGemm, {p[0], p[1], p[2]},
                                        AttrMap{{"batch", int64_t{2}}, {"m", int64_t{24}}, {"n", int64_t{8}},
                                                {"k", int64_t{16}}, {"a_layout", Symbol{"km"}},
                                                {"b_layout", Symbol{"nk"}}, {"alpha", 0.5}, {"beta", 2.0},
                                                {"epilogue", Symbol{"none"}}},
                                        &out));
                   }});
  cases.push_back({"gather", kExact, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{bf16, {10, 8}}, {i32, {3, 4}}});
                     return Ret(b, b.Gather(p[0], p[1]));
                   },
                   {{-2, 2}, {0, 10}}});
  cases.push_back({"scatter_add", kSums, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{i32, {12}}, {f32, {12, 8}}});
                     return Ret(b, b.ScatterAdd(p[0], p[1], {f32, {10, 8}}));
                   },
                   {{0, 10}, {-2, 2}}});
  auto x_w = [](Builder& b) {
    return std::pair<Node*, Node*>{*b.Parameter("x", {DType::kF32, {2, 3, 64}}), *b.Parameter("w", {DType::kF32, {64}})};
  };
  cases.push_back({"rms_norm", kSums, [x_w](Builder& b) {
                     auto [x, w] = x_w(b);
                     return Ret(b, b.RmsNorm(x, w, 1e-5));
                   }});
  cases.push_back({"layer_norm", kSums, [x_w](Builder& b) {
                     auto [x, w] = x_w(b);
                     Node* bias = *b.Parameter("b", {DType::kF32, {64}});
                     return Ret(b, b.LayerNorm(x, w, bias, 1e-5));
                   }});
  cases.push_back({"layer_norm_gpt2_row", kSums, [](Builder& b) {  // 768 wide, bf16 out
                     std::vector<Node*> p = Params(b, {{f32, {8, 768}}, {f32, {768}}, {f32, {768}}});
                     Node* y = *b.LayerNorm(p[0], p[1], p[2], 1e-5);
                     return Ret(b, b.Convert(y, bf16));
                   }});
  // fuse-residual-norm's forms: the norm written bf16, the residual add with it (both
  // results), and the residual gradient with and without its bf16 copy; 64 wide (a warp per
  // row, 16-byte accesses), 768 (GPT-2's and llama-S's rows) and 33 (the scalar path).
  const AttrMap to_bf16{{"eps", 1e-5}, {"out_dtype", Symbol{"bf16"}}};
  cases.push_back({"rms_norm_bf16_out", kSums, [x_w, to_bf16](Builder& b) {
                     auto [x, w] = x_w(b);
                     return Ret(b, b.Op(Opcode::kRmsNorm, {x, w}, to_bf16));
                   }});
  cases.push_back({"layer_norm_bf16_out", kSums, [to_bf16](Builder& b) {
                     std::vector<Node*> p = Params(b, {{f32, {8, 768}}, {f32, {768}}, {f32, {768}}});
                     return Ret(b, b.Op(Opcode::kLayerNorm, {p[0], p[1], p[2]}, to_bf16));
                   }});
  for (int64_t d : {int64_t{64}, int64_t{768}, int64_t{33}}) {
    for (Opcode op : {Opcode::kAddRmsNorm, Opcode::kAddLayerNorm}) {
      const bool narrow = d != 33;  // the scalar path keeps y f32
      cases.push_back({absl::StrCat(OpName(op), "_", d), kSums, [=](Builder& b) -> absl::Status {
                         std::vector<TensorType> types = {{f32, {2, 3, d}}, {f32, {2, 3, d}}, {f32, {d}}};
                         if (op == Opcode::kAddLayerNorm) types.push_back({f32, {d}});
                         std::vector<Node*> p = Params(b, types);
                         AttrMap attrs{{"eps", 1e-5}};
                         if (narrow) attrs.Set("out_dtype", Symbol{"bf16"});
                         ASSIGN_OR_RETURN(std::vector<Node*> sum_and_y, b.MultiResultOp(op, p, attrs));
                         return b.Return(sum_and_y);
                       }});
    }
    for (bool copy : {true, false}) {
      cases.push_back({absl::StrCat("add_rms_norm_grad_input_", d, copy ? "_copy" : ""), kSums,
                       [=](Builder& b) -> absl::Status {
                         std::vector<Node*> p = Params(b, {{f32, {2, 3, d}}, {f32, {2, 3, d}}, {f32, {d}}, {f32, {2, 3, d}}});
                         AttrMap attrs{{"eps", 1e-5}};
                         if (!copy) return Ret(b, b.Op(Opcode::kAddRmsNormGradInput, p, attrs));
                         attrs.Set("copy_dtype", Symbol{"bf16"});
                         ASSIGN_OR_RETURN(std::vector<Node*> dx_and_copy,
                                          b.MultiResultOp(Opcode::kAddRmsNormGradInput, p, attrs));
                         return b.Return(dx_and_copy);
                       }});
    }
  }
  cases.push_back({"rms_norm_grad_input_weight_grad", kSums, [x_w](Builder& b) -> absl::Status {
                     auto [x, w] = x_w(b);
                     Node* dy = *b.Parameter("dy", {DType::kF32, {2, 3, 64}});
                     ASSIGN_OR_RETURN(std::vector<Node*> dx_dw,
                                      b.MultiResultOp(Opcode::kRmsNormGradInput, {x, w, dy},
                                                      AttrMap{{"eps", 1e-5}, {"weight_grad", int64_t{1}}}));
                     return b.Return(dx_dw);
                   }});
  // fuse-residual-norm's layer_norm backward: plain, with dw and db, and the residual form
  // with its bf16 copy and dw and db; 64 wide (a warp per row, 16-byte accesses), 768
  // (GPT-2's rows) and 33 (the scalar path).
  for (int64_t d : {int64_t{64}, int64_t{768}, int64_t{33}}) {
    cases.push_back({absl::StrCat("layer_norm_grad_input_", d), kSums, [=](Builder& b) {
                       std::vector<Node*> p = Params(b, {{f32, {2, 3, d}}, {f32, {d}}, {f32, {2, 3, d}}});
                       return Ret(b, b.Op(Opcode::kLayerNormGradInput, p, AttrMap{{"eps", 1e-5}}));
                     }});
    cases.push_back({absl::StrCat("layer_norm_grad_input_weight_grad_", d), kSums, [=](Builder& b) -> absl::Status {
                       std::vector<Node*> p = Params(b, {{f32, {2, 3, d}}, {f32, {d}}, {f32, {2, 3, d}}});
                       ASSIGN_OR_RETURN(std::vector<Node*> g,
                                        b.MultiResultOp(Opcode::kLayerNormGradInput, p,
                                                        AttrMap{{"eps", 1e-5}, {"weight_grad", int64_t{1}}}));
                       return b.Return(g);
                     }});
    cases.push_back({absl::StrCat("add_layer_norm_grad_input_", d), kSums, [=](Builder& b) -> absl::Status {
                       std::vector<Node*> p =
                           Params(b, {{f32, {2, 3, d}}, {f32, {2, 3, d}}, {f32, {d}}, {f32, {2, 3, d}}});
                       ASSIGN_OR_RETURN(std::vector<Node*> g,
                                        b.MultiResultOp(Opcode::kAddLayerNormGradInput, p,
                                                        AttrMap{{"eps", 1e-5},
                                                                {"copy_dtype", Symbol{"bf16"}},
                                                                {"weight_grad", int64_t{1}}}));
                       return b.Return(g);
                     }});
  }
  for (Opcode op : {Opcode::kRmsNormGradInput, Opcode::kRmsNormGradWeight}) {
    cases.push_back({std::string(OpName(op)), kSums, [x_w, op](Builder& b) {
                       auto [x, w] = x_w(b);
                       Node* dy = *b.Parameter("dy", {DType::kF32, {2, 3, 64}});
                       return Ret(b, b.Op(op, {x, w, dy}, AttrMap{{"eps", 1e-5}}));
                     }});
  }
  cases.push_back({"softmax", kSums, [](Builder& b) { return Ret(b, b.Softmax(*b.Parameter("x", {f32, {4, 33}}))); },
                   {{-10, 10}}});
  cases.push_back({"softmax_wide", kSums,
                   [](Builder& b) { return Ret(b, b.Softmax(*b.Parameter("x", {f32, {16, 4096}}))); }, {{-10, 10}}});
  cases.push_back({"softmax_grad", kSums, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{f32, {4, 33}}, {f32, {4, 33}}});
                     return Ret(b, b.Op(Opcode::kSoftmaxGrad, {*b.Softmax(p[0]), p[1]}));
                   }});
  // The loss kernel's two results, and the gradient kernel reading its lse, for f32 and bf16
  // logits (the LM head's bf16 output under autocast), with and without GPT-2's padded vocabulary (50257 classes of 50304: a block per
  // row; the padding holds values far above any logit, so a kernel that read it into the
  // softmax would be far off, and gets gradient 0), the gradient in the logits' dtype or
  // rounded to bf16 by its kernel (narrow-activations-bf16's form).
  struct CrossEntropyCase {
    std::string name;
    DType logits;
    int64_t rows, width, classes;
    std::optional<DType> out_dtype;
  };
  for (const CrossEntropyCase& ce : std::vector<CrossEntropyCase>{
           {"cross_entropy", f32, 6, 100, 100, std::nullopt},
           {"cross_entropy_padded", f32, 6, 104, 100, std::nullopt},
           {"cross_entropy_bf16_logits", DType::kBF16, 6, 104, 100, std::nullopt},
           {"cross_entropy_gpt2_head_bf16_out", f32, 4, 50304, 50257, DType::kBF16},
           {"cross_entropy_gpt2_head_bf16_logits", DType::kBF16, 4, 50304, 50257, std::nullopt},
           {"cross_entropy_gpt2_head_bf16_logits_f32_out", DType::kBF16, 4, 50304, 50257, f32},
           {"cross_entropy_llama_head_bf16_logits", DType::kBF16, 4, 32000, 32000, std::nullopt},
       }) {
    cases.push_back({ce.name, kSums, [ce](Builder& b) -> absl::Status {
                       std::vector<Node*> p = Params(b, {{f32, {ce.rows, ce.classes}}, {i32, {ce.rows}}, {f32, {ce.rows}}});
                       Node* logits = p[0];
                       if (ce.width > ce.classes) {
                         ASSIGN_OR_RETURN(Node * pad, b.Constant(1e4, {f32, {ce.rows, ce.width - ce.classes}}));
                         ASSIGN_OR_RETURN(logits, b.Concatenate({p[0], pad}, 1));
                       }
                       if (ce.logits != f32) {
                         ASSIGN_OR_RETURN(logits, b.Convert(logits, ce.logits));
                       }
                       ASSIGN_OR_RETURN(Node * loss, b.CrossEntropy(logits, p[1], ce.classes));
                       Node* lse = loss->operand(0)->result(1);
                       AttrMap attrs{{"classes", ce.classes}};
                       if (ce.out_dtype) attrs.Set("out_dtype", Symbol{std::string(DTypeName(*ce.out_dtype))});
                       ASSIGN_OR_RETURN(Node * grad, b.Op(Opcode::kCrossEntropyGrad, {logits, p[1], p[2], lse}, attrs));
                       return b.Return({loss, lse, grad});
                     },
                     {{-5, 5}, {0, static_cast<double>(ce.classes)}, {-1, 1}}});
  }
  // The gradient alone, from an lse of its own (a parameter, not the row's).
  cases.push_back({"cross_entropy_grad", kSums, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{f32, {6, 100}}, {i32, {6}}, {f32, {6}}, {f32, {6}}});
                     return Ret(b, b.CrossEntropyGrad(p[0], p[1], p[2], p[3]));
                   },
                   {{-5, 5}, {0, 100}, {-1, 1}, {2, 6}}});
  for (bool inverse : {false, true}) {
    cases.push_back({inverse ? "rope_inverse" : "rope", kSums, [inverse](Builder& b) {
                       std::vector<Node*> p = Params(b, {{f32, {2, 5, 3, 8}}, {i32, {5}}});
                       return Ret(b, b.Rope(p[0], p[1], 10000.0, inverse));
                     },
                     {{-2, 2}, {0, 2048}}});
  }
  // expand-rope's table, and the rotation as the loop kernel fuse-loops makes of the expanded
  // ops (a slice of a wider bf16 input, as llama's q from the merged q/k/v GEMM, and the
  // transpose to attention's layout), against the reference's rope.
  // (Not bitwise: the device's double pow and sincos may differ from the host's by an ulp.)
  cases.push_back({"rope_table", kSums, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{i32, {37}}});
                     return Ret(b, b.Op(Opcode::kRopeTable, {p[0]},
                                        AttrMap{{"theta", 10000.0}, {"head_dim", int64_t{64}}, {"inverse", int64_t{1}}}));
                   },
                   {{0, 4096}}});
  cases.push_back({"rope_expanded_and_fused", kSums, [](Builder& b) -> absl::Status {
                     std::vector<Node*> p = Params(b, {{bf16, {2, 40, 1280}}, {i32, {40}}});
                     ASSIGN_OR_RETURN(Node * q, b.Slice(p[0], {0, 0, 0}, {2, 40, 768}, {1, 1, 1}));
                     ASSIGN_OR_RETURN(Node * heads, b.Reshape(q, {2, 40, 12, 64}));
                     ASSIGN_OR_RETURN(Node * r, b.Rope(heads, p[1], 10000.0));
                     ASSIGN_OR_RETURN(Node * narrow, b.Convert(r, bf16));
                     ASSIGN_OR_RETURN(Node * t, b.Transpose(narrow, {0, 2, 1, 3}));
                     RETURN_IF_ERROR(b.Return({t}));
                     ASSIGN_OR_RETURN(bool expanded, ExpandRopePass().RunOnFunction(*b.function()));
                     if (!expanded) return absl::InternalError("expand-rope expanded nothing");
                     ASSIGN_OR_RETURN(bool fused, FusionPass().RunOnFunction(*b.function()));
                     if (!fused) return absl::InternalError("fuse-loops made no fusion");
                     return absl::OkStatus();
                   },
                   {{-2, 2}, {0, 4096}}});
  // The kernel's other shapes: bf16 with 16-byte accesses (llama's head size 64, the block's
  // cos/sin for 32 frequencies), and a sequence long enough that a block takes two batch rows,
  // the last block one.
  cases.push_back({"rope_bf16_heads", kSums, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{bf16, {3, 37, 12, 64}}, {i32, {37}}});
                     return Ret(b, b.Rope(p[0], p[1], 10000.0));
                   },
                   {{-2, 2}, {0, 4096}}});
  cases.push_back({"rope_rows_per_block", kSums, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{f32, {5, 200, 2, 16}}, {i32, {200}}});
                     return Ret(b, b.Rope(p[0], p[1], 500000.0, /*inverse=*/true));
                   },
                   {{-2, 2}, {0, 4096}}});
  // AdamW's three results over the scalar path (an odd size), 16-byte accesses, and a size
  // past the grid-stride kernel's grid (threads loop).
  for (int64_t n : {int64_t{1001}, int64_t{64 * 48}, (int64_t{1} << 22) + 4}) {
    cases.push_back({absl::StrCat("adamw_update_", n), kSums, [n](Builder& b) -> absl::Status {
                       std::vector<Node*> p = Params(b, {{f32, {n}}, {f32, {n}}, {f32, {n}}, {f32, {n}}, {f32, {}},
                                                         {f32, {}}, {f32, {}}, {f32, {}}});
                       absl::StatusOr<std::vector<Node*>> outs = b.MultiResultOp(
                           Opcode::kAdamWUpdate, p, AttrMap{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}});
                       if (!outs.ok()) return outs.status();
                       return b.Return(*outs);
                     },
                     {{-2, 2}, {-2, 2}, {-1, 1}, {0, 1}, {1e-3, 1e-2}, {0.99, 1}, {0.1, 1}, {0.25, 1}}});
  }
  // A grouped update (group-optimizer-updates'): one launch for groups on the scalar path,
  // 16-byte accesses, a strided one and a tiny one, blocks split among them by size.
  // And donated, as the training step returns them: result 3i+j written in place over group
  // i's p, m or v (operand 4i+{0,2,3}).
  for (bool donated : {false, true}) {
    cases.push_back({donated ? "adamw_update_grouped_in_place" : "adamw_update_grouped", kSums,
                     [donated](Builder& b) -> absl::Status {
                       std::vector<TensorType> types;
                       for (int64_t n : {int64_t{1001}, int64_t{64 * 48}, (int64_t{1} << 22) + 4, int64_t{3}}) {
                         types.insert(types.end(), 4, TensorType{f32, {n}});
                       }
                       types.insert(types.end(), 4, TensorType{f32, {}});
                       std::vector<Node*> p = Params(b, types);
                       absl::StatusOr<std::vector<Node*>> outs = b.MultiResultOp(
                           Opcode::kAdamWUpdate, p, AttrMap{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}});
                       if (!outs.ok()) return outs.status();
                       std::vector<int64_t> aliases;
                       for (int64_t r = 0; donated && r < static_cast<int64_t>(outs->size()); ++r) {
                         aliases.push_back(4 * (r / 3) + std::vector<int64_t>{0, 2, 3}[r % 3]);
                       }
                       return b.Return(*outs, aliases);
                     },
                     {{-2, 2}, {-2, 2}, {-1, 1}, {0, 1}, {-2, 2}, {-2, 2}, {-1, 1}, {0, 1},
                      {-2, 2}, {-2, 2}, {-1, 1}, {0, 1}, {-2, 2}, {-2, 2}, {-1, 1}, {0, 1},
                      {1e-3, 1e-2}, {0.99, 1}, {0.1, 1}, {0.25, 1}}});
  }
  // The global gradient norm's square over operands of every path: scalar tails (1001, 15),
  // whole chunks (2 x 16384) and many blocks ((1 << 20) + 3), f32 and bf16.
  for (DType dtype : {f32, bf16}) {
    cases.push_back({absl::StrCat("sum_of_squares_", DTypeName(dtype)), kSums, [dtype](Builder& b) -> absl::Status {
                       std::vector<Node*> p = Params(b, {{dtype, {1001}}, {dtype, {3, 5}}, {dtype, {2, 16384}},
                                                         {dtype, {(int64_t{1} << 20) + 3}}});
                       return Ret(b, b.Op(Opcode::kSumOfSquares, p));
                     },
                     {{-2, 2}, {-2, 2}, {-2, 2}, {-2, 2}}});
  }
  // Delayed scaling (tests/gpu_fp8_test.cc checks each op bit for bit on its edge cases): x
  // quantized with its transposed copy by a random state (the exponent floor(state[0]) in
  // [-2, 1], values up to 300 that saturate e4m3 at the larger scales), both copies
  // dequantized, the state stepped with the amax.
  cases.push_back({"fp8_scaling", kExact, [](Builder& b) -> absl::Status {
                     std::vector<Node*> p = Params(b, {{bf16, {67, 130}}, {f32, {6}}});
                     absl::StatusOr<std::vector<Node*>> q = b.MultiResultOp(
                         Opcode::kFp8Quantize, p, AttrMap{{"out_dtype", Symbol{"f8e4m3"}}, {"transposed", int64_t{1}}});
                     if (!q.ok()) return q.status();
                     absl::StatusOr<Node*> dq =
                         b.Op(Opcode::kFp8Dequantize, {(*q)[0], (*q)[2]}, AttrMap{{"out_dtype", Symbol{"f32"}}});
                     if (!dq.ok()) return dq.status();
                     absl::StatusOr<Node*> dqt =
                         b.Op(Opcode::kFp8Dequantize, {(*q)[3], (*q)[2]}, AttrMap{{"out_dtype", Symbol{"bf16"}}});
                     if (!dqt.ok()) return dqt.status();
                     absl::StatusOr<Node*> next = b.Op(Opcode::kFp8ScaleUpdate, {p[1], (*q)[1]},
                                                       AttrMap{{"fp8_format", Symbol{"f8e4m3"}}, {"margin", int64_t{1}}});
                     if (!next.ok()) return next.status();
                     return b.Return({*dq, *dqt, (*q)[1], *next});
                   },
                   {{-300, 300}, {-2, 2}}});
  // The attention family at a GQA shape with head dim 128 (@attention of the all-ops module
  // has 64): forward, statistics, delta and the three backward results.
  cases.push_back({"attention_family_hd128", Tolerance{2e-3, 2e-2},
                   [](Builder& b) { return AttentionFamily(b, 128, 0.088388347648318, /*bf16_o=*/false); },
                   {{-2, 2}, {-2, 2}, {-2, 2}, {-1, 1}}});
  // The same with O stored bf16 ({out_dtype=bf16}, as narrow-activations-bf16 makes a training
  // step's attention) at D 64: the forward's bf16 store, and the delta kernel reading a bf16 O.
  cases.push_back({"attention_family_bf16_o", Tolerance{2e-3, 2e-2},
                   [](Builder& b) { return AttentionFamily(b, 64, 0.125, /*bf16_o=*/true); },
                   {{-2, 2}, {-2, 2}, {-2, 2}, {-1, 1}}});
  // The paged-KV ops at a decode shape: 4 sequences write their new K and V rows into a bf16
  // pool of 2 layers x 8 blocks x 2 kv heads x 16 x 64 (one row is padding, slot -1), then
  // attend over positions up to 40 through block tables (the padding row at -1).
  cases.push_back({"paged_kv_decode", Tolerance{2e-3, 2e-2}, [](Builder& b) -> absl::Status {
                     const DType bf16 = DType::kBF16;
                     std::vector<Node*> p = Params(b, {{bf16, {2, 8, 2, 16, 64}}, {bf16, {2, 8, 2, 16, 64}},
                                                       {bf16, {4, 2, 64}}, {bf16, {4, 2, 64}}, {bf16, {4, 1, 4, 64}}});
                     ASSIGN_OR_RETURN(Node * slots, b.ConstantValues({40, 17, 100, -1}, {DType::kI32, {4}}));
                     ASSIGN_OR_RETURN(Node * tables, b.ConstantValues({0, 1, 2, -1, 3, 1, -1, -1, 7, 6, 5, 4,
                                                                       2, -1, -1, -1},
                                                                      {DType::kI32, {4, 4}}));
                     ASSIGN_OR_RETURN(Node * positions, b.ConstantValues({40, 17, 52, -1}, {DType::kI32, {4, 1}}));
                     const AttrMap layer{{"layer", int64_t{1}}};
                     ASSIGN_OR_RETURN(Node * k, b.Op(Opcode::kKvCacheWrite, {p[0], p[2], slots}, layer));
                     ASSIGN_OR_RETURN(Node * v, b.Op(Opcode::kKvCacheWrite, {p[1], p[3], slots}, layer));
                     ASSIGN_OR_RETURN(Node * o, b.Op(Opcode::kPagedAttention, {p[4], k, v, tables, positions},
                                                     AttrMap{{"layer", int64_t{1}}, {"scale", 0.125}}));
                     return b.Return({o, k, v});
                   },
                   {{-2, 2}, {-2, 2}, {-2, 2}, {-2, 2}, {-1, 1}}});
  // Decode at llama-M's head shape (dim 128, 2 query heads per kv head) over rows of ragged
  // lengths, their blocks scattered over the pool: keys 1, 16, 17 (one key into a second
  // block), 131 and 256 (a full table), and a padding row. The kernel splits each row's
  // blocks 8 ways at run time, so these rows leave splits empty, take one block, or an odd
  // last one.
  // sample_tokens over 16 rows of each parameter kind: greedy; temperatures 0.6, 1 and 1.7
  // alone; top-k 1, 5, 50 and 1000; top-p 0.1, 0.5, 0.95; both; a temperature so small that
  // 1 / it is inf; a seed with its high half set; and a row of parameters out of range (-1).
  // bf16 logits over llama-M's vocabulary (bf16 rounding makes many ties, which the cuts break
  // by id), f32 over GPT-2's odd 50257, and a vocabulary of 7 (fewer tokens than threads).
  for (const auto& [dtype, vocab, spread] : std::vector<std::tuple<DType, int64_t, double>>{
           {DType::kBF16, 32000, 4}, {DType::kF32, 50257, 8}, {DType::kF32, 7, 2}}) {
    cases.push_back({absl::StrCat("sample_tokens_", DTypeName(dtype), "_v", vocab), kExact,
                     [dtype, vocab](Builder& b) -> absl::Status {
                       std::vector<Node*> p = Params(b, {{dtype, {2, 8, vocab}}});
                       const std::vector<std::array<double, 3>> rows = {
                           {0, 0, 1},     {0.6, 0, 1},  {1, 0, 1},    {1.7, 0, 1},   {1, 1, 1},      {1, 5, 1},
                           {0.8, 50, 1},  {1, 1000, 1}, {1, 0, 0.1},  {1, 0, 0.5},   {1.3, 0, 0.95}, {0.9, 40, 0.8},
                           {1e-40, 0, 1}, {1, 0, 1},    {1, 3, 0.99}, {1, -2, 1}};
                       std::vector<double> sampling, draws;
                       for (size_t r = 0; r < rows.size(); ++r) {
                         sampling.insert(sampling.end(), rows[r].begin(), rows[r].end());
                         draws.insert(draws.end(), {static_cast<double>(r * 977 + 1), r == 13 ? -123456.0 : 0.0,
                                                    static_cast<double>(r * 3)});
                       }
                       ASSIGN_OR_RETURN(Node * sampling_node, b.ConstantValues(sampling, {DType::kF32, {2, 8, 3}}));
                       ASSIGN_OR_RETURN(Node * draws_node, b.ConstantValues(draws, {DType::kI32, {2, 8, 3}}));
                       return Ret(b, b.Op(Opcode::kSampleTokens, {p[0], sampling_node, draws_node}, AttrMap{}));
                     },
                     {{-spread, spread}}});
  }
  cases.push_back({"paged_attention_decode_d128_gqa2_ragged", Tolerance{2e-3, 2e-2}, [](Builder& b) -> absl::Status {
                     const DType bf16 = DType::kBF16;
                     std::vector<Node*> p = Params(b, {{bf16, {1, 64, 4, 16, 128}}, {bf16, {1, 64, 4, 16, 128}},
                                                       {bf16, {6, 1, 8, 128}}});
                     std::vector<double> table;
                     for (int row = 0; row < 6; ++row) {
                       for (int j = 0; j < 16; ++j) table.push_back((row * 16 + j * 7 + 5) % 64);
                     }
                     ASSIGN_OR_RETURN(Node * tables, b.ConstantValues(table, {DType::kI32, {6, 16}}));
                     ASSIGN_OR_RETURN(Node * positions, b.ConstantValues({0, 15, 16, 130, 255, -1}, {DType::kI32, {6, 1}}));
                     return Ret(b, b.Op(Opcode::kPagedAttention, {p[2], p[0], p[1], tables, positions},
                                        AttrMap{{"layer", int64_t{0}}, {"scale", 0.088388}}));
                   },
                   {{-2, 2}, {-2, 2}, {-1, 1}}});
  // And at prefill shapes of llama-M's heads (dim 128, 4 query heads per kv head), one
  // sequence's tokens written across blocks of 16 in table order {4, 1, 7, 0, 9, 3, 11, 2, 5,
  // 10} and attending causally, the last 3 rows padding (position and slot -1): 20 tokens
  // (40 row-heads: the kernel splits the keys) and 140 (280: one split, no combine).
  for (int64_t tokens : {20, 140}) {
    cases.push_back({absl::StrCat("paged_kv_prefill_t", tokens, "_d128_gqa4"), Tolerance{2e-3, 2e-2},
                     [tokens](Builder& b) -> absl::Status {
                       const DType bf16 = DType::kBF16;
                       const std::vector<double> table = {4, 1, 7, 0, 9, 3, 11, 2, 5, 10};
                       std::vector<Node*> p = Params(b, {{bf16, {1, 12, 2, 16, 128}}, {bf16, {1, 12, 2, 16, 128}},
                                                         {bf16, {tokens, 2, 128}}, {bf16, {tokens, 2, 128}},
                                                         {bf16, {1, tokens, 8, 128}}});
                       std::vector<double> slots, positions;
                       for (int64_t i = 0; i < tokens; ++i) {
                         const bool padding = i >= tokens - 3;
                         positions.push_back(padding ? -1 : i);
                         slots.push_back(padding ? -1 : table[i / 16] * 16 + i % 16);
                       }
                       ASSIGN_OR_RETURN(Node * slot_values, b.ConstantValues(slots, {DType::kI32, {tokens}}));
                       ASSIGN_OR_RETURN(Node * tables, b.ConstantValues(table, {DType::kI32, {1, 10}}));
                       ASSIGN_OR_RETURN(Node * position_values, b.ConstantValues(positions, {DType::kI32, {1, tokens}}));
                       const AttrMap layer{{"layer", int64_t{0}}};
                       ASSIGN_OR_RETURN(Node * k, b.Op(Opcode::kKvCacheWrite, {p[0], p[2], slot_values}, layer));
                       ASSIGN_OR_RETURN(Node * v, b.Op(Opcode::kKvCacheWrite, {p[1], p[3], slot_values}, layer));
                       ASSIGN_OR_RETURN(Node * o, b.Op(Opcode::kPagedAttention, {p[4], k, v, tables, position_values},
                                                       AttrMap{{"layer", int64_t{0}}, {"scale", 0.088388}}));
                       return b.Return({o, k, v});
                     },
                     {{-2, 2}, {-2, 2}, {-2, 2}, {-2, 2}, {-1, 1}}});
  }
  // Prefill over cached prefixes at llama-M's heads (dim 128, 2 query heads per kv head): the
  // tensor-core kernel takes 8 query rows of a sequence a block (kernels/paged_kv.cuh, kQRows),
  // each row with its own causal limit. 2 sequences of 16 new tokens after cached prefixes of 37
  // and 100 keys, the second's last 3 rows padding (3 splits a block: the combine kernel); and
  // 1 sequence of 8 after 150 (8 rows: the fold). Tables scattered over a pool of 32 blocks.
  for (const auto& [batch, tokens] : {std::pair<int64_t, int64_t>{2, 16}, {1, 8}}) {
    cases.push_back({absl::StrCat("paged_attention_prefill_cached_b", batch, "_t", tokens, "_d128_gqa2"),
                     Tolerance{2e-3, 2e-2}, [batch, tokens](Builder& b) -> absl::Status {
                       const DType bf16 = DType::kBF16;
                       std::vector<Node*> p = Params(b, {{bf16, {1, 32, 4, 16, 128}}, {bf16, {1, 32, 4, 16, 128}},
                                                         {bf16, {batch, tokens, 8, 128}}});
                       std::vector<double> table, positions;
                       const int64_t prefix[] = {batch == 1 ? 150 : 37, 100};
                       for (int64_t s = 0; s < batch; ++s) {
                         for (int64_t j = 0; j < 12; ++j) table.push_back((s * 12 + j * 5 + 3) % 32);
                         for (int64_t t = 0; t < tokens; ++t) {
                           positions.push_back(s == 1 && t >= tokens - 3 ? -1 : prefix[s] + t);
                         }
                       }
                       ASSIGN_OR_RETURN(Node * tables, b.ConstantValues(table, {DType::kI32, {batch, 12}}));
                       ASSIGN_OR_RETURN(Node * position_values,
                                        b.ConstantValues(positions, {DType::kI32, {batch, tokens}}));
                       return Ret(b, b.Op(Opcode::kPagedAttention, {p[2], p[0], p[1], tables, position_values},
                                          AttrMap{{"layer", int64_t{0}}, {"scale", 0.088388}}));
                     },
                     {{-2, 2}, {-2, 2}, {-1, 1}}});
  }
  // Fusion nodes as fuse-loops makes them: a loop fusion over a broadcast, and a reduction
  // fusion over an elementwise chain (the fused kernels' own paths, beside the all-ops ones).
  cases.push_back({"fusion_loop_and_reduction", kFewUlps, [](Builder& b) -> absl::Status {
                     std::vector<Node*> p = Params(b, {{bf16, {33, 1031}}, {f32, {1031}}});
                     ASSIGN_OR_RETURN(Node * x, b.Convert(p[0], f32));
                     ASSIGN_OR_RETURN(Node * wb, b.Broadcast(p[1], {1}, {33, 1031}));
                     ASSIGN_OR_RETURN(Node * y, b.Mul(x, wb));
                     ASSIGN_OR_RETURN(Node * s, b.Unary(Opcode::kSigmoid, y));
                     ASSIGN_OR_RETURN(Node * out, b.Convert(s, bf16));
                     ASSIGN_OR_RETURN(Node * x2, b.Convert(p[0], f32));
                     ASSIGN_OR_RETURN(Node * sq, b.Mul(x2, x2));
                     ASSIGN_OR_RETURN(Node * sum, b.ReduceSum(sq, {1}));
                     RETURN_IF_ERROR(b.Return({out, sum}));
                     ASSIGN_OR_RETURN(bool fused, FusionPass().RunOnFunction(*b.function()));
                     if (!fused) return absl::InternalError("fuse-loops made no fusion");
                     return absl::OkStatus();
                   },
                   {{-2, 2}, {-2, 2}}});
  // A loop fusion on its vector path: bf16 and f32 inputs read at the element's own index move
  // as 8-lane vectors (16 and 32 bytes), the broadcast weight element by element, and the
  // count (64 x 4104) leaves no tail; the odd case above runs the tail loop.
  cases.push_back({"fusion_loop_vectors", kFewUlps, [](Builder& b) -> absl::Status {
                     std::vector<Node*> p = Params(b, {{bf16, {64, 4104}}, {f32, {64, 4104}}, {f32, {4104}}});
                     ASSIGN_OR_RETURN(Node * x, b.Convert(p[0], f32));
                     ASSIGN_OR_RETURN(Node * s, b.Unary(Opcode::kSigmoid, x));
                     ASSIGN_OR_RETURN(Node * y, b.Mul(s, p[1]));
                     ASSIGN_OR_RETURN(Node * wb, b.Broadcast(p[2], {1}, {64, 4104}));
                     ASSIGN_OR_RETURN(Node * z, b.Add(y, wb));
                     ASSIGN_OR_RETURN(Node * out, b.Convert(z, bf16));
                     RETURN_IF_ERROR(b.Return({out}));
                     ASSIGN_OR_RETURN(bool fused, FusionPass().RunOnFunction(*b.function()));
                     if (!fused) return absl::InternalError("fuse-loops made no fusion");
                     return absl::OkStatus();
                   },
                   {{-2, 2}, {-2, 2}, {-2, 2}}});
  // A loop fusion of two results, as rematerialize makes it: the SwiGLU VJP's kernel also
  // recomputes silu(g) * u for a late reader (37 x 1029: whole vectors and a tail).
  cases.push_back({"fusion_two_results_rematerialized", kFewUlps, [](Builder& b) -> absl::Status {
                     const std::vector<int64_t> shape = {37, 1029};
                     std::vector<Node*> p = Params(b, {{bf16, shape}, {bf16, shape}, {bf16, shape}});
                     Node *g = p[0], *u = p[1], *d = p[2];
                     ASSIGN_OR_RETURN(Node * s, b.Unary(Opcode::kSigmoid, g));
                     ASSIGN_OR_RETURN(Node * silu, b.Mul(g, s));
                     ASSIGN_OR_RETURN(Node * h, b.Mul(silu, u));
                     ASSIGN_OR_RETURN(Node * early, b.ReduceSum(h, {1}));
                     Node* chain = early;
                     for (int i = 0; i < 6; ++i) {
                       ASSIGN_OR_RETURN(chain, b.Unary(Opcode::kNeg, chain));
                     }
                     ASSIGN_OR_RETURN(Node * late, b.ReduceSum(h, {0}));
                     ASSIGN_OR_RETURN(Node * s2, b.Unary(Opcode::kSigmoid, g));
                     ASSIGN_OR_RETURN(Node * du, b.Mul(d, s2));
                     ASSIGN_OR_RETURN(Node * dg, b.Mul(du, u));
                     RETURN_IF_ERROR(b.Return({chain, late, dg}));
                     ASSIGN_OR_RETURN(bool fused, FusionPass().RunOnFunction(*b.function()));
                     if (!fused) return absl::InternalError("fuse-loops made no fusion");
                     ASSIGN_OR_RETURN(bool merged, RematerializePass(0, 4).RunOnFunction(*b.function()));
                     if (!merged) return absl::InternalError("rematerialize merged nothing");
                     return absl::OkStatus();
                   },
                   {{-2, 2}, {-2, 2}, {-2, 2}}});
  // Slices and concatenates inside fusions (their index maps, a branch per concatenated
  // operand): a strided slice of a wider input, as the GPT-2 QKV split reads its GEMM's
  // output, and a concatenate of computed pieces, as its backward assembles d(qkv), feeding
  // a transpose, a convert and a reduction.
  cases.push_back({"fusion_slice_concatenate", kFewUlps, [](Builder& b) -> absl::Status {
                     std::vector<Node*> p = Params(b, {{f32, {6, 40, 24}}, {bf16, {6, 8, 24}}});
                     ASSIGN_OR_RETURN(Node * s, b.Slice(p[0], {0, 3, 0}, {6, 35, 24}, {1, 2, 1}));
                     ASSIGN_OR_RETURN(Node * sq, b.Mul(s, s));
                     ASSIGN_OR_RETURN(Node * y, b.Convert(p[1], f32));
                     ASSIGN_OR_RETURN(Node * e, b.Unary(Opcode::kExp, y));
                     ASSIGN_OR_RETURN(Node * c, b.Concatenate({sq, e, y}, 1));
                     ASSIGN_OR_RETURN(Node * t, b.Transpose(c, {0, 2, 1}));
                     ASSIGN_OR_RETURN(Node * out, b.Convert(t, bf16));
                     ASSIGN_OR_RETURN(Node * y2, b.Convert(p[1], f32));
                     ASSIGN_OR_RETURN(Node * c2, b.Concatenate({y2, y2}, 2));
                     ASSIGN_OR_RETURN(Node * sum, b.ReduceSum(c2, {1}));
                     RETURN_IF_ERROR(b.Return({out, sum}));
                     ASSIGN_OR_RETURN(bool fused, FusionPass().RunOnFunction(*b.function()));
                     if (!fused) return absl::InternalError("fuse-loops made no fusion");
                     int64_t fusions = 0;
                     for (const auto& n : b.function()->nodes()) fusions += n->opcode() == Opcode::kFusion;
                     if (fusions != 2) return absl::InternalError(absl::StrCat("expected 2 fusions, got ", fusions));
                     return absl::OkStatus();
                   },
                   {{-2, 2}, {-2, 2}}});
  // Vectors carried through index maps that keep the last dim (lower_fusion.cc's runs): GPT-2's
  // q split from the qkv GEMM's output (slice at a multiple of 8, reshape into heads,
  // transpose), beside a slice off a multiple of 8 and a broadcast row, all in one kernel; and
  // the backward's d(qkv) assembled from dq, dk, dv (convert, transpose, reshape, concatenates
  // with zeros along the last dim, adds), with a concatenate along a leading dim too.
  cases.push_back({"fusion_runs_qkv_split", kFewUlps, [](Builder& b) -> absl::Status {
                     std::vector<Node*> p = Params(b, {{bf16, {2, 24, 2304}}, {f32, {64}}});
                     ASSIGN_OR_RETURN(Node * q, b.Slice(p[0], {0, 0, 768}, {2, 24, 1536}, {1, 1, 1}));
                     ASSIGN_OR_RETURN(Node * off, b.Slice(p[0], {0, 0, 764}, {2, 24, 1532}, {1, 1, 1}));
                     ASSIGN_OR_RETURN(Node * sum, b.Add(q, off));
                     ASSIGN_OR_RETURN(Node * heads, b.Reshape(sum, {2, 24, 12, 64}));
                     ASSIGN_OR_RETURN(Node * t, b.Transpose(heads, {0, 2, 1, 3}));
                     ASSIGN_OR_RETURN(Node * f, b.Convert(t, f32));
                     ASSIGN_OR_RETURN(Node * row, b.Broadcast(p[1], {3}, {2, 12, 24, 64}));
                     ASSIGN_OR_RETURN(Node * scaled, b.Mul(f, row));
                     ASSIGN_OR_RETURN(Node * out, b.Convert(scaled, bf16));
                     RETURN_IF_ERROR(b.Return({out}));
                     ASSIGN_OR_RETURN(bool fused, FusionPass().RunOnFunction(*b.function()));
                     if (!fused) return absl::InternalError("fuse-loops made no fusion");
                     return absl::OkStatus();
                   },
                   {{-2, 2}, {-2, 2}}});
  cases.push_back({"fusion_runs_qkv_grad", kFewUlps, [](Builder& b) -> absl::Status {
                     const std::vector<int64_t> heads = {2, 12, 24, 64};
                     std::vector<Node*> p = Params(b, {{f32, heads}, {f32, heads}, {f32, heads}});
                     std::vector<Node*> rows;
                     for (Node* g : p) {
                       ASSIGN_OR_RETURN(Node * narrow, b.Convert(g, bf16));
                       ASSIGN_OR_RETURN(Node * t, b.Transpose(narrow, {0, 2, 1, 3}));
                       ASSIGN_OR_RETURN(Node * r, b.Reshape(t, {2, 24, 768}));
                       rows.push_back(r);
                     }
                     ASSIGN_OR_RETURN(Node * zeros2, b.Constant(0.0, {bf16, {2, 24, 1536}}));
                     ASSIGN_OR_RETURN(Node * zeros1, b.Constant(0.0, {bf16, {2, 24, 768}}));
                     ASSIGN_OR_RETURN(Node * dq, b.Concatenate({rows[0], zeros2}, 2));
                     ASSIGN_OR_RETURN(Node * dk, b.Concatenate({zeros1, rows[1], zeros1}, 2));
                     ASSIGN_OR_RETURN(Node * dv, b.Concatenate({zeros2, rows[2]}, 2));
                     ASSIGN_OR_RETURN(Node * qk, b.Add(dq, dk));
                     ASSIGN_OR_RETURN(Node * qkv, b.Add(qk, dv));
                     ASSIGN_OR_RETURN(Node * halves, b.Concatenate({rows[0], rows[1]}, 1));  // [2, 48, 768]
                     ASSIGN_OR_RETURN(Node * doubled, b.Add(halves, halves));
                     RETURN_IF_ERROR(b.Return({qkv, doubled}));
                     ASSIGN_OR_RETURN(bool fused, FusionPass().RunOnFunction(*b.function()));
                     if (!fused) return absl::InternalError("fuse-loops made no fusion");
                     return absl::OkStatus();
                   },
                   {{-2, 2}, {-2, 2}, {-2, 2}}});
  cases.push_back({"add_large", kExact, [](Builder& b) {
                     std::vector<Node*> p = Params(b, {{bf16, {(1 << 20) + 3}}, {bf16, {(1 << 20) + 3}}});
                     return Ret(b, b.Add(p[0], p[1]));
                   }});
  return cases;
}

// Each case is a function of one module, so that its kernels compile together.
struct CaseModule {
  std::vector<OpCase> cases;
  Module module{"gpu_ops"};
};

const CaseModule& Cases() {
  static const CaseModule* m = [] {
    auto* cm = new CaseModule;
    cm->cases = OpCases();
    for (const OpCase& c : cm->cases) {
      Builder b(cm->module.AddFunction(c.name));
      absl::Status st = c.build(b);
      if (!st.ok()) std::fprintf(stderr, "gpu_ops_test: building %s: %s\n", c.name.c_str(), std::string(st.message()).c_str());
    }
    return cm;
  }();
  return *m;
}

TEST(GpuOps, CasesCoverEveryOpAndVerify) {
  std::set<Opcode> used;
  for (const auto& f : Cases().module.functions()) {
    EXPECT_TRUE(VerifyFunction(*f).ok()) << f->name() << ": " << VerifyFunction(*f);
    for (const auto& n : f->nodes()) used.insert(n->opcode());
  }
  for (int i = 0; i < kNumOpcodes; ++i) {
    EXPECT_TRUE(used.count(static_cast<Opcode>(i))) << OpName(static_cast<Opcode>(i)) << " has no GPU test case";
  }
}

TEST(GpuOps, EveryOpMatchesTheReference) {
  KILN_REQUIRE_GPU();
  // Compile every case's kernels at once, on every core, into the kernel cache; each
  // executable below then reads its kernels from the cache.
  absl::StatusOr<KernelCache> cache = KernelCache::Open();
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::unique_ptr<Module> lowered = CloneModule(Cases().module);  // as every compile: dot_general -> gemm
  ASSERT_TRUE(LowerGemmPass().Run(*lowered).ok());
  absl::StatusOr<KernelCompileReport> warm = CompileModuleKernels(*lowered, {.arch = Device()->arch()}, &*cache);
  ASSERT_TRUE(warm.ok()) << warm.status();
  std::printf("compiled %lld distinct kernels (%lld from the cache) in %.1f s\n",
              static_cast<long long>(warm->num_distinct), static_cast<long long>(warm->cache_hits), warm->wall_seconds);
  const std::vector<OpCase>& cases = Cases().cases;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const Function& f = *Cases().module.functions()[i];
    for (uint64_t seed : {1, 2}) {
      ExpectMatchesReference(f, RandomArgs(f, seed, cases[i].ranges), [&](int) { return cases[i].tol; });
    }
  }
}

TEST(GpuOps, AllOpsModuleMatchesTheReference) {
  KILN_REQUIRE_GPU();
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  const Function& f = *m->functions()[0];
  // x, w, ids (rows of a 5-row table), table, labels (of 4 classes), positions.
  const std::vector<std::pair<double, double>> ranges = {{-2, 2}, {-2, 2}, {0, 5}, {-2, 2}, {0, 4}, {0, 64}};
  for (uint64_t seed : {3, 4, 5}) {
    // Chains of transcendental ops compound their few ulps.
    ExpectMatchesReference(f, RandomArgs(f, seed, ranges), [](int) { return Tolerance{1e-5, 1e-5}; });
  }
}

// The attention family (the flash kernels) against the reference's double-precision
// definition. Differences: fp32 accumulation order, and where P or dS sits at a bf16
// rounding boundary the two sides may round it to neighbouring values (one bf16 ulp of a
// term, times the other factor); tests/flash_attention_kernel_test.cc bounds each element.
TEST(GpuOps, AttentionFunctionMatchesTheReference) {
  KILN_REQUIRE_GPU();
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  const Function& f = *m->FindFunction("attention");
  for (uint64_t seed : {5, 6}) {
    ExpectMatchesReference(f, RandomArgs(f, seed, {{-2, 2}, {-2, 2}, {-2, 2}, {-1, 1}}),
                           [](int) { return Tolerance{2e-3, 2e-2}; });
  }
}

// The same module with every loop chain fused (passes/fusion.h): the generated group kernels
// compute what the nodes compute one by one.
TEST(GpuOps, FusedAllOpsModuleMatchesTheReference) {
  KILN_REQUIRE_GPU();
  std::unique_ptr<Module> m = testing::BuildAllOpsModule();
  FusionPass fusion;
  absl::StatusOr<bool> fused = fusion.Run(*m);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(*fused);
  const Function& f = *m->functions()[0];
  const std::vector<std::pair<double, double>> ranges = {{-2, 2}, {-2, 2}, {0, 5}, {-2, 2}, {0, 4}, {0, 64}};
  for (uint64_t seed : {3, 4}) {
    ExpectMatchesReference(f, RandomArgs(f, seed, ranges), [](int) { return Tolerance{1e-5, 1e-5}; });
  }
}

// Reductions rooting kernel groups (their operand computed inside the reduction, never
// stored) against the reference, in every reduction scheme.
TEST(GpuOps, FusedReductionsMatchTheReference) {
  KILN_REQUIRE_GPU();
  for (const auto& [shape, dims, result] : testing::ReductionShapesOfEveryScheme()) {
    SCOPED_TRACE(shape);
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(absl::StrCat(R"(module @m
func @main {
  %g = parameter() {index=0} : bf16)", shape, R"(
  %c = parameter() {index=1} : f32[]
  %cb = broadcast(%c) {dims=[]} : f32)", shape, R"(
  %f = convert(%g) : f32)", shape, R"(
  %s = mul(%f, %cb) : f32)", shape, R"(
  %sq = mul(%s, %s) : f32)", shape, R"(
  %r = reduce_sum(%sq) {dims=)", dims, R"(} : f32)", result, R"(
  %n = neg(%f) : f32)", shape, R"(
  %x = reduce_max(%n) {dims=)", dims, R"(} : f32)", result, R"(
  return %r, %x
})"));
    ASSERT_TRUE(m.ok()) << m.status();
    FusionPass fusion;
    ASSERT_TRUE(fusion.Run(**m).ok());
    const Function& f = *(*m)->functions()[0];
    ExpectMatchesReference(f, RandomArgs(f, 7, {{-2, 2}, {0.5, 1.5}}), [](int) { return kSums; });
  }
}

// The column reductions of a training step at their real shapes ([16384, C] -> [C]: GPT-2's
// bias gradients and the norm-bias gradients over 16 x 1024 tokens), f32 and bf16, plain
// and fused (a bf16 gradient converted inside the reduction): two stages through the node's
// scratch (codegen/reduction_lowering.cc), checked against the reference and for bitwise
// equal results run to run (no atomics: the folding order is fixed at compile time).
// Expected time at ~4 TB/s, for the lead's --report: f32 [16384,768] ~13 us, [16384,2304]
// ~38 us, [16384,3072] ~50 us; bf16 half of each.
TEST(GpuOps, ColumnReductionsOfTrainingShapesMatchTheReferenceAndRepeatBitwise) {
  KILN_REQUIRE_GPU();
  for (int64_t columns : {768, 2304, 3072}) {
    for (const char* dtype : {"f32", "bf16"}) {
      const std::string x = absl::StrCat(dtype, "[16384,", columns, "]");
      SCOPED_TRACE(x);
      absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : )", x, R"(
  %plain = reduce_sum(%x) {dims=[0]} : )", dtype, "[", columns, R"(]
  %f = convert(%x) : f32[16384,)", columns, R"(]
  %fused = reduce_sum(%f) {dims=[0]} : f32[)", columns, R"(]
  return %plain, %fused
})"));
      ASSERT_TRUE(m.ok()) << m.status();
      FusionPass fusion;
      ASSERT_TRUE(fusion.Run(**m).ok());
      const Function& f = *(*m)->functions()[0];
      const std::vector<HostTensor> args = RandomArgs(f, 11, {{-2, 2}});
      ExpectMatchesReference(f, args, [](int) { return kSums; });
      const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
      absl::StatusOr<std::vector<HostTensor>> first = EvaluateOnGpu(*lowered->functions()[0], args, *Device(), {});
      absl::StatusOr<std::vector<HostTensor>> second = EvaluateOnGpu(*lowered->functions()[0], args, *Device(), {});
      ASSERT_TRUE(first.ok() && second.ok()) << first.status() << " " << second.status();
      for (size_t o = 0; o < first->size(); ++o) {
        EXPECT_EQ(Mismatches((*second)[o], (*first)[o], kExact), "") << "output " << o << " differs run to run";
      }
    }
  }
}

// The input gradients {weight_grad=1} (fuse-residual-norm's merge of rms_norm_grad_weight):
// dx, its copy and dw against the reference, and against the unmerged kernels on the GPU:
// dx bit for bit (the same row kernel and geometry), dw within the sum tolerance (another
// fixed order); and bitwise equal run to run (no atomics). Shapes: a warp per row with
// 16-byte accesses (64, 768, 1000 wide), the scalar path (33: not a multiple of the vector
// width), a block per row (2048), few rows and many (16384 x 768, llama-S's; 8192 x 2048,
// llama-M's), f32 and bf16 dy. Expected time of the 16384 x 768 f32 merged node at ~4 TB/s:
// ~40 us (x, dy, dres read once, dx and its copy written), against ~40 us for the input
// gradient plus ~25-65 us for rms_norm_grad_weight before.
TEST(GpuOps, InputGradientsWithTheWeightGradientMatchTheReferenceAndRepeatBitwise) {
  KILN_REQUIRE_GPU();
  struct Shape {
    std::string dims;  // the input's, e.g. "[2,3,64]"
    int64_t rows, width;
    const char* dy;
  };
  for (const Shape& s : std::vector<Shape>{{"[2,3,64]", 6, 64, "f32"},
                                           {"[5,33]", 5, 33, "f32"},
                                           {"[1,768]", 1, 768, "f32"},
                                           {"[300,1000]", 300, 1000, "f32"},
                                           {"[3,2048]", 3, 2048, "f32"},
                                           {"[1027,33]", 1027, 33, "f32"},
                                           {"[16,1024,768]", 16384, 768, "f32"},
                                           {"[16384,768]", 16384, 768, "bf16"},
                                           {"[8192,2048]", 8192, 2048, "f32"}}) {
    const std::string x = absl::StrCat("f32", s.dims), dy = absl::StrCat(s.dy, s.dims),
                      w = absl::StrCat("f32[", s.width, "]");
    SCOPED_TRACE(absl::StrCat(x, " dy ", dy));
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(absl::StrCat(
        "module @m\nfunc @main {\n", "  %x = parameter() {index=0} : ", x, "\n  %w = parameter() {index=1} : ", w,
        "\n  %dy = parameter() {index=2} : ", dy, "\n  %dres = parameter() {index=3} : ", x,
        "\n  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : ", x,
        "\n  %gw = rms_norm_grad_weight(%x, %w, %dy) {eps=1e-05} : ", w,
        "\n  %ai = add_rms_norm_grad_input(%dres, %x, %w, %dy) {eps=1e-05} : ", x,
        "\n  %dx, %dw = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05, weight_grad=1} : (", x, ", ", w, ")",
        "\n  %rx, %rc, %rw = add_rms_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05, weight_grad=1} : (",
        x, ", bf16", s.dims, ", ", w, ")",
        "\n  %sx, %sw = add_rms_norm_grad_input(%dres, %x, %w, %dy) {eps=1e-05, weight_grad=1} : (", x, ", ", w, ")",
        "\n  %ax, %ac = add_rms_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05} : (", x, ", bf16",
        s.dims, ")",
        "\n  return %gi, %gw, %ai, %dx, %dw, %rx, %rc, %rw, %sx, %sw, %ax, %ac\n}\n"));
    ASSERT_TRUE(m.ok()) << m.status();
    const Function& f = *(*m)->functions()[0];
    const std::vector<HostTensor> args = RandomArgs(f, 13, {{-2, 2}, {-2, 2}, {-2, 2}, {-2, 2}});
    // dw sums a term per row in f32: its absolute error grows about with sqrt(rows).
    const Tolerance dw_tol{kSums.rtol, std::max(kSums.atol, 2e-5 * std::sqrt(static_cast<double>(s.rows)))};
    const std::set<int> dws = {1, 4, 7, 9};
    ExpectMatchesReference(f, args, [&](int o) { return dws.count(o) ? dw_tol : kSums; });
    const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
    absl::StatusOr<std::vector<HostTensor>> first =
        EvaluateOnGpu(*lowered->functions()[0], args, *Device(), {.poison_arena = true});
    absl::StatusOr<std::vector<HostTensor>> second = EvaluateOnGpu(*lowered->functions()[0], args, *Device(), {});
    ASSERT_TRUE(first.ok() && second.ok()) << first.status() << " " << second.status();
    for (size_t o = 0; o < first->size(); ++o) {
      EXPECT_EQ(Mismatches((*second)[o], (*first)[o], kExact), "") << "output " << o << " differs run to run";
    }
    const std::vector<HostTensor>& g = *first;
    EXPECT_EQ(Mismatches(g[3], g[0], kExact), "") << "dx {weight_grad=1} is not rms_norm_grad_input's, bit for bit";
    // With a bf16 copy the rows move 8 elements per access instead of 4 (the narrowest dtype
    // sets the width), so the row sums' order is the copying kernel's: compare with that one.
    EXPECT_EQ(Mismatches(g[5], g[10], kExact), "") << "dx {weight_grad=1} is not add_rms_norm_grad_input's";
    EXPECT_EQ(Mismatches(g[6], g[11], kExact), "") << "the copy {weight_grad=1} is not add_rms_norm_grad_input's";
    EXPECT_EQ(Mismatches(g[8], g[2], kExact), "") << "dx {weight_grad=1} without the copy";
    for (int o : {4, 7, 9}) EXPECT_EQ(Mismatches(g[o], g[1], dw_tol), "") << "dw (output " << o << ") vs rms_norm_grad_weight's kernel";
  }
}

// fuse-residual-norm's layer_norm backward (layer_norm_grad_input, add_layer_norm_grad_input):
// dx, its copy, dw and db against the reference, and on the GPU against the kernels of the
// decomposition it replaces (LayerNormVjp's: the centered x through rms_norm_grad_input and
// rms_norm_grad_weight, dx centered again, db a reduce_sum), within the sum tolerance (f32
// roundings of the intermediates the fused kernel never stores); dx {weight_grad=1} against
// the plain kernel's bit for bit (same row code and geometry); bitwise equal run to run (no
// atomics). Shapes as the rms_norm test above, GPT-2's [16,1024,768] included, f32 and bf16
// dy. Expected time of the 16 x 1024 x 768 residual node with copy, dw and db at ~4 TB/s: x,
// dy and dres read once (150 MB), dx and its bf16 copy written (75 MB): ~55 us, against
// ~150 us for the decomposition's six kernels (600 MB).
TEST(GpuOps, LayerNormInputGradientsMatchTheReferenceAndTheDecomposition) {
  KILN_REQUIRE_GPU();
  struct Shape {
    std::string dims;  // the input's, e.g. "[2,3,64]"
    std::string leading;  // the dims the bias gradient sums, e.g. "[0,1]"
    std::string row_dims;  // the shape of a row sum, e.g. "[2,3]"
    std::string spread;  // broadcast dims of a row sum back to the input, e.g. "[0,1]"
    int64_t rows, width;
    const char* dy;
  };
  for (const Shape& s : std::vector<Shape>{{"[2,3,64]", "[0,1]", "[2,3]", "[0,1]", 6, 64, "f32"},
                                           {"[5,33]", "[0]", "[5]", "[0]", 5, 33, "f32"},
                                           {"[1,768]", "[0]", "[1]", "[0]", 1, 768, "f32"},
                                           {"[300,1000]", "[0]", "[300]", "[0]", 300, 1000, "f32"},
                                           {"[3,2048]", "[0]", "[3]", "[0]", 3, 2048, "f32"},
                                           {"[1027,33]", "[0]", "[1027]", "[0]", 1027, 33, "f32"},
                                           {"[16,1024,768]", "[0,1]", "[16,1024]", "[0,1]", 16384, 768, "f32"},
                                           {"[16384,768]", "[0]", "[16384]", "[0]", 16384, 768, "bf16"}}) {
    const std::string x = absl::StrCat("f32", s.dims), dy = absl::StrCat(s.dy, s.dims),
                      w = absl::StrCat("f32[", s.width, "]"), rs = absl::StrCat("f32", s.row_dims);
    const std::string last = absl::StrCat("[", std::count(s.dims.begin(), s.dims.end(), ','), "]");
    SCOPED_TRACE(absl::StrCat(x, " dy ", dy));
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(absl::StrCat(
        "module @m\nfunc @main {\n", "  %x = parameter() {index=0} : ", x, "\n  %w = parameter() {index=1} : ", w,
        "\n  %dy = parameter() {index=2} : ", dy, "\n  %dres = parameter() {index=3} : ", x,
        "\n  %k = constant() {value=", absl::StrFormat("%.17g", 1.0 / static_cast<double>(s.width)), "} : ", x,
        // The decomposition, as LayerNormVjp builds it.
        "\n  %s = reduce_sum(%x) {dims=", last, "} : ", rs, "\n  %sb = broadcast(%s) {dims=", s.spread, "} : ", x,
        "\n  %mean = mul(%sb, %k) : ", x, "\n  %c = sub(%x, %mean) : ", x,
        "\n  %dc = rms_norm_grad_input(%c, %w, %dy) {eps=1e-05} : ", x,
        "\n  %s2 = reduce_sum(%dc) {dims=", last, "} : ", rs, "\n  %s2b = broadcast(%s2) {dims=", s.spread, "} : ", x,
        "\n  %mean2 = mul(%s2b, %k) : ", x, "\n  %dxc = sub(%dc, %mean2) : ", x,
        "\n  %ddx = add(%dres, %dxc) : ", x,
        "\n  %ddw = rms_norm_grad_weight(%c, %w, %dy) {eps=1e-05} : ", w,
        "\n  %dyf = convert(%dy) : ", x, "\n  %ddb = reduce_sum(%dyf) {dims=", s.leading, "} : ", w,
        // The fused forms.
        "\n  %gi = layer_norm_grad_input(%x, %w, %dy) {eps=1e-05} : ", x,
        "\n  %dx, %dw, %db = layer_norm_grad_input(%x, %w, %dy) {eps=1e-05, weight_grad=1} : (", x, ", ", w, ", ", w, ")",
        "\n  %rx, %rc, %rw, %rb = add_layer_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05, "
        "weight_grad=1} : (", x, ", bf16", s.dims, ", ", w, ", ", w, ")",
        "\n  %ax, %ac = add_layer_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05} : (", x, ", bf16",
        s.dims, ")",
        "\n  return %dxc, %ddx, %ddw, %ddb, %gi, %dx, %dw, %db, %rx, %rc, %rw, %rb, %ax, %ac\n}\n"));
    ASSERT_TRUE(m.ok()) << m.status();
    const Function& f = *(*m)->functions()[0];
    const std::vector<HostTensor> args = RandomArgs(f, 13, {{-2, 2}, {-2, 2}, {-2, 2}, {-2, 2}});
    // dw and db sum a term per row in f32: their absolute error grows about with sqrt(rows).
    const Tolerance dw_tol{kSums.rtol, std::max(kSums.atol, 2e-5 * std::sqrt(static_cast<double>(s.rows)))};
    const std::set<int> dws = {2, 3, 6, 7, 10, 11};
    ExpectMatchesReference(f, args, [&](int o) { return dws.count(o) ? dw_tol : kSums; });
    const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
    absl::StatusOr<std::vector<HostTensor>> first =
        EvaluateOnGpu(*lowered->functions()[0], args, *Device(), {.poison_arena = true});
    absl::StatusOr<std::vector<HostTensor>> second = EvaluateOnGpu(*lowered->functions()[0], args, *Device(), {});
    ASSERT_TRUE(first.ok() && second.ok()) << first.status() << " " << second.status();
    for (size_t o = 0; o < first->size(); ++o) {
      EXPECT_EQ(Mismatches((*second)[o], (*first)[o], kExact), "") << "output " << o << " differs run to run";
    }
    const std::vector<HostTensor>& g = *first;
    EXPECT_EQ(Mismatches(g[5], g[4], kExact), "") << "dx {weight_grad=1} is not layer_norm_grad_input's, bit for bit";
    EXPECT_EQ(Mismatches(g[8], g[12], kExact), "") << "dx {weight_grad=1} is not add_layer_norm_grad_input's";
    EXPECT_EQ(Mismatches(g[9], g[13], kExact), "") << "the copy {weight_grad=1} is not add_layer_norm_grad_input's";
    EXPECT_EQ(Mismatches(g[4], g[0], kSums), "") << "dx vs the decomposition's kernels";
    EXPECT_EQ(Mismatches(g[8], g[1], kSums), "") << "dres + dx vs the decomposition's kernels";
    for (int o : {6, 10}) EXPECT_EQ(Mismatches(g[o], g[2], dw_tol), "") << "dw (output " << o << ") vs rms_norm_grad_weight's kernel";
    for (int o : {7, 11}) EXPECT_EQ(Mismatches(g[o], g[3], dw_tol), "") << "db (output " << o << ") vs reduce_sum's kernel";
  }
}

// step(p, x) = (p + x, sum(p)) with p' donated to p: state stays on the device across runs.
TEST(GpuExecutable, DonatedOutputsUpdateParametersInPlace) {
  KILN_REQUIRE_GPU();
  Function f("accumulate");
  Builder b(&f);
  Node* p = *b.Parameter("p", {DType::kF32, {3, 100}});
  Node* x = *b.Parameter("x", {DType::kF32, {3, 100}});
  ASSERT_TRUE(b.Return({*b.Add(p, x), *b.ReduceSum(p, {0, 1})}, {0, -1}).ok());
  absl::StatusOr<std::unique_ptr<CudaExecutable>> exe = CompileForGpu(f, *Device(), {.poison_arena = true});
  ASSERT_TRUE(exe.ok()) << exe.status();
  const HostTensor p0 = HostTensor::Random(p->type(), 1), x0 = HostTensor::Random(x->type(), 2);
  ASSERT_TRUE((*exe)->SetInput(0, p0).ok());
  ASSERT_TRUE((*exe)->SetInput(1, x0).ok());
  std::vector<HostTensor> state = {p0, x0};
  for (int run = 0; run < 3; ++run) {
    ASSERT_TRUE((*exe)->Run().ok());
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, state);
    ASSERT_TRUE(want.ok());
    absl::StatusOr<HostTensor> sum = (*exe)->Output(1);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(Mismatches(*sum, (*want)[1], kSums), "") << "run " << run;
    state[0] = (*want)[0];
    absl::StatusOr<HostTensor> p_now = (*exe)->Input(0);
    ASSERT_TRUE(p_now.ok()) << p_now.status();
    EXPECT_EQ(Mismatches(*p_now, state[0], kExact), "") << "run " << run;
  }
  EXPECT_EQ((*exe)->stats().kernels, 2);
}

// (a, b) -> (b, a), each donated to the other: the swap must not read a buffer it already
// overwrote, and the outputs must be this run's values.
TEST(GpuExecutable, SwappingDonationsAndParameterOutputs) {
  KILN_REQUIRE_GPU();
  Function f("swap");
  Builder b(&f);
  Node* a = *b.Parameter("a", {DType::kBF16, {7}});
  Node* c = *b.Parameter("b", {DType::kBF16, {7}});
  ASSERT_TRUE(b.Return({c, a}, {0, 1}).ok());
  absl::StatusOr<std::unique_ptr<CudaExecutable>> exe = CompileForGpu(f, *Device());
  ASSERT_TRUE(exe.ok()) << exe.status();
  const HostTensor a0 = HostTensor::Random(a->type(), 5), b0 = HostTensor::Random(c->type(), 6);
  ASSERT_TRUE((*exe)->SetInput(0, a0).ok());
  ASSERT_TRUE((*exe)->SetInput(1, b0).ok());
  ASSERT_TRUE((*exe)->Run().ok());
  EXPECT_EQ(Mismatches(*(*exe)->Output(0), b0, kExact), "");
  EXPECT_EQ(Mismatches(*(*exe)->Output(1), a0, kExact), "");
  EXPECT_EQ(Mismatches(*(*exe)->Input(0), b0, kExact), "");
  EXPECT_EQ(Mismatches(*(*exe)->Input(1), a0, kExact), "");
  EXPECT_EQ((*exe)->stats().kernels, 0);
}

TEST(GpuExecutable, ErrorsNameTheParameterAndTheTypes) {
  KILN_REQUIRE_GPU();
  Function f("neg");
  Builder b(&f);
  Node* x = *b.Parameter("x", {DType::kF32, {4}});
  ASSERT_TRUE(b.Return({*b.Unary(Opcode::kNeg, x)}).ok());
  absl::StatusOr<std::unique_ptr<CudaExecutable>> exe = CompileForGpu(f, *Device());
  ASSERT_TRUE(exe.ok()) << exe.status();
  absl::Status st = (*exe)->SetInput(0, HostTensor({DType::kBF16, {4}}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("%x: f32[4] given bf16[4]"), absl::string_view::npos) << st;
  EXPECT_EQ((*exe)->SetInput(3, HostTensor({DType::kF32, {4}})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*exe)->Output(1).status().code(), absl::StatusCode::kInvalidArgument);
}

// A capture that cannot happen (the stream is already being captured by someone else) is an
// error naming the function, never a silent run without the graph; once the stream is free,
// the same executable captures, replays and computes the right values.
TEST(GpuExecutable, CaptureFailureIsAnErrorNotAFallback) {
  KILN_REQUIRE_GPU();
  Function f("neg");
  Builder b(&f);
  Node* x = *b.Parameter("x", {DType::kF32, {4}});
  ASSERT_TRUE(b.Return({*b.Unary(Opcode::kNeg, x)}).ok());
  absl::StatusOr<std::unique_ptr<CudaExecutable>> exe = CompileForGpu(f, *Device());
  ASSERT_TRUE(exe.ok()) << exe.status();
  ASSERT_TRUE((*exe)->SetInput(0, HostTensor::FromValues({DType::kF32, {4}}, {1, -2, 3, -4})).ok());
  const cudaStream_t stream = Device()->stream();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status st = (*exe)->Run();
  cudaGraph_t foreign = nullptr;
  cudaStreamEndCapture(stream, &foreign);  // may report the capture invalidated: either way it ends
  if (foreign != nullptr) cudaGraphDestroy(foreign);
  cudaGetLastError();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("capturing @neg into a CUDA graph"), absl::string_view::npos) << st;
  EXPECT_EQ((*exe)->stats().graph_nodes, 0);
  ASSERT_TRUE((*exe)->Run().ok());
  EXPECT_GT((*exe)->stats().graph_nodes, 0);
  absl::StatusOr<HostTensor> y = (*exe)->Output(0);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->values(), (std::vector<double>{-1, 2, -3, 4}));
}

// llama-tiny's whole training step (forward, backward, clipping, AdamW) on the GPU against the
// reference: same loss, same updated state, up to bf16 GEMM accumulation order.
TEST(GpuExecutable, LlamaTinyTrainingStepMatchesTheReference) {
  KILN_REQUIRE_GPU();
  ModelConfig config = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = *BuildLlamaModule(config, {.batch = 4, .seq_len = 32, .precision = Precision::kBf16});
  TrainingStepLayout layout;
  absl::StatusOr<Function*> step = BuildTrainingStep(*m, *m->FindFunction("forward"), {}, &layout);
  ASSERT_TRUE(step.ok()) << step.status();
  const Function& f = **step;
  std::vector<HostTensor> args;
  std::vector<HostTensor> weights = InitLlamaWeights(config, 11);
  for (const HostTensor& w : weights) args.push_back(w);
  for (int k = 0; k < 2; ++k) {
    for (const HostTensor& w : weights) args.push_back(HostTensor(w.type()));  // m, v
  }
  args.push_back(HostTensor({DType::kF32, {}}));  // t
  const TokenBatch batch = SampleBatch(TokenDataset::Default(), 11, 0, 4, 32);
  for (const std::vector<int32_t>* tokens : {&batch.inputs, &batch.targets}) {
    const TensorType type = f.parameters()[args.size()]->type();  // [accumulation steps, B, T]
    args.push_back(HostTensor::FromValues(type, std::vector<double>(tokens->begin(), tokens->end())));
  }
  args.push_back(HostTensor::FromValues({DType::kF32, {}}, {1e-3}));
  ASSERT_EQ(args.size(), f.parameters().size());
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
  ASSERT_TRUE(want.ok()) << want.status();
  const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
  absl::StatusOr<std::unique_ptr<CudaExecutable>> exe =
      CompileForGpu(*lowered->functions()[0], *Device(), {.poison_arena = true});
  ASSERT_TRUE(exe.ok()) << exe.status();
  for (size_t i = 0; i < args.size(); ++i) ASSERT_TRUE((*exe)->SetInput(i, args[i]).ok());
  ASSERT_TRUE((*exe)->Run().ok());
  const CudaExecutable::Stats& s = (*exe)->stats();
  std::printf("llama-tiny step: %lld kernels, %lld GEMMs, %lld distinct kernels, arena %.1f MiB, %.1f s to create\n",
              static_cast<long long>(s.kernels), static_cast<long long>(s.gemms),
              static_cast<long long>(s.distinct_kernels), s.arena_bytes / 1048576.0, s.compile_seconds);
  for (size_t o = 0; o < want->size(); ++o) {
    absl::StatusOr<HostTensor> got = (*exe)->Output(static_cast<int>(o));
    ASSERT_TRUE(got.ok()) << got.status();
    // Normalized by the tensor's largest value: gradients flow through bf16 GEMMs whose
    // accumulation order differs, so a small entry may differ relative to itself.
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < got->num_elements(); ++i) {
      scale = std::max(scale, std::abs((*want)[o][i]));
      worst = std::max(worst, std::abs((*got)[i] - (*want)[o][i]));
      ASSERT_TRUE(std::isfinite((*got)[i])) << "output " << o << " [" << i << "]";
    }
    // Adam's first step moves each parameter by lr·sign(g): a sign flip of a tiny gradient
    // moves it by 2·lr.
    const bool is_param = o >= 1 && o <= static_cast<size_t>(layout.num_params);
    const double allowed = is_param ? 2.5e-3 : 2e-2 * scale + 1e-6;
    EXPECT_LE(worst, allowed) << "output " << o << " (%" << f.outputs()[o]->name() << ") scale " << scale;
  }
}

// llama-S's training step, [16,12,1024,1024] attention tensors and all, in one planned arena:
// three steps on one batch, state donated in place, so the loss must fall.
TEST(GpuExecutable, LlamaSTrainingStepFitsAndLearns) {
  KILN_REQUIRE_GPU();
  ModelConfig config = *PresetConfig("llama-S");
  std::unique_ptr<Module> m = *BuildLlamaModule(config, {.precision = Precision::kBf16});
  TrainingStepLayout layout;
  absl::StatusOr<Function*> step = BuildTrainingStep(*m, *m->FindFunction("forward"), {}, &layout);
  ASSERT_TRUE(step.ok()) << step.status();
  const std::unique_ptr<Module> lowered = testing::LoweredForGpu(**step);
  const Function& f = *lowered->functions()[0];
  absl::StatusOr<std::unique_ptr<CudaExecutable>> exe = CompileForGpu(f, *Device());
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::printf("llama-S step: %s\n", (*exe)->buffer_plan().Summary().c_str());
  int64_t index = 0;
  for (const HostTensor& w : InitLlamaWeights(config, 5)) ASSERT_TRUE((*exe)->SetInput(index++, w).ok());
  for (; index <= layout.t_index(); ++index) {  // m, v and t start at zero
    ASSERT_TRUE((*exe)->SetInput(index, HostTensor(f.parameters()[index]->type())).ok());
  }
  const TokenBatch batch = SampleBatch(TokenDataset::Default(), 5, 0, config.batch, config.seq_len);
  for (const std::vector<int32_t>* tokens : {&batch.inputs, &batch.targets}) {
    const TensorType type = f.parameters()[index]->type();
    ASSERT_TRUE((*exe)->SetInput(index++, HostTensor::FromValues(type, std::vector<double>(tokens->begin(), tokens->end()))).ok());
  }
  ASSERT_TRUE((*exe)->SetInput(index, HostTensor::FromValues({DType::kF32, {}}, {1e-3})).ok());
  std::vector<double> losses;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status st = (*exe)->Run();
    ASSERT_TRUE(st.ok()) << st;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    absl::StatusOr<HostTensor> loss = (*exe)->Output(0);
    ASSERT_TRUE(loss.ok()) << loss.status();
    losses.push_back((*loss)[0]);
    std::printf("llama-S step %d: loss %.4f, %.1f ms (%.0f tok/s)\n", run, losses.back(), ms,
                config.batch * config.seq_len / (ms / 1000));
  }
  const CudaExecutable::Stats& s = (*exe)->stats();
  std::printf("llama-S: %lld kernels, %lld GEMMs, %lld distinct kernels, %.1f s to create\n",
              static_cast<long long>(s.kernels), static_cast<long long>(s.gemms),
              static_cast<long long>(s.distinct_kernels), s.compile_seconds);
  EXPECT_NEAR(losses[0], std::log(32000.0), 1.0);  // near-uniform predictions at initialization
  EXPECT_LT(losses[2], losses[0]);
}

}  // namespace
}  // namespace kiln
