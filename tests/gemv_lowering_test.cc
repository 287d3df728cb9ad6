// The small-M gemm kernel (kernels/gemv.cuh, codegen/lower_gemv.h): which gemms take it
// instead of cuBLASLt, and that its kernels compile for sm_90a without spilling. Its values
// against the reference run on the GPU (tests/gpu_ops_test.cc, SmallMGemmMatchesTheReference).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codegen/lower_gemv.h"
#include "codegen/lower_node.h"
#include "frontends/llama_inference.h"
#include "ir/fusion.h"
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

// Under programmatic launch SmallMGemm lets the next kernel launch only after its loop (the
// next kernels' blocks, resident early, would take the L1 its A reads hit): its kernel opens
// with griddepcontrol.wait alone, and kernels/gemv.cuh triggers the launch later.
TEST(SmallMGemm, LaunchesItsDependentsAfterItsLoop) {
  GemmNode g(GemmCase{.m = 1});
  CodegenOptions options;
  options.target.compute_capability = 90;
  // Its weight (a parameter nothing writes) is read before the wait, which the kernel then
  // executes itself: the prologue holds neither instruction.
  absl::StatusOr<LoweredNode> lowered = LowerNode(g.node(), options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const KernelSpec& k = lowered->kernels.at(0);
  EXPECT_TRUE(k.waits_for_grid_dependency);
  EXPECT_TRUE(k.launches_dependents_itself);
  EXPECT_TRUE(k.waits_itself);
  EXPECT_FALSE(absl::StrContains(k.source, "griddepcontrol")) << "the kernel's own, not the prologue's: " << k.source;
  // With every read after the wait, the prologue holds the wait alone.
  options.reads_before_wait = false;
  lowered = LowerNode(g.node(), options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const KernelSpec& late = lowered->kernels.at(0);
  EXPECT_FALSE(late.waits_itself);
  EXPECT_TRUE(absl::StrContains(late.source, kGridDependencyWait)) << late.source;
  EXPECT_FALSE(absl::StrContains(late.source, "launch_dependents")) << "the prologue's trigger, not the kernel's: "
                                                                     << late.source;
  // Without programmatic launch, neither.
  options.programmatic_dependent_launch = false;
  options.reads_before_wait = true;
  lowered = LowerNode(g.node(), options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_FALSE(absl::StrContains(lowered->kernels.at(0).source, "griddepcontrol"));
  EXPECT_FALSE(lowered->kernels.at(0).waits_itself);
}

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
  const std::vector<Refused> refused = {
      {{.m = 9}, "m 9 is not in [1, 8]"},
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
  GemmNode off(GemmCase{});
  CodegenOptions no_gemv;
  no_gemv.small_m_gemv = false;
  EXPECT_EQ(LowerNode(off.node(), no_gemv)->kind, LoweringKind::kGemm);
}

// What it is for: every gemm of a decode step (the projections and the LM head, one row per
// sequence of the batch bucket) takes it, and of a prefill (one row per token) only the LM
// head (one row per sequence: its last token's).
TEST(SmallMGemm, TakesEveryGemmOfTheDecodeStepAndNoneOfThePrefill) {
  const ModelConfig config = *PresetConfig("llama-tiny");
  const PagedKvLayout layout{.num_blocks = 8, .block_size = 16, .max_blocks_per_sequence = 4};
  struct Phase {
    InferencePhase phase;
    int64_t size;
    bool gemv;
  };
  for (const Phase& p : {Phase{InferencePhase::kDecode, 1, true}, Phase{InferencePhase::kDecode, 8, true},
                         Phase{InferencePhase::kPrefill, 16, false}}) {
    std::unique_ptr<Module> m = *BuildLlamaInferenceModule(config, layout, Precision::kBf16, p.phase, p.size);
    ASSERT_TRUE(CompileInferenceModule(*m, {}).ok());
    int gemms = 0, glus = 0;
    for (const auto& node : m->functions()[0]->nodes()) {
      // The gemms of gemv_glu fusions (passes/fuse_gemv_glu.h: the gate/up projection) and of
      // gemv_norm_gemv fusions (passes/fuse_norm_between_gemvs.h: two each) count too.
      std::vector<const Node*> ns = {node.get()};
      if (node->opcode() == Opcode::kFusion) {
        const FusionKind kind = *FusionKindOf(*node);
        if (kind == FusionKind::kGemvGlu || kind == FusionKind::kGemvNormGemv) {
          ns.clear();
          for (const auto& b : node->body()->nodes()) {
            if (b->opcode() == Opcode::kGemm) ns.push_back(b.get());
          }
          glus += kind == FusionKind::kGemvGlu || MatchGemvNormGemv(*node->body())->glu.out != nullptr;
        }
      }
      for (const Node* n : ns) {
        if (n->opcode() != Opcode::kGemm) continue;
        ++gemms;
        const bool want = p.gemv || absl::StrContains(n->scope(), "lm_head");
        EXPECT_EQ(codegen::SmallMGemmRefusal(*n, {}).empty(), want)
            << n->name() << " (size " << p.size << "): " << codegen::SmallMGemmRefusal(*n, {});
      }
    }
    EXPECT_EQ(gemms, 4 * config.n_layers + 1) << "qkv, o, gate_up, down a layer (joined weights), and the LM head";
    EXPECT_EQ(glus, p.gemv ? config.n_layers : 0) << "the MLP's SwiGLU computed by its gate/up GEMV";
  }
}

// A row longer than one round of a warp's loads is split over the fewest warps (a power of
// two) whose one round covers it, and their sums meet in shared memory: llama-M's down
// projection (704 chunks of 16 bytes a row) over 4 warps of 6 chunks a lane, 2 rows each, a
// block a group; its q/k/v projection (256 chunks) over 2 warps of 4 chunks, 2 rows a block.
// (B is a parameter nothing writes: its first round is read before the grid-dependency wait,
// the template's last argument.)
TEST(SmallMGemm, SplitsALongRowOverWarps) {
  struct Want {
    GemmCase c;
    std::string call;
    uint32_t grid, block;
  };
  const std::vector<Want> wants = {
      {{.m = 1, .n = 2048, .k = 5632},
       "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 1, 2048LL, 5632LL, 2, 4, 6, 1, false, true>", 1024, 128},
      {{.m = 1, .n = 4096, .k = 2048},
       "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 1, 4096LL, 2048LL, 1, 2, 4, 2, false, true>", 2048, 128},
      // 8 rows of A: 2 chunks a lane of 4 B rows; 256 chunks take 4 warps.
      {{.m = 8, .n = 1030, .k = 2048},
       "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 8, 1030LL, 2048LL, 4, 4, 2, 1, false, true>", 258, 128},
      // Past 8 warps the row takes more rounds: 704 chunks over 8 warps of 2 chunks, 2 rounds.
      {{.m = 8, .n = 2048, .k = 5632},
       "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 8, 2048LL, 5632LL, 4, 8, 2, 1, false, true>", 512, 256},
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

// A geometry given for one shape ($KILN_GEMV_GEOMETRY's "NxK=RxSxUxG") is that shape's alone:
// the other shapes keep theirs, and the shape's entry wins over a geometry for every shape.
TEST(SmallMGemm, TakesAGeometryGivenForItsShape) {
  absl::StatusOr<std::vector<CodegenOptions::GemvShapeGeometry>> shapes =
      ParseGemvShapeGeometries("4096x2048=4x4x4x1, 2048x5632=4x4x6x1");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ((*shapes)[1].n, 2048);
  EXPECT_EQ((*shapes)[1].k, 5632);
  EXPECT_EQ((*shapes)[1].geometry.unroll, 6);
  CodegenOptions options;
  options.small_m_gemv_shape_geometries = {(*shapes)[0]};
  options.small_m_gemv_geometry = {1, 1, 2, 4};
  GemmNode qkv(GemmCase{.m = 1, .n = 4096, .k = 2048});
  absl::StatusOr<LoweredNode> lowered = LowerNode(qkv.node(), options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_TRUE(absl::StrContains(lowered->kernels.at(0).source,
                                "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 1, 4096LL, 2048LL, 4, 4, 4, 1, false, true>"))
      << lowered->kernels.at(0).source;
  EXPECT_EQ(lowered->kernels.at(0).grid[0], 1024u);
  EXPECT_EQ(lowered->kernels.at(0).block[0], 128u);
  GemmNode o(GemmCase{.m = 1, .n = 2048, .k = 2048});
  lowered = LowerNode(o.node(), options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_TRUE(absl::StrContains(lowered->kernels.at(0).source,
                                "SmallMGemm<__nv_bfloat16, __nv_bfloat16, 1, 2048LL, 2048LL, 1, 1, 2, 4, false, true>"))
      << "another shape takes the geometry for every shape: " << lowered->kernels.at(0).source;

  for (const char* bad : {"4096x2048", "4096=1x2x4x2", "4096x2048=1x2x4", "4096x2048=1x0x4x2", "ax2048=1x2x4x2",
                          "4096x2048x8=1x2x4x2", "4096x2048=1x2x4x2=1x2x4x2"}) {
    absl::StatusOr<std::vector<CodegenOptions::GemvShapeGeometry>> parsed = ParseGemvShapeGeometries(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), "want ")) << parsed.status();
  }
  EXPECT_FALSE(ParseGemvGeometry("1x2x4x2x1").ok());
  EXPECT_TRUE(ParseGemvGeometry("1x2x4x2").ok());
}

#ifdef KILN_WITH_CUDA
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
    absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{.ptxas_info = true});
    ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
    EXPECT_TRUE(absl::StrContains(compiled->log, "0 bytes spill stores")) << compiled->log;
    EXPECT_TRUE(absl::StrContains(compiled->log, "0 bytes stack frame")) << compiled->log;
    std::printf("[ m %lld n %lld k %lld ] %s\n", static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.k),
                compiled->log.substr(compiled->log.find("Used"), compiled->log.find('\n', compiled->log.find("Used")) -
                                                                      compiled->log.find("Used"))
                    .c_str());
  }
}
#endif

}  // namespace
}  // namespace kiln
