// gemm on cuBLASLt (runtime/cuda/gemm.h): every dot_general layout family, lowered by
// lower-gemm (whose layout analysis tests/lower_gemm_test.cc checks without a GPU), against
// the CPU reference of the dot_general in f32 (pedantic), bf16 -> f32, bf16 -> bf16 and
// f16 -> f32. The tolerance is
// the worst case of f32 summation in any order, (K + 2)·2⁻²⁴·Σ|a||b| per element, plus one
// bf16 ulp of a narrow result; integer-valued operands must give exact results.
// FP8 (gemm {scaled=1}, the TN layout): e4m3 x e4m3, e4m3 x e5m2 and e5m2 x e4m3 into bf16,
// f32 and fp8 with scales and amax, within the error of Hopper's FP8 accumulator (about 13
// fraction bits per tensor-core instruction, not f32's 23: Fp8AccumulationBound) plus an fp8
// D's ulp for the narrow term, and exact for integer-valued operands; without a GPU, the
// descriptions codegen makes and the layouts and dtypes the plan refuses
// (GemmPlan::CheckSupported).
#include "runtime/cuda/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "ir/builder.h"
#include "frontends/gpu_compile.h"
#include "codegen/compile_program.h"
#include "runtime/cuda/executable.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "passes/lower_gemm.h"
#include "runtime/tensor_bytes.h"
#include "tests/testing/dot_cases.h"
#include "tests/testing/gpu.h"
#include "tests/testing/lowered_for_gpu.h"

namespace kiln {
namespace {

using testing::BuildDot;
using testing::DotCase;
using testing::DotCases;

CudaDevice* Device() { return testing::TestDevice(); }

// The dot_general's function run on the GPU as every compile runs it: lowered to a gemm.
absl::StatusOr<std::vector<HostTensor>> GemmOnGpu(const Function& f, const std::vector<HostTensor>& args) {
  return EvaluateOnGpu(*testing::LoweredForGpu(f)->functions()[0], args, *Device(), {.poison_arena = true});
}

// The gemm node of a lowered one-dot function.
const Node* GemmOf(const Function& f) {
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kGemm) return n.get();
  }
  return nullptr;
}

// Σ|a||b| per output element: the reference's dot of the absolute values.
HostTensor AbsDot(const Function& f, const std::vector<HostTensor>& args) {
  std::vector<HostTensor> abs_args;
  for (const HostTensor& t : args) {
    HostTensor a = t;
    for (double& v : a.mutable_values()) v = std::abs(v);
    abs_args.push_back(std::move(a));
  }
  ReferenceOptions exact;
  exact.f32_as_f64 = true;
  absl::StatusOr<std::vector<HostTensor>> r = EvaluateFunction(f, abs_args, exact);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? (*r)[0] : HostTensor();
}

struct GemmDTypes {
  DType in, out;
};

TEST(GpuGemm, EveryLayoutMatchesTheReference) {
  KILN_REQUIRE_GPU();
  for (const DotCase& c : DotCases()) {
    for (GemmDTypes p : {GemmDTypes{DType::kF32, DType::kF32}, GemmDTypes{DType::kBF16, DType::kF32},
                        GemmDTypes{DType::kBF16, DType::kBF16}, GemmDTypes{DType::kF16, DType::kF32}}) {
      SCOPED_TRACE(absl::StrCat(c.name, " ", DTypeName(p.in), " -> ", DTypeName(p.out)));
      Function f(c.name);
      BuildDot(f, c, p.in, p.out);
      std::vector<HostTensor> args = {HostTensor::Random(f.parameters()[0]->type(), 1),
                                      HostTensor::Random(f.parameters()[1]->type(), 2)};
      absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<std::vector<HostTensor>> got = GemmOnGpu(f, args);
      ASSERT_TRUE(got.ok()) << got.status();
      const HostTensor bound = AbsDot(f, args);
      int64_t k = 1;
      for (int64_t d : c.dims.lhs_contract) k *= c.a_dims[d];
      const double narrow = p.out == DType::kF32 ? 0 : 0x1p-7;  // one bf16 ulp: f32 sums may straddle a rounding boundary
      int64_t bad = 0;
      for (int64_t i = 0; i < bound.num_elements(); ++i) {
        const double w = (*want)[0][i], g = (*got)[0][i];
        const double allowed = (k + 2) * 0x1p-24 * bound[i] + narrow * std::abs(w);
        if (!(std::abs(g - w) <= allowed) && ++bad <= 3) {
          ADD_FAILURE() << "[" << i << "] gpu " << g << " reference " << w << " allowed " << allowed;
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(GpuGemm, IntegerValuedOperandsAreExact) {
  KILN_REQUIRE_GPU();
  for (const DotCase& c : DotCases()) {
    SCOPED_TRACE(c.name);
    Function f(c.name);
    BuildDot(f, c, DType::kBF16, DType::kF32);
    std::vector<HostTensor> args;
    for (uint64_t seed : {3, 4}) {
      HostTensor t = HostTensor::Random(f.parameters()[args.size()]->type(), seed, -3, 3);
      for (double& v : t.mutable_values()) v = std::round(v);  // small integers: every sum is exact
      args.push_back(std::move(t));
    }
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
    absl::StatusOr<std::vector<HostTensor>> got = GemmOnGpu(f, args);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_EQ((*got)[0].values(), (*want)[0].values());
  }
}

// epilogue=bias (passes/gemm_bias_epilogue.h) on cuBLASLt's CUBLASLT_EPILOGUE_BIAS, with and
// without C, f32 and bf16 results: integer-valued operands and bias make every sum exact,
// so the GPU must equal the reference's definition bit for bit.
TEST(GpuGemm, BiasEpilogueMatchesTheDefinitionExactly) {
  KILN_REQUIRE_GPU();
  struct Case {
    const char* name;
    const char* out;
    const char* bias;
    bool with_c;
  };
  // (An f32 bias for a bf16 result is refused by cuBLASLt 13.0 on the H200,
  // CUBLAS_STATUS_INVALID_VALUE, so the op takes the result's dtype only.)
  for (const Case& c : {Case{"f32", "f32", "f32", false}, Case{"f32_after_c", "f32", "f32", true},
                        Case{"bf16", "bf16", "bf16", false}}) {
    SCOPED_TRACE(c.name);
    const std::string text = absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[64,32]
  %w = parameter() {index=1} : bf16[32,48]
  %b = parameter() {index=2} : )", c.bias, R"([48]
)", c.with_c ? absl::StrCat("  %c = parameter() {index=3} : ", c.out, "[64,48]\n") : "",
                                          "  %y = gemm(%x, %w, ", c.with_c ? "%c, " : "",
                                          "%b) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=",
                                          c.with_c ? "1.0" : "0.0", ", epilogue=bias, k=32, m=64, n=48} : ", c.out,
                                          R"([64,48]
  return %y
})");
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
    ASSERT_TRUE(m.ok()) << m.status();
    const Function& f = *(*m)->functions()[0];
    std::vector<HostTensor> args;
    for (const Node* p : f.parameters()) {
      HostTensor t = HostTensor::Random(p->type(), 10 + args.size(), -3, 3);
      for (double& v : t.mutable_values()) v = std::round(v);
      args.push_back(std::move(t));
    }
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::vector<HostTensor>> got = EvaluateOnGpu(f, args, *Device(), {.poison_arena = true});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0].values(), (*want)[0].values());
  }
}

// The description codegen makes reads the gemm node alone: its sizes and layouts are the
// lowering's, and the plan's workspace stays within what the memory plan reserves.
TEST(GpuGemm, PlansReadTheGemmNode) {
  KILN_REQUIRE_GPU();
  for (const DotCase& c : DotCases()) {
    SCOPED_TRACE(c.name);
    Function f(c.name);
    Node* dot = BuildDot(f, c, DType::kBF16, DType::kF32);
    absl::StatusOr<GemmShape> shape = AnalyzeDotGeneral(*dot);
    ASSERT_TRUE(shape.ok()) << shape.status();
    const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
    const Node* gemm = GemmOf(*lowered->functions()[0]);
    ASSERT_NE(gemm, nullptr);
    absl::StatusOr<GemmDescription> g = GemmDescriptionOf(*gemm);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(std::vector<int64_t>({g->batch, g->m, g->n, g->k}),
              std::vector<int64_t>({shape->batch, shape->m, shape->n, shape->k}));
    EXPECT_EQ(g->a_k_inner, shape->a_k_inner);
    EXPECT_EQ(g->b_k_inner, shape->b_k_inner);
    absl::StatusOr<std::unique_ptr<GemmPlan>> plan = GemmPlan::Create(*g, *Device());
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_LE((*plan)->workspace_bytes(), g->max_workspace_bytes);
  }
}

// Autotuning may pick any of the heuristic's candidates, and at a decode step's few rows some
// split K (their partial sums added in f32 in the workspace, or in D's type): every candidate
// the plan holds must compute the definition. Integer-valued operands (and C) make every
// partial sum exact, so each candidate's D must equal the reference's bit for bit, a bf16 D
// rounded once.
TEST(GpuGemm, EveryFewRowCandidateIsExact) {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t m, n, k;
    const char* out;
    bool with_c;
  };
  int split_candidates = 0, candidates = 0;
  for (const Case c : {Case{32, 2048, 2048, "bf16", false}, Case{32, 1024, 5632, "f32", true},
                       Case{8, 4096, 2048, "bf16", false}}) {
    SCOPED_TRACE(absl::StrCat("m ", c.m, " n ", c.n, " k ", c.k, " -> ", c.out, c.with_c ? " + C" : ""));
    const std::string text = absl::StrCat(
        "module @few_rows\nfunc @main {\n  %a = parameter() {index=0} : bf16[", c.m, ",", c.k,
        "]\n  %b = parameter() {index=1} : bf16[", c.n, ",", c.k, "]\n",
        c.with_c ? absl::StrCat("  %c = parameter() {index=2} : ", c.out, "[", c.m, ",", c.n, "]\n") : "",
        "  %d = gemm(%a, %b", c.with_c ? ", %c" : "", ") {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=",
        c.with_c ? "1.0" : "0.0", ", epilogue=none, k=", c.k, ", m=", c.m, ", n=", c.n, "} : ", c.out, "[", c.m, ",",
        c.n, "]\n  return %d\n}\n");
    absl::StatusOr<std::unique_ptr<Module>> module = ParseModule(text);
    ASSERT_TRUE(module.ok()) << module.status() << "\n" << text;
    const Function& f = *(*module)->functions()[0];
    ASSERT_NE(GemmOf(f), nullptr);
    absl::StatusOr<GemmDescription> g = GemmDescriptionOf(*GemmOf(f));
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<std::unique_ptr<GemmPlan>> plan = GemmPlan::Create(*g, *Device());
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<HostTensor> args;
    for (size_t i = 0; i < f.parameters().size(); ++i) {
      HostTensor t = HostTensor::Random(f.parameters()[i]->type(), 11 + i, -3, 3);
      for (double& v : t.mutable_values()) v = std::round(v);
      args.push_back(std::move(t));
    }
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
    ASSERT_TRUE(want.ok()) << want.status();
    // Device buffers, filled with the arguments' bytes.
    std::vector<void*> held;
    absl::Cleanup free_all = [&] {
      for (void* p : held) cudaFree(p);
    };
    // A tensor's bytes, or `bytes` of nothing in particular.
    auto upload = [&](const HostTensor* t, int64_t bytes) -> void* {
      const std::string raw = t != nullptr ? EncodeTensorBytes(*t) : std::string();
      void* p = nullptr;
      if (cudaMalloc(&p, std::max<int64_t>(t != nullptr ? raw.size() : bytes, 256)) != cudaSuccess) return nullptr;
      held.push_back(p);
      if (t != nullptr && cudaMemcpy(p, raw.data(), raw.size(), cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
      return p;
    };
    const int64_t out_bytes = c.m * c.n * DTypeBytes(f.outputs()[0]->type().dtype);
    GemmBuffers buffers{.out = upload(nullptr, out_bytes), .a = upload(&args[0], 0), .b = upload(&args[1], 0),
                        .c = c.with_c ? upload(&args[2], 0) : nullptr,
                        .scratch = upload(nullptr, g->max_workspace_bytes)};
    ASSERT_TRUE(buffers.out != nullptr && buffers.a != nullptr && buffers.b != nullptr && buffers.scratch != nullptr);
    for (int rank = 0; rank < (*plan)->num_candidates(); ++rank) {
      SCOPED_TRACE(absl::StrCat("candidate ", rank, ": ", (*plan)->CandidateSummary(rank)));
      ++candidates;
      if ((*plan)->CandidateSummary(rank).find("split-K 1 ") == std::string::npos) ++split_candidates;
      ASSERT_TRUE((*plan)->UseCandidate(rank).ok());
      ASSERT_EQ(cudaMemset(buffers.out, 0xFF, out_bytes), cudaSuccess);  // NaN until written
      const absl::Status enqueued = (*plan)->Enqueue(buffers, Device()->stream());
      if (!enqueued.ok()) continue;  // an algorithm may refuse the buffers; Autotune skips it too
      ASSERT_EQ(cudaStreamSynchronize(Device()->stream()), cudaSuccess);
      std::string raw(out_bytes, '\0');
      ASSERT_EQ(cudaMemcpy(raw.data(), buffers.out, out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      absl::StatusOr<HostTensor> got = DecodeTensorBytes(f.outputs()[0]->type(), raw);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->values(), (*want)[0].values());
    }
  }
  std::printf("few-row GEMM candidates: %d, of which %d split K\n", candidates, split_candidates);
}

TEST(GpuGemm, UnloweredDotsFailNamingTheNode) {
  Function f("dot");
  Node* dot = BuildDot(f, DotCases()[0], DType::kBF16, DType::kF32);
  absl::StatusOr<GemmDescription> unlowered = GemmDescriptionOf(*dot);
  ASSERT_FALSE(unlowered.ok());
  EXPECT_NE(unlowered.status().message().find("the lower-gemm pass"), absl::string_view::npos) << unlowered.status();
}

// ---- FP8 (gemm {scaled=1}, runtime/cuda/gemm.h) ----------------------------------------

// A scaled gemm as tests write it: a [batch, M, K] (mk) of `a`, b [batch, N, K] (nk) of `b`,
// the scales %sa, %sb (parameters 2, 3) and %sd (parameter 4 for an fp8 D; for another D the
// constant 1, the only d_scale cuBLASLt applies there: codegen/program.h), D of `d`, and with
// `amax` the second result.
struct Fp8Case {
  std::string name;
  DType a, b, d;
  int64_t batch, m, n, k;
  double a_scale, b_scale, d_scale;
  bool amax;
  std::string a_layout = "mk", b_layout = "nk";
};

std::string Fp8GemmText(const Fp8Case& c) {
  auto dims = [&](int64_t rows, int64_t cols) {
    return c.batch > 1 ? absl::StrCat("[", c.batch, ",", rows, ",", cols, "]") : absl::StrCat("[", rows, ",", cols, "]");
  };
  const bool a_mk = c.a_layout == "mk", b_nk = c.b_layout == "nk";
  const std::string d_type = absl::StrCat(DTypeName(c.d), dims(c.m, c.n));
  return absl::StrCat(
      "module @m\nfunc @main {\n",
      "  %a = parameter() {index=0} : ", DTypeName(c.a), a_mk ? dims(c.m, c.k) : dims(c.k, c.m), "\n",
      "  %b = parameter() {index=1} : ", DTypeName(c.b), b_nk ? dims(c.n, c.k) : dims(c.k, c.n), "\n",
      "  %sa = parameter() {index=2} : f32[]\n", "  %sb = parameter() {index=3} : f32[]\n",
      IsFp8(c.d) ? "  %sd = parameter() {index=4} : f32[]\n" : "  %sd = constant() {value=1.0} : f32[]\n",
      c.amax ? "  %d, %amax = gemm(" : "  %d = gemm(", "%a, %b, %sa, %sb, %sd) {a_layout=", c.a_layout,
      ", alpha=1.0", c.amax ? ", amax=1" : "", ", b_layout=", c.b_layout, ", batch=", c.batch,
      ", beta=0.0, epilogue=none, k=", c.k, ", m=", c.m, ", n=", c.n, ", scaled=1} : ",
      c.amax ? absl::StrCat("(", d_type, ", f32[])") : d_type, "\n",
      c.amax ? "  return %d, %amax\n" : "  return %d\n", "}\n");
}

std::unique_ptr<Module> ParseFp8Gemm(const Fp8Case& c) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(Fp8GemmText(c));
  EXPECT_TRUE(m.ok()) << m.status() << "\n" << Fp8GemmText(c);
  return m.ok() ? *std::move(m) : nullptr;
}

// The description codegen makes of the gemm of `m`'s first function.
absl::StatusOr<GemmDescription> DescribeTheGemm(const Module& m) {
  const Node* gemm = GemmOf(*m.functions()[0]);
  if (gemm == nullptr) return absl::InvalidArgumentError("the module has no gemm node");
  return GemmDescriptionOf(*gemm);
}

// The description of `c`'s gemm (a failure of the test if it does not parse).
absl::StatusOr<GemmDescription> DescribeFp8Gemm(const Fp8Case& c) {
  std::unique_ptr<Module> m = ParseFp8Gemm(c);
  if (m == nullptr) return absl::InvalidArgumentError(absl::StrCat(c.name, " does not parse"));
  return DescribeTheGemm(*m);
}

// The operands, rounded to their fp8 dtype as the reference and the GPU both read them:
// uniform in [-2, 2), or with `integers` small integers in [-3, 3], which fp8 holds exactly
// and whose sums (|.| <= 9 K) every accumulator holds exactly too.
std::vector<HostTensor> Fp8Args(const Function& f, const Fp8Case& c, bool integers) {
  std::vector<HostTensor> args;
  for (int i = 0; i < 2; ++i) {
    HostTensor t = HostTensor::Random(f.parameters()[i]->type(), 40 + i, integers ? -3.49 : -2.0, integers ? 3.49 : 2.0);
    if (integers) {
      for (double& v : t.mutable_values()) v = std::round(v);
      t = HostTensor::FromValues(t.type(), t.values());
    }
    args.push_back(std::move(t));
  }
  const TensorType scalar{DType::kF32, {}};
  args.push_back(HostTensor::FromValues(scalar, {c.a_scale}));
  args.push_back(HostTensor::FromValues(scalar, {c.b_scale}));
  if (IsFp8(c.d)) args.push_back(HostTensor::FromValues(scalar, {c.d_scale}));
  return args;
}

// The cases the GPU runs: e4m3 x e4m3 and e4m3 x e5m2 (and e5m2 x e4m3) into bf16, f32 and
// e4m3, the scales 0.5 and 4 (or 0.25, with d_scale 2 or 0.5 for an fp8 D, which keeps D
// inside e4m3's 448), odd shapes, a batch, amax (of an fp8 D: the only one the plan takes).
std::vector<Fp8Case> Fp8Cases() {
  const DType e4m3 = DType::kF8E4M3, e5m2 = DType::kF8E5M2;
  return {
      {"e4m3xe4m3_bf16", e4m3, e4m3, DType::kBF16, 1, 48, 80, 64, 0.5, 4.0, 1.0, false},
      {"e4m3xe4m3_f32", e4m3, e4m3, DType::kF32, 1, 48, 80, 64, 0.5, 4.0, 1.0, false},
      {"e4m3xe5m2_bf16", e4m3, e5m2, DType::kBF16, 1, 48, 80, 64, 0.5, 4.0, 1.0, false},
      {"e5m2xe4m3_f32", e5m2, e4m3, DType::kF32, 1, 112, 40, 96, 4.0, 0.5, 1.0, false},
      {"e4m3xe4m3_bf16_large", e4m3, e4m3, DType::kBF16, 1, 256, 384, 512, 0.5, 4.0, 1.0, false},
      {"e4m3xe4m3_f32_batch3", e4m3, e4m3, DType::kF32, 3, 32, 48, 32, 0.5, 4.0, 1.0, false},
      {"e4m3xe4m3_e4m3_amax", e4m3, e4m3, DType::kF8E4M3, 1, 48, 80, 64, 0.5, 0.25, 2.0, true},
      {"e4m3xe5m2_e5m2_amax", e4m3, e5m2, DType::kF8E5M2, 1, 64, 48, 32, 0.5, 0.25, 2.0, true},
      {"e4m3xe4m3_e4m3_amax_large", e4m3, e4m3, DType::kF8E4M3, 1, 128, 144, 512, 0.5, 0.25, 0.5, true},
  };
}

// Σ|alpha' a b| per element of D, before d_scale (alpha' = a_scale b_scale; a mk, b nk or,
// for a negative control, kn).
std::vector<double> Fp8AbsSums(const Fp8Case& c, const std::vector<HostTensor>& args) {
  std::vector<double> sums(c.batch * c.m * c.n, 0.0);
  const double scale = std::abs(c.a_scale * c.b_scale);
  const bool b_nk = c.b_layout == "nk";
  for (int64_t p = 0; p < c.batch; ++p) {
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0;
        for (int64_t q = 0; q < c.k; ++q) {
          const int64_t b_at = b_nk ? (p * c.n + j) * c.k + q : (p * c.k + q) * c.n + j;
          sum += std::abs(args[0][(p * c.m + i) * c.k + q] * args[1][b_at]);
        }
        sums[(p * c.m + i) * c.n + j] = scale * sum;
      }
    }
  }
  return sums;
}

// The FP8 accumulator, as |D - reference| <= Fp8AccumulationBound(K) Σ|alpha' a b|.
// Hopper's FP8 tensor cores do not accumulate in f32: an FP8 wgmma (K = 32 an instruction)
// adds its 32 products to the accumulator it is given in a narrower adder, which keeps about
// 13 fraction bits (e8m13) and truncates the rest. DeepSeek-V3's report (arXiv 2412.19437,
// section 3.3.2) measured "around 14 bits" on the H800 and promotes the sums to f32 every 128
// of K by hand; cuBLASLt with CUBLASLT_MATMUL_DESC_FAST_ACCUM off (kiln's plan,
// runtime/cuda/gemm.h) promotes its partial sums to f32 periodically too, and with it on does
// not. The model: each instruction truncates twice, its addends aligned to the largest of them
// and its result, each time by less than 2⁻¹³ of the magnitudes it adds (at most the element's
// Σ|alpha' a b|), and an element takes ceil(K / 32) instructions; that holds whether or not
// the sums are promoted, and whichever way the truncations fall. On an H200 the largest error
// of the random cases was 6.85e-05 of Σ|ab| at K = 32 (0.56·2⁻¹³, a quarter of this bound; the
// f32-order bound, (K + 2)·2⁻²⁴, allowed 2.0e-06 there). A wrong scale or layout is off by
// about |D|, ~Σ|ab| / √K, far outside for these K (ExpectFp8Close's negative controls).
constexpr int64_t kFp8MmaK = 32;
constexpr double kFp8AccumulatorUlp = 0x1p-13;
double Fp8AccumulationBound(int64_t k) {
  const int64_t instructions = (k + kFp8MmaK - 1) / kFp8MmaK;
  return instructions * 2 * kFp8AccumulatorUlp + (k + 2) * 0x1p-24;  // and the f32 sum of what is promoted
}

// The reference of `c` over `args`'s values (reparsed, so that a case with another layout or
// scale reads the same operand values its own way).
std::vector<HostTensor> Fp8Reference(const Fp8Case& c, std::vector<HostTensor> args) {
  std::unique_ptr<Module> m = ParseFp8Gemm(c);
  if (m == nullptr) return {};
  const Function& f = *m->functions()[0];
  for (int i = 0; i < 2; ++i) args[i] = HostTensor::FromValues(f.parameters()[i]->type(), args[i].values());
  args[2] = HostTensor::FromValues(TensorType{DType::kF32, {}}, {c.a_scale});
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
  EXPECT_TRUE(want.ok()) << want.status();
  return want.ok() ? *std::move(want) : std::vector<HostTensor>();
}

// The elements of D outside what `c`'s reference `want` allows: the FP8 accumulator's bound
// times Σ|alpha' a b| d_scale, plus one ulp of a narrow D (a sum near a rounding boundary may
// round the other way): 2⁻⁷ relative for bf16, 2⁻³ for e4m3, 2⁻² for e5m2 (and their smallest
// subnormal). The first `report` of them are failures; `worst` gets the largest error in units
// of Σ|ab|.
int64_t Fp8Misses(const Fp8Case& c, const std::vector<HostTensor>& args, const HostTensor& want, const HostTensor& got,
                  int report, double* worst = nullptr) {
  const std::vector<double> sums = Fp8AbsSums(c, args);
  const double ulp = c.d == DType::kBF16 ? 0x1p-7 : c.d == DType::kF8E4M3 ? 0x1p-3 : c.d == DType::kF8E5M2 ? 0x1p-2 : 0;
  const double subnormal = c.d == DType::kF8E4M3 ? 0x1p-9 : c.d == DType::kF8E5M2 ? 0x1p-16 : 0;
  const double accumulator = Fp8AccumulationBound(c.k);
  int64_t misses = 0;
  for (size_t i = 0; i < sums.size(); ++i) {
    const double w = want[i], g = got[i], e = std::abs(g - w) / c.d_scale;
    const double allowed = accumulator * sums[i] + ulp * std::abs(w) / c.d_scale + subnormal;
    if (worst != nullptr && sums[i] > 0) *worst = std::max(*worst, e / sums[i]);
    if (!(e <= allowed) && ++misses <= report) {
      ADD_FAILURE() << "[" << i << "] gpu " << g << " reference " << w << " (d_scale " << c.d_scale
                    << "): off by " << e << " before d_scale, allowed " << allowed << " (Σ|ab| " << sums[i] << ")";
    }
  }
  return misses;
}

// What the GPU must match: the reference (same inputs) within Fp8Misses's bound; amax,
// computed before d_scale and the rounding, within the accumulator's bound of the largest
// sum. Prints the largest error in units of Σ|ab| and of 2⁻¹³, the figures to read when this
// fails. Negative controls: the same result read against the reference with a_scale doubled,
// and with b's bytes read as [K, N], must miss on most elements (about 90% or more at these
// shapes), so the bound cannot hide a wrong scale or a wrong layout.
void ExpectFp8Close(const Fp8Case& c, const std::vector<HostTensor>& args, const std::vector<HostTensor>& want,
                    const std::vector<HostTensor>& got) {
  double worst = 0;
  EXPECT_EQ(Fp8Misses(c, args, want[0], got[0], /*report=*/3, &worst), 0);
  std::printf("%s: max |gpu - reference| = %.3g of Σ|ab| = %.2f·2⁻¹³ (the bound allows %.3g; f32 order alone %.3g)\n",
              c.name.c_str(), worst, worst / kFp8AccumulatorUlp, Fp8AccumulationBound(c.k), (c.k + 2) * 0x1p-24);
  const int64_t elements = want[0].num_elements();
  Fp8Case doubled = c;
  doubled.name = "with a_scale doubled";
  doubled.a_scale *= 2;
  Fp8Case transposed = c;
  transposed.name = "reading b as [K, N]";
  transposed.b_layout = "kn";
  for (const Fp8Case& wrong : {doubled, transposed}) {
    const std::vector<HostTensor> wrong_want = Fp8Reference(wrong, args);
    ASSERT_FALSE(wrong_want.empty());
    const int64_t misses = Fp8Misses(wrong, args, wrong_want[0], got[0], /*report=*/0);
    EXPECT_GT(misses, elements / 2) << "the bound passes the result as that of a GEMM " << wrong.name << " on "
                                    << elements - misses << " of " << elements << " elements";
  }
  if (c.amax) {
    ASSERT_EQ(got.size(), 2u);
    const std::vector<double> sums = Fp8AbsSums(c, args);
    const double largest = *std::max_element(sums.begin(), sums.end());
    const double w = want[1][0], g = got[1][0];
    EXPECT_LE(std::abs(g - w), Fp8AccumulationBound(c.k) * largest + 1e-6 * std::abs(w))
        << "amax: gpu " << g << " reference " << w;
    EXPECT_GT(w, 0);
  }
}

// A case run on the reference and on the GPU (a poisoned arena), over Fp8Args(integers).
struct Fp8Run {
  std::vector<HostTensor> args, want, got;
};
absl::StatusOr<Fp8Run> RunFp8Case(const Fp8Case& c, bool integers) {
  std::unique_ptr<Module> m = ParseFp8Gemm(c);
  if (m == nullptr) return absl::InvalidArgumentError(absl::StrCat(c.name, " does not parse"));
  const Function& f = *m->functions()[0];
  Fp8Run run{.args = Fp8Args(f, c, integers)};
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, run.args);
  if (!want.ok()) return absl::Status(want.status().code(), absl::StrCat("reference: ", want.status().message()));
  absl::StatusOr<std::vector<HostTensor>> got = EvaluateOnGpu(f, run.args, *Device(), {.poison_arena = true});
  if (!got.ok()) return absl::Status(got.status().code(), absl::StrCat("gpu: ", got.status().message()));
  run.want = *std::move(want);
  run.got = *std::move(got);
  return run;
}

TEST(GpuGemm, Fp8MatchesTheReference) {
  KILN_REQUIRE_GPU();
  for (const Fp8Case& c : Fp8Cases()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<Fp8Run> run = RunFp8Case(c, /*integers=*/false);
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectFp8Close(c, run->args, run->want, run->got);
  }
}

// Small integers and power-of-two scales make every sum and every scaling exact, whatever
// the accumulation order or the tensor cores' internal precision: D (rounded once to its
// dtype) and amax must equal the reference bit for bit. A scale given to the wrong operand
// or not at all, a wrong layout or a missed d_scale shows here as a plain wrong value.
TEST(GpuGemm, Fp8IntegerValuedOperandsAreExact) {
  KILN_REQUIRE_GPU();
  for (const Fp8Case& c : Fp8Cases()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<Fp8Run> run = RunFp8Case(c, /*integers=*/true);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->got.size(), run->want.size());
    for (size_t r = 0; r < run->want.size(); ++r) {
      EXPECT_EQ(run->got[r].values(), run->want[r].values()) << "result " << r;
    }
  }
}

// amax=1 of an fp8 D, the only D whose amax cuBLASLt computes: the second result is the
// reference's (bit for bit for integer-valued operands, else within the accumulator's bound
// of the largest Σ|ab|), and it is the amax of this call's D before d_scale: max |D| / d_scale
// within one ulp of D's dtype (d_scale 2 and 0.5 among the cases). A wide D's amax is refused
// when the executable is planned (Fp8AmaxOfAWideResultIsRefused says so without a GPU).
TEST(GpuGemm, Fp8AmaxOfAnFp8Result) {
  KILN_REQUIRE_GPU();
  for (const Fp8Case& c : Fp8Cases()) {
    if (!c.amax) continue;
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(IsFp8(c.d));
    for (bool integers : {true, false}) {
      SCOPED_TRACE(integers ? "integer-valued" : "random");
      absl::StatusOr<Fp8Run> run = RunFp8Case(c, integers);
      ASSERT_TRUE(run.ok()) << run.status();
      ASSERT_EQ(run->got.size(), 2u);
      const double amax = run->got[1][0], want_amax = run->want[1][0];
      if (integers) {
        EXPECT_EQ(amax, want_amax);
      } else {
        const std::vector<double> sums = Fp8AbsSums(c, run->args);
        EXPECT_NEAR(amax, want_amax, Fp8AccumulationBound(c.k) * *std::max_element(sums.begin(), sums.end()));
      }
      double max_d = 0;
      for (double v : run->got[0].values()) max_d = std::max(max_d, std::abs(v));
      const double ulp = c.d == DType::kF8E4M3 ? 0x1p-3 : 0x1p-2;
      EXPECT_NEAR(max_d / c.d_scale, amax, ulp * amax) << "max |D| " << max_d << ", d_scale " << c.d_scale;
      EXPECT_GT(amax, 0);
    }
  }
  // A bf16 D's amax fails when the executable is made, naming the rule, not in a run.
  const Fp8Case wide{"e4m3xe4m3_bf16_amax", DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, 1, 48, 80, 64,
                     0.5, 4.0, 1.0, true};
  absl::StatusOr<Fp8Run> refused = RunFp8Case(wide, /*integers=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented) << refused.status();
  EXPECT_NE(refused.status().message().find("f8e4m3 x f8e4m3 -> bf16 with amax=1: cuBLASLt computes AMAX_D for an "
                                            "fp8 D only"),
            absl::string_view::npos)
      << refused.status();
}

// A dot_general of fp8 operands runs as every compile runs it: lower-gemm gives it unit scales.
TEST(GpuGemm, Fp8DotGeneralRunsThroughLowerGemm) {
  KILN_REQUIRE_GPU();
  Function f("fp8_dot");
  BuildDot(f, DotCases()[0], DType::kF8E4M3, DType::kBF16);  // x [2,3,16] · w [24,16]ᵀ: TN, K 16
  const std::vector<HostTensor> args = {HostTensor::Random(f.parameters()[0]->type(), 1, -2, 2),
                                        HostTensor::Random(f.parameters()[1]->type(), 2, -2, 2)};
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
  absl::StatusOr<std::vector<HostTensor>> got = GemmOnGpu(f, args);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  const HostTensor bound = AbsDot(f, args);
  for (int64_t i = 0; i < bound.num_elements(); ++i) {
    const double w = (*want)[0][i];
    EXPECT_LE(std::abs((*got)[0][i] - w), Fp8AccumulationBound(16) * bound[i] + 0x1p-7 * std::abs(w)) << i;
  }
}

// No GPU needed: what GemmDescriptionOf makes of a scaled gemm, and what the plan's rules
// (GemmPlan::CheckSupported, the first thing GemmPlan::Create does) refuse, each naming the
// gemm and the rule.
TEST(GpuGemm, Fp8DescriptionsAndTheRulesOfThePlan) {
  const DType e4m3 = DType::kF8E4M3, e5m2 = DType::kF8E5M2;
  // Every case the GPU tests run is one the plan takes, and compiles (on CI, where they skip).
  for (const Fp8Case& c : Fp8Cases()) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Module> m = ParseFp8Gemm(c);
    ASSERT_NE(m, nullptr);
    absl::StatusOr<GemmDescription> g = DescribeTheGemm(*m);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(GemmPlan::CheckSupported(*g).ok()) << GemmPlan::CheckSupported(*g);
    absl::StatusOr<CompiledProgram> program =
        CompileProgram(*m->functions()[0], {.target = TargetForArch("sm_90a").value()});
    ASSERT_TRUE(program.ok()) << program.status();
    EXPECT_EQ(program->num_gemms, 1);
  }
  {
    absl::StatusOr<GemmDescription> g =
        DescribeFp8Gemm({"amax", e4m3, e5m2, DType::kBF16, 2, 48, 80, 64, 0.5, 4.0, 1.0, true});
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(std::vector<int64_t>({g->batch, g->m, g->n, g->k}), std::vector<int64_t>({2, 48, 80, 64}));
    EXPECT_TRUE(g->a_k_inner && g->b_k_inner);
    EXPECT_EQ(g->a_dtype, e4m3);
    EXPECT_EQ(g->b_dtype, e5m2);
    EXPECT_EQ(g->d_dtype, DType::kBF16);
    EXPECT_TRUE(g->scaled);
    EXPECT_TRUE(g->amax);
    EXPECT_FALSE(g->bias);
    EXPECT_EQ(g->context, "%d.results (gemm)");  // a multi-result node is named after its first result
    EXPECT_EQ(g->max_workspace_bytes, kGemmWorkspaceBytes);
    // Described, but not planned: the amax of a bf16 D (Fp8AmaxOfAWideResultIsRefused).
    EXPECT_EQ(GemmPlan::CheckSupported(*g).code(), absl::StatusCode::kUnimplemented);
  }
  {
    absl::StatusOr<GemmDescription> g =
        DescribeFp8Gemm({"fp8_d", e4m3, e4m3, e4m3, 1, 16, 32, 48, 0.5, 4.0, 2.0, false});
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(g->scaled && !g->amax);
    EXPECT_EQ(g->d_dtype, e4m3);
    EXPECT_TRUE(GemmPlan::CheckSupported(*g).ok()) << GemmPlan::CheckSupported(*g);
  }
  // Every layout but TN is refused, naming the layouts and the way out.
  for (auto [a_layout, b_layout] : {std::pair{"km", "nk"}, std::pair{"mk", "kn"}, std::pair{"km", "kn"}}) {
    Fp8Case c{"layout", e4m3, e4m3, DType::kBF16, 1, 48, 80, 64, 0.5, 4.0, 1.0, false, a_layout, b_layout};
    absl::StatusOr<GemmDescription> g = DescribeFp8Gemm(c);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->a_k_inner, c.a_layout == "mk");
    EXPECT_EQ(g->b_k_inner, c.b_layout == "nk");
    const absl::Status refused = GemmPlan::CheckSupported(*g);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
    for (const std::string& part :
         {std::string("%d (gemm)"), absl::StrCat("a_layout=", a_layout, ", b_layout=", b_layout),
          std::string("FP8 cuBLASLt on sm_90 takes only K-inner operands (TN"),
          std::string("write the transposed copy in the producer")}) {
      EXPECT_NE(refused.message().find(part), absl::string_view::npos) << part << " in: " << refused;
    }
  }
  // The lowered weight gradient of an fp8 dot_general (km, kn) is refused the same way.
  {
    Function f("fp8_weight_gradient");
    BuildDot(f, DotCases()[1], e4m3, DType::kF32);
    const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
    absl::StatusOr<GemmDescription> g = GemmDescriptionOf(*GemmOf(*lowered->functions()[0]));
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(g->scaled);
    const absl::Status refused = GemmPlan::CheckSupported(*g);
    EXPECT_NE(refused.message().find("a_layout=km, b_layout=kn: FP8 cuBLASLt on sm_90"), absl::string_view::npos)
        << refused;
  }
  // The type rules: no e5m2 x e5m2, no e5m2 D from e4m3 x e4m3, K a multiple of 16, and an
  // fp8 D with neither a C nor a bias (cuBLASLt's are bf16 there, the IR's the D's dtype).
  auto refusal = [](GemmDescription g) { return std::string(GemmPlan::CheckSupported(g).message()); };
  GemmDescription fp8{.batch = 1, .m = 64, .n = 64, .k = 64, .a_dtype = e4m3, .b_dtype = e4m3,
                      .d_dtype = DType::kBF16, .scaled = true, .context = "%g (gemm)"};
  ASSERT_EQ(refusal(fp8), "");
  GemmDescription bad = fp8;
  bad.a_dtype = bad.b_dtype = e5m2;
  EXPECT_NE(refusal(bad).find("no e5m2 x e5m2"), std::string::npos) << refusal(bad);
  bad = fp8;
  bad.d_dtype = e5m2;
  EXPECT_NE(refusal(bad).find("e5m2 D from mixed operands only"), std::string::npos) << refusal(bad);
  bad.b_dtype = e5m2;
  EXPECT_EQ(refusal(bad), "");
  bad = fp8;
  bad.k = 40;
  EXPECT_NE(refusal(bad).find("K 40: FP8 cuBLASLt takes K a multiple of 16"), std::string::npos) << refusal(bad);
  bad = fp8;
  bad.d_dtype = e4m3;
  bad.beta = 1;
  EXPECT_NE(refusal(bad).find("C for an fp8 D is bf16 or f16"), std::string::npos) << refusal(bad);
  bad = fp8;
  bad.bias = true;
  bad.bias_dtype = DType::kBF16;
  EXPECT_EQ(refusal(bad), "");  // a bf16 D takes its bf16 bias
  bad.d_dtype = bad.bias_dtype = DType::kF32;
  EXPECT_NE(refusal(bad).find("FP8 bias for a f32 D is bf16"), std::string::npos) << refusal(bad);
  bad = fp8;
  bad.scaled = false;
  EXPECT_EQ(refusal(bad), "%g (gemm): no FP8 cuBLASLt GEMM: f8e4m3 x f8e4m3 -> bf16: fp8 operands take scaled=1 "
                          "(a_scale, b_scale, d_scale)");
}

// No GPU needed: cuBLASLt computes AMAX_D for an fp8 D only (for a bf16 or f32 D its heuristic
// offers algorithms and none runs), so the plan refuses amax=1 of a bf16, f16 or f32 D,
// naming the gemm and saying where that amax must come from; an fp8 D's amax it takes.
TEST(GpuGemm, Fp8AmaxOfAWideResultIsRefused) {
  const DType e4m3 = DType::kF8E4M3;
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(d));
    absl::StatusOr<GemmDescription> g =
        DescribeFp8Gemm({"wide_amax", e4m3, e4m3, d, 1, 48, 80, 64, 0.5, 4.0, 1.0, true});
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(g->amax);
    const absl::Status refused = GemmPlan::CheckSupported(*g);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
    EXPECT_EQ(refused.message(),
              absl::StrCat("%d.results (gemm): no FP8 cuBLASLt GEMM: f8e4m3 x f8e4m3 -> ", DTypeName(d),
                           " with amax=1: cuBLASLt computes AMAX_D for an fp8 D only (for a ", DTypeName(d),
                           " D no algorithm runs); the amax of a wide result must come from the kernel that "
                           "consumes it"));
    g->amax = false;  // the same gemm without its amax is planned
    EXPECT_TRUE(GemmPlan::CheckSupported(*g).ok()) << GemmPlan::CheckSupported(*g);
  }
  for (DType d : {DType::kF8E4M3, DType::kF8E5M2}) {
    SCOPED_TRACE(DTypeName(d));
    const DType b = d == DType::kF8E5M2 ? DType::kF8E5M2 : e4m3;  // an e5m2 D takes mixed operands
    absl::StatusOr<GemmDescription> g = DescribeFp8Gemm({"fp8_amax", e4m3, b, d, 1, 48, 80, 64, 0.5, 0.25, 2.0, true});
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(g->amax);
    EXPECT_TRUE(GemmPlan::CheckSupported(*g).ok()) << GemmPlan::CheckSupported(*g);
  }
}

// What the description cannot carry is refused where it is made: a d_scale that may not be 1
// for a wide D (cuBLASLt applies D_SCALE to an fp8 D only), scales for bf16 operands.
TEST(GpuGemm, Fp8SlotsTheDescriptionCannotCarryAreRefused) {
  // A scaled gemm [16, 32] · [48, 32]ᵀ -> bf16 of `operands`, its three scales one %s.
  auto describe = [](absl::string_view operands, absl::string_view scale) -> absl::StatusOr<GemmDescription> {
    const std::string text = absl::StrCat(
        "module @m\nfunc @main {\n  %a = parameter() {index=0} : ", operands, "[16,32]\n",
        "  %b = parameter() {index=1} : ", operands, "[48,32]\n  %s = ", scale, " : f32[]\n",
        "  %d = gemm(%a, %b, %s, %s, %s) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, "
        "k=32, m=16, n=48, scaled=1} : bf16[16,48]\n  return %d\n}\n");
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
    EXPECT_TRUE(m.ok()) << m.status() << "\n" << text;
    if (!m.ok()) return m.status();
    return DescribeTheGemm(**m);
  };
  absl::StatusOr<GemmDescription> g = describe("f8e4m3", "parameter() {index=2}");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(g.status().message().find("%d (gemm): d_scale %s of a bf16 result must be the constant 1"),
            absl::string_view::npos)
      << g.status();
  g = describe("bf16", "constant() {value=1.0}");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("scaled=1 with bf16 x bf16 operands"), absl::string_view::npos) << g.status();
}

}  // namespace
}  // namespace kiln
