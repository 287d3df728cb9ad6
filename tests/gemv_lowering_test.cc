// The small-M gemm kernels (kernels/gemv.cuh's SmallMGemm and SmallMGemmMma,
// codegen/lower_gemv.h): which gemms take them instead of cuBLASLt, the geometry each shape
// gets, and that their kernels compile for sm_90a without spilling. Their values against the
// reference run on the GPU (tests/gpu_gemv_test.cc, SmallMGemmMatchesTheReference).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codegen/lower_gemv.h"
#include "codegen/lower_node.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "ir/builder.h"

#ifdef KILN_WITH_CUDA
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

struct GemmCase {
  int64_t batch = 1, m = 1, n = 40, k = 64;
  DType ab = DType::kBF16, d = DType::kBF16;
  std::string a_layout = "mk", b_layout = "nk";
  double alpha = 1.0;
  double beta = 0.0;  // != 0: a C operand of D's type (the residual a projection adds into)
};

// A function holding one gemm node of `c`'s shape (a [batch * m, k] or [k, m] as its layout
// says, b [n, k] or [k, n]).
class GemmNode {
 public:
  explicit GemmNode(const GemmCase& c) : module_("m"), b_(module_.AddFunction("f")) {
    const std::vector<int64_t> a_dims = c.a_layout == "mk" ? std::vector<int64_t>{c.batch * c.m, c.k}
                                                            : std::vector<int64_t>{c.batch * c.k, c.m};
    const std::vector<int64_t> b_dims = c.b_layout == "nk" ? std::vector<int64_t>{c.batch * c.n, c.k}
                                                            : std::vector<int64_t>{c.batch * c.k, c.n};
    Node* a = *b_.Parameter("a", {c.ab, a_dims});
    Node* w = *b_.Parameter("w", {c.ab, b_dims});
    const TensorType out{c.d, {c.batch * c.m, c.n}};
    std::vector<Node*> operands = {a, w};
    if (c.beta != 0) operands.push_back(*b_.Parameter("c", out));
    absl::StatusOr<Node*> node =
        b_.Op(Opcode::kGemm, operands,
              AttrMap{{"batch", c.batch}, {"m", c.m}, {"n", c.n}, {"k", c.k}, {"a_layout", Symbol{c.a_layout}},
                      {"b_layout", Symbol{c.b_layout}}, {"alpha", c.alpha}, {"beta", c.beta}, {"epilogue", Symbol{"none"}}},
              &out);
    EXPECT_TRUE(node.ok()) << node.status();
    node_ = node.ok() ? *node : nullptr;
  }
  const Node& node() const { return *node_; }

 private:
  Module module_;
  Builder b_;
  Node* node_ = nullptr;
};

TEST(SmallMGemm, TakesGemmsOfFewRowsBothOperandsKInner) {
  for (int64_t m : {1, 2, 3, 8}) {
    GemmNode g(GemmCase{.m = m});
    EXPECT_EQ(codegen::SmallMGemmRefusal(g.node(), {}), "") << "m " << m;
    absl::StatusOr<LoweredNode> lowered = LowerNode(g.node());
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_EQ(lowered->kind, LoweringKind::kKernels);
    EXPECT_EQ(lowered->label, "gemv");  // its own group in --report
    ASSERT_EQ(lowered->kernels.size(), 1u);
    EXPECT_TRUE(absl::StrContains(lowered->kernels[0].source, "SmallMGemm<__nv_bfloat16, __nv_bfloat16, ")) << m;
  }
  GemmNode with_c(GemmCase{.m = 2, .d = DType::kF32, .beta = 1.0});
  EXPECT_EQ(codegen::SmallMGemmRefusal(with_c.node(), {}), "");
  EXPECT_TRUE(absl::StrContains(LowerNode(with_c.node())->kernels.at(0).source, ", true>::Run(out, a, b, c, "));
  struct Refused {
    GemmCase c;
    std::string reason;
  };
  // 9 to 64 rows of bf16 or f16 operands: the tensor-core kernel, C included.
  for (int64_t m : {9, 15, 16, 17, 32, 33, 63, 64}) {
    GemmNode g(GemmCase{.m = m});
    EXPECT_EQ(codegen::SmallMGemmRefusal(g.node(), {}), "") << "m " << m;
    absl::StatusOr<LoweredNode> lowered = LowerNode(g.node());
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_EQ(lowered->kind, LoweringKind::kKernels);
    EXPECT_EQ(lowered->label, "gemv");
    ASSERT_EQ(lowered->kernels.size(), 1u);
    EXPECT_TRUE(absl::StrContains(lowered->kernels[0].source,
                                  absl::StrCat("SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, ", m, ", 40LL, 64LL, ")))
        << lowered->kernels[0].source;
  }
  GemmNode f16_c(GemmCase{.m = 16, .ab = DType::kF16, .d = DType::kF32, .beta = 1.0});
  EXPECT_EQ(codegen::SmallMGemmRefusal(f16_c.node(), {}), "");
  EXPECT_TRUE(absl::StrContains(LowerNode(f16_c.node())->kernels.at(0).source,
                                "SmallMGemmMma<__half, float, 16, 40LL, 64LL, "));
  EXPECT_TRUE(absl::StrContains(LowerNode(f16_c.node())->kernels.at(0).source, ", true>::Run(out, a, b, c, "));
  const std::vector<Refused> refused = {
      {{.m = 65}, "m 65 is not in [1, 64]"},
      {{.m = 0}, "m 0 is not in [1, 64]"},
      {{.m = 16, .ab = DType::kF32, .d = DType::kF32}, "m 16 of f32 operands"},
      {{.m = 9, .ab = DType::kF32, .d = DType::kF32}, "m 9 of f32 operands"},
      {{.m = 16, .k = 40}, "K 40 is not a multiple of 32 (the tensor-core kernel's chunks)"},
      {{.m = 64, .k = 2056}, "K 2056 is not a multiple of 32"},
      {{.batch = 2, .m = 16}, "batch 2"},
      {{.batch = 2, .m = 4}, "batch 2"},
      {{.a_layout = "km"}, "layouts other than a_layout=mk, b_layout=nk"},
      {{.b_layout = "kn"}, "layouts other than a_layout=mk, b_layout=nk"},
      {{.k = 12}, "K 12 is not a multiple of 8"},
      {{.k = 6, .ab = DType::kF32, .d = DType::kF32}, "K 6 is not a multiple of 4"},
  };
  for (const Refused& r : refused) {
    GemmNode g(r.c);
    const std::string why = codegen::SmallMGemmRefusal(g.node(), {});
    EXPECT_TRUE(absl::StrContains(why, r.reason)) << why << " (expected: " << r.reason << ")";
    absl::StatusOr<LoweredNode> lowered = LowerNode(g.node());
    if (lowered.ok()) EXPECT_EQ(lowered->kind, LoweringKind::kGemm) << r.reason;  // cuBLASLt's
  }
  // K 40 is whole 16-byte chunks: SmallMGemm's at 8 rows, only the tensor-core kernel's chunk refuses it.
  GemmNode k40(GemmCase{.m = 8, .k = 40});
  EXPECT_EQ(codegen::SmallMGemmRefusal(k40.node(), {}), "");
  // A GPU without bf16 mma.sync keeps SmallMGemm and leaves 9 rows and more to cuBLASLt.
  CodegenOptions turing;
  turing.target.arch = "sm_75", turing.target.compute_capability = 75;
  GemmNode m16(GemmCase{.m = 16});
  EXPECT_TRUE(absl::StrContains(codegen::SmallMGemmRefusal(m16.node(), turing), "sm_75 has no bf16 mma.sync"));
  EXPECT_EQ(LowerNode(m16.node(), turing)->kind, LoweringKind::kGemm);
  GemmNode m8(GemmCase{.m = 8});
  EXPECT_EQ(codegen::SmallMGemmRefusal(m8.node(), turing), "");
  CodegenOptions no_gemv;
  no_gemv.small_m_gemv = false;
  for (int64_t m : {1, 32}) {
    GemmNode off(GemmCase{.m = m});
    EXPECT_EQ(LowerNode(off.node(), no_gemv)->kind, LoweringKind::kGemm) << "m " << m;
  }
}

// What it is for: every gemm of a decode step (the projections and the LM head, one row per
// sequence of the batch bucket) takes one of them, SmallMGemm to 8 sequences and the
// tensor-core kernel to 64, and no gemm of a prefill of more than 64 tokens (one row per token).
TEST(SmallMGemm, TakesEveryGemmOfTheDecodeStepAndNoneOfThePrefill) {
  const ModelConfig config = *PresetConfig("llama-tiny");
  const PagedKvLayout layout{.num_blocks = 16, .block_size = 16, .max_blocks_per_sequence = 8};
  struct Phase {
    InferencePhase phase;
    int64_t size;
    std::string kernel;  // empty: cuBLASLt's
  };
  for (const Phase& p : {Phase{InferencePhase::kDecode, 1, "SmallMGemm<"},
                         Phase{InferencePhase::kDecode, 8, "SmallMGemm<"},
                         Phase{InferencePhase::kDecode, 16, "SmallMGemmMma<"},
                         Phase{InferencePhase::kDecode, 32, "SmallMGemmMma<"},
                         Phase{InferencePhase::kDecode, 64, "SmallMGemmMma<"},
                         Phase{InferencePhase::kPrefill, 128, ""}}) {
    std::unique_ptr<Module> m = *BuildLlamaInferenceModule(config, layout, Precision::kBf16, p.phase, p.size);
    ASSERT_TRUE(CompileInferenceModule(*m, {}).ok());
    int gemms = 0;
    for (const auto& n : m->functions()[0]->nodes()) {
      if (n->opcode() != Opcode::kGemm) continue;
      ++gemms;
      EXPECT_EQ(codegen::SmallMGemmRefusal(*n, {}).empty(), !p.kernel.empty())
          << n->name() << " (size " << p.size << "): " << codegen::SmallMGemmRefusal(*n, {});
      absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      if (p.kernel.empty()) {
        EXPECT_EQ(lowered->kind, LoweringKind::kGemm) << n->name();
      } else {
        ASSERT_EQ(lowered->kernels.size(), 1u) << n->name();
        EXPECT_TRUE(absl::StrContains(lowered->kernels[0].source, p.kernel)) << n->name() << " (size " << p.size << ")";
      }
    }
    EXPECT_EQ(gemms, 4 * config.n_layers + 1) << "qkv, o, gate_up, down a layer (joined weights), and the LM head";
  }
}

// llama-M's decode step at the batch buckets past 8 (the shapes SmallMGemmMma is for): every
// gemm takes the tensor-core kernel, the o and down projections with the residual as C.
TEST(SmallMGemmMma, TakesEveryGemmOfLlamaMsDecodeStepAtBuckets16And32) {
  const ModelConfig config = *PresetConfig("llama-M");
  const PagedKvLayout layout{.num_blocks = 64, .block_size = 16, .max_blocks_per_sequence = 8};
  for (int64_t bucket : {16, 32}) {
    std::unique_ptr<Module> m = *BuildLlamaInferenceModule(config, layout, Precision::kBf16, InferencePhase::kDecode,
                                                           bucket);
    ASSERT_TRUE(CompileInferenceModule(*m, {}).ok());
    int gemms = 0, with_c = 0;
    for (const auto& n : m->functions()[0]->nodes()) {
      if (n->opcode() != Opcode::kGemm) continue;
      ++gemms;
      EXPECT_EQ(codegen::SmallMGemmRefusal(*n, {}), "") << n->name() << " (bucket " << bucket << ")";
      absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      ASSERT_EQ(lowered->kernels.size(), 1u) << n->name();
      EXPECT_TRUE(absl::StrContains(lowered->kernels[0].source, "SmallMGemmMma<__nv_bfloat16, "))
          << lowered->kernels[0].source;
      EXPECT_EQ(n->attrs().GetInt("m").value_or(-1), bucket) << n->name();
      if (absl::StrContains(lowered->kernels[0].source, ", true>::Run(out, a, b, c, ")) ++with_c;
    }
    EXPECT_EQ(gemms, 4 * config.n_layers + 1);
    EXPECT_EQ(with_c, 2 * config.n_layers) << "o and down add into the residual";
  }
}

// A row longer than one round of a warp's loads is split over the fewest warps (a power of
// two) whose one round covers it, and their sums meet in shared memory: llama-M's down
// projection (704 chunks of 16 bytes a row) over 4 warps of 6 chunks a lane, a block a row;
// its q/k/v projection (256 chunks) stays a warp a row, 4 rows a block.
TEST(SmallMGemm, SplitsALongRowOverWarps) {
  struct Want {
    GemmCase c;
    std::string call;
    uint32_t grid, block;
  };
  const std::vector<Want> wants = {
      {{.m = 1, .n = 2048, .k = 5632}, "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 1, 2048LL, 5632LL, 1, 4, 6, 1, false>",
       2048, 128},
      {{.m = 1, .n = 4096, .k = 2048}, "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 1, 4096LL, 2048LL, 1, 1, 8, 4, false>",
       1024, 128},
      // 8 rows of A: 2 chunks a lane of 4 B rows; 256 chunks take 4 warps.
      {{.m = 8, .n = 1030, .k = 2048}, "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 8, 1030LL, 2048LL, 4, 4, 2, 1, false>",
       258, 128},
      // Past 8 warps the row takes more rounds: 704 chunks over 8 warps of 2 chunks, 2 rounds.
      {{.m = 8, .n = 2048, .k = 5632}, "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 8, 2048LL, 5632LL, 4, 8, 2, 1, false>",
       512, 256},
  };
  for (const Want& want : wants) {
    GemmNode g(want.c);
    absl::StatusOr<LoweredNode> lowered = LowerNode(g.node());
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    const KernelSpec& k = lowered->kernels.at(0);
    EXPECT_TRUE(absl::StrContains(k.source, want.call)) << k.source;
    EXPECT_EQ(k.grid[0], want.grid) << want.call;
    EXPECT_EQ(k.block[0], want.block) << want.call;
  }
}

// SmallMGemmMma's geometry (codegen/lower_gemv.cc, MmaGeometryFor) at llama-M's decode shapes:
// two 16-row tiles a group of warps to 32 rows of A where N gives every SM a group, else one;
// N 2048 (o, down) 4 or 8 warps splitting K, 128 blocks, each warp at least two rounds; the LM head's 32000 rows little or no
// split. An odd N takes as many 16-row tiles as cover it; fewer SMs, less split.
TEST(SmallMGemmMma, GeometryPerShape) {
  struct Want {
    GemmCase c;
    std::string call;
    uint32_t grid, block;
    int sm_count = 132;
  };
  const std::vector<Want> wants = {
      {{.m = 16, .n = 4096, .k = 2048},
       "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 16, 4096LL, 2048LL, 1, 4, 8, 1, false>", 256, 128},
      {{.m = 32, .n = 2048, .k = 2048, .d = DType::kF32, .beta = 1.0},
       "SmallMGemmMma<__nv_bfloat16, float, 32, 2048LL, 2048LL, 1, 8, 4, 1, true>", 128, 256},
      {{.m = 16, .n = 11264, .k = 2048},
       "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 16, 11264LL, 2048LL, 2, 2, 4, 2, false>", 176, 128},
      {{.m = 32, .n = 11264, .k = 2048},
       "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 32, 11264LL, 2048LL, 2, 4, 2, 1, false>", 352, 128},
      {{.m = 64, .n = 2048, .k = 5632, .d = DType::kF32, .beta = 1.0},
       "SmallMGemmMma<__nv_bfloat16, float, 64, 2048LL, 5632LL, 1, 8, 4, 1, true>", 128, 256},
      {{.m = 32, .n = 32000, .k = 2048},
       "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 32, 32000LL, 2048LL, 2, 2, 2, 2, false>", 500, 128},
      {{.m = 64, .n = 32000, .k = 2048},
       "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 64, 32000LL, 2048LL, 1, 1, 4, 4, false>", 500, 128},
      {{.m = 9, .n = 1030, .k = 2048},
       "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 9, 1030LL, 2048LL, 1, 4, 8, 1, false>", 65, 128},
      // At least two rounds a warp: 64 chunks of 8 a round take 4 warps, not 8.
      {{.m = 16, .n = 2048, .k = 2048},
       "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 16, 2048LL, 2048LL, 1, 4, 8, 1, false>", 128, 128},
      // A short row caps chunks and split: K 64 is 2 chunks, 2 rounds of one.
      {{.m = 16, .n = 40, .k = 64}, "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 16, 40LL, 64LL, 1, 1, 1, 4, false>",
       1, 128},
      {{.m = 64, .n = 2048, .k = 2048},
       "SmallMGemmMma<__nv_bfloat16, __nv_bfloat16, 64, 2048LL, 2048LL, 1, 1, 4, 4, false>", 32, 128, 16},
  };
  for (const Want& want : wants) {
    GemmNode g(want.c);
    CodegenOptions options;
    options.target.sm_count = want.sm_count;
    absl::StatusOr<LoweredNode> lowered = LowerNode(g.node(), options);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kernels.size(), 1u) << want.call;
    const KernelSpec& k = lowered->kernels.at(0);
    EXPECT_TRUE(absl::StrContains(k.source, want.call)) << k.source;
    EXPECT_EQ(k.grid[0], want.grid) << want.call;
    EXPECT_EQ(k.block[0], want.block) << want.call;
  }
}

#ifdef KILN_WITH_CUDA
// "Used 76 registers, ..." of the compile log, after checking it spilled nothing; -1 when it
// does not compile.
int CompiledRegisters(const GemmCase& c, const KernelSpec& k) {
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{.ptxas_info = true});
  EXPECT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
  if (!compiled.ok()) return -1;
  EXPECT_TRUE(absl::StrContains(compiled->log, "0 bytes spill stores")) << compiled->log;
  EXPECT_TRUE(absl::StrContains(compiled->log, "0 bytes stack frame")) << compiled->log;
  const size_t used = compiled->log.find("Used ");
  EXPECT_NE(used, std::string::npos) << compiled->log;
  if (used == std::string::npos) return -1;
  const std::string line = compiled->log.substr(used, compiled->log.find('\n', used) - used);
  std::printf("[ m %lld n %lld k %lld%s ] %s\n", static_cast<long long>(c.m), static_cast<long long>(c.n),
              static_cast<long long>(c.k), c.beta != 0 ? " +C" : "", line.c_str());
  return std::atoi(line.c_str() + 5);
}

// Every geometry the lowering picks (m 1, 2-4, 5-8), each operand dtype, an f32 D, a
// non-unit alpha and an N that leaves the last warp's rows partly past the end: the kernels
// compile for sm_90a and keep their sums and chunks in registers.
TEST(SmallMGemm, KernelsCompileWithoutSpills) {
  const std::vector<GemmCase> cases = {
      {.m = 1, .n = 2048, .k = 5632},
      {.m = 2, .n = 37, .k = 64, .d = DType::kF32},
      {.m = 4, .n = 40, .k = 2048, .ab = DType::kF16, .d = DType::kF16},
      {.m = 8, .n = 11264, .k = 2048, .alpha = 0.5},
      {.m = 1, .n = 2048, .k = 2048, .beta = 1.0},  // the o projection adding into the f32 residual
      {.m = 6, .n = 2048, .k = 5632, .ab = DType::kF32, .d = DType::kF32, .beta = -2.0},
      {.m = 5, .n = 9, .k = 16, .ab = DType::kF32, .d = DType::kF32},
  };
  for (const GemmCase& c : cases) {
    GemmNode g(c);
    absl::StatusOr<LoweredNode> lowered = LowerNode(g.node());
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kind, LoweringKind::kKernels) << codegen::SmallMGemmRefusal(g.node(), {});
    const KernelSpec& k = lowered->kernels.at(0);
    EXPECT_GE(k.grid[0] * k.block[0] / 32 * (c.m == 1 ? 1 : c.m <= 4 ? 2 : 4), static_cast<uint64_t>(c.n))
        << "every row of B has a warp";
    EXPECT_GT(CompiledRegisters(c, k), 0);
  }
}

// SmallMGemmMma at llama-M's decode shapes (q/k/v, o, gate_up, down, the LM head) and
// buckets 16, 32, 64, each with and without C (the f32 residual the o and down projections
// add into), and shapes of partial tiles (N past the last 16-row tile, M past the last
// 8-row n-tile, one chunk a row), f16 among them: the kernels compile for sm_90a, spill
// nothing and stay within ~128 registers a lane (MmaGeometryFor's budget).
TEST(SmallMGemmMma, KernelsCompileWithoutSpills) {
  std::vector<GemmCase> cases;
  for (int64_t m : {16, 32, 64}) {
    for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{
             {4096, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632}, {32000, 2048}}) {
      cases.push_back({.m = m, .n = n, .k = k});
      cases.push_back({.m = m, .n = n, .k = k, .d = DType::kF32, .beta = 1.0});
    }
  }
  cases.push_back({.m = 9, .n = 1030, .k = 2048, .ab = DType::kF16, .d = DType::kF16, .alpha = 0.5});
  cases.push_back({.m = 17, .n = 37, .k = 32, .d = DType::kF32, .beta = -2.0});
  cases.push_back({.m = 63, .n = 1030, .k = 5632, .ab = DType::kF16, .d = DType::kF32});
  for (const GemmCase& c : cases) {
    GemmNode g(c);
    absl::StatusOr<LoweredNode> lowered = LowerNode(g.node());
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kind, LoweringKind::kKernels) << codegen::SmallMGemmRefusal(g.node(), {});
    const KernelSpec& k = lowered->kernels.at(0);
    ASSERT_TRUE(absl::StrContains(k.source, "SmallMGemmMma<")) << k.source;
    const int registers = CompiledRegisters(c, k);
    EXPECT_GT(registers, 0);
    EXPECT_LE(registers, 136) << k.source;
  }
}
#endif

}  // namespace
}  // namespace kiln
