// Codegen without a GPU: every op lowers and its kernels compile with NVRTC for sm_90a;
// the generated sources have the structure we mean (vector widths, index types, reduction
// strategies, exact constant bits); and every kernel of llama-tiny, llama-S, llama-M, gpt2-tiny and gpt2-124M,
// forward and training step, compiles with zero errors. Whether the kernels compute the
// right numbers is checked on the GPU (tests/gpu_*).
#include <gtest/gtest.h>

#ifdef KILN_WITH_CUDA

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/compile_function.h"
#include "codegen/kernel_cache.h"
#include "codegen/lower_node.h"
#include "passes/lower_gemm.h"
#include "passes/target.h"
#include "codegen/nvrtc_compiler.h"
#include "frontends/gpt2.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "ir/builder.h"
#include "ir/status_macros.h"
#include "ir/text_format.h"
#include "passes/default_pipeline.h"
#include "passes/fusion.h"
#include "passes/training_step.h"
#include "tests/testing/all_ops.h"
#include "tests/testing/tiny_decode.h"
#include "tests/testing/training_steps.h"

namespace kiln {
namespace {

bool IsElf(const std::string& cubin) { return cubin.size() > 4 && cubin.compare(0, 4, "\x7f" "ELF") == 0; }

// A one-function module built by `build`, which returns the node under test.
class OneNode {
 public:
  template <typename Build>
  explicit OneNode(Build build) : module_("m"), b_(module_.AddFunction("f")) {
    absl::StatusOr<Node*> n = build(b_);
    EXPECT_TRUE(n.ok()) << n.status();
    node_ = n.ok() ? *n : nullptr;
  }
  const Node& node() const { return *node_; }
  LoweredNode Lowered() const {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*node_);
    EXPECT_TRUE(lowered.ok()) << lowered.status();
    return lowered.ok() ? *std::move(lowered) : LoweredNode{};
  }
  // The single kernel the node lowers to.
  KernelSpec Kernel() const {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*node_);
    EXPECT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_EQ(lowered->kind, LoweringKind::kKernels);
    EXPECT_EQ(lowered->kernels.size(), 1u);
    return lowered->kernels.empty() ? KernelSpec{} : lowered->kernels[0];
  }

 private:
  Module module_;
  Builder b_;
  Node* node_ = nullptr;
};

// Compiles `k` for sm_90a and expects a cubin.
void ExpectCompiles(const KernelSpec& k) {
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{});
  ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << k.source;
  EXPECT_TRUE(IsElf(compiled->cubin)) << k.name;
  EXPECT_FALSE(compiled->from_cache);
}

// Whether the body of the source's kernel starts with kGridDependencyPrologue, before any
// statement that could touch global memory; a kernel that waits itself (KernelSpec::waits_itself)
// with launch_dependents alone.
bool OpensWithGridDependencyWait(const KernelSpec& k) {
  const size_t entry = k.source.find("extern \"C\" __global__");
  const size_t body = entry == std::string::npos ? entry : k.source.find('{', entry);
  const std::string prologue =
      absl::StrCat("\n", k.waits_itself ? kGridDependencyLaunch : kGridDependencyPrologue);
  return body != std::string::npos && k.source.compare(body + 1, prologue.size(), prologue) == 0;
}

TEST(Codegen, EveryOpOfTheAllOpsModuleLowersAndCompiles) {
  std::unique_ptr<Module> module = testing::BuildAllOpsModule();
  // As every compile does before codegen: dot_general becomes gemm.
  ASSERT_TRUE(LowerGemmPass().Run(*module).ok());
  std::map<std::string, std::string> failures;  // op -> first error
  std::set<std::string> compiled_ops;
  std::vector<const Node*> nodes;  // @main's, then @attention's (the shapes flash kernels take)
  for (const auto& f : module->functions()) {
    for (const auto& n : f->nodes()) nodes.push_back(n.get());
  }
  for (const Node* node : nodes) {
    const std::string op(node->op_name());
    absl::StatusOr<LoweredNode> lowered = LowerNode(*node);
    if (!lowered.ok()) {
      failures.try_emplace(op, absl::StrCat("lowering: ", lowered.status().message()));
      continue;
    }
    for (const KernelSpec& k : lowered->kernels) {
      // Every kernel may be launched programmatically (codegen/kernel_spec.h): it waits for
      // the kernels before it first thing.
      if (!k.waits_for_grid_dependency || !OpensWithGridDependencyWait(k)) {
        failures.try_emplace(op, absl::StrCat("kernel ", k.name, " does not open with griddepcontrol.wait"));
      }
      absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{});
      if (!compiled.ok()) {
        failures.try_emplace(op, absl::StrCat("NVRTC: ", compiled.status().message()));
      } else if (!IsElf(compiled->cubin) || compiled->name != k.name) {
        failures.try_emplace(op, "NVRTC returned something other than an ELF cubin");
      }
    }
    if (lowered->kind == LoweringKind::kKernels && !failures.count(op)) compiled_ops.insert(op);
  }
  std::string report;
  for (const auto& [op, error] : failures) absl::StrAppend(&report, "\n--- ", op, ": ", error);
  EXPECT_TRUE(failures.empty()) << failures.size() << " op(s) failed: "
                                << absl::StrJoin(failures, ", ", [](std::string* out, const auto& f) {
                                     out->append(f.first);
                                   })
                                << report;
  // Every op but dot_general (lowered away) and the four without kernels (parameter,
  // reshape, gemm, get_result) made some.
  EXPECT_EQ(compiled_ops.size() + failures.size(), static_cast<size_t>(kNumOpcodes - 5));
}

// A kernel reads before its grid-dependency wait only what no kernel of the step writes: the
// decode step's norm weight, block tables and positions (parameters no output aliases), never
// a weight the step updates (donated: a training step's), nor anything without programmatic
// launch.
TEST(Codegen, OnlyStepInvariantValuesAreReadBeforeTheWait) {
  for (const bool donated : {false, true}) {
    SCOPED_TRACE(donated ? "w donated" : "w invariant");
    absl::StatusOr<std::unique_ptr<Module>> module = ParseModule(
        "module @m\nfunc @step {\n"
        "  %x = parameter() {index=0} : f32[1,2048]\n"
        "  %w = parameter() {index=1} : f32[2048]\n"
        "  %y = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[1,2048]\n"
        "  %w2 = exp(%w) : f32[2048]\n"
        "  return %y, %w2\n}\n");
    ASSERT_TRUE(module.ok()) << module.status();
    Function& f = *(*module)->functions()[0];
    f.SetOutputs(f.outputs(), donated ? std::vector<int64_t>{-1, 1} : std::vector<int64_t>{});
    const Node* y = f.outputs()[0];
    for (const bool pdl : {true, false}) {
      CodegenOptions options;
      options.programmatic_dependent_launch = pdl;
      absl::StatusOr<LoweredNode> lowered = LowerNode(*y, options);
      ASSERT_TRUE(lowered.ok()) << lowered.status();
      ASSERT_EQ(lowered->kernels.size(), 1u);
      const KernelSpec& k = lowered->kernels[0];
      EXPECT_EQ(k.waits_itself, pdl && !donated);
      EXPECT_EQ(absl::StrContains(k.source, ", float, float, true>"), pdl && !donated) << k.source;
      if (pdl) EXPECT_TRUE(OpensWithGridDependencyWait(k)) << k.source;
      absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{});
      EXPECT_TRUE(compiled.ok()) << compiled.status();
    }
  }
}

// On whole functions: llama-tiny's decode step reads its norm weights, block tables,
// positions and projection weights before the waits of its norms, attention and GEMVs (all of
// them parameters nothing writes); its training step, whose weights the step updates (donated),
// reads nothing before any wait.
TEST(Codegen, TheDecodeStepReadsItsInvariantsEarlyAndTheTrainingStepNothing) {
  std::unique_ptr<Module> decode = testing::TinyDecode(1, {});
  const int layers = PresetConfig("llama-tiny")->n_layers;
  std::map<std::string, int> early;  // kernel label (op or group) -> kernels that wait themselves
  for (const auto& n : decode->functions()[0]->nodes()) {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
    ASSERT_TRUE(lowered.ok()) << n->name() << ": " << lowered.status();
    for (const KernelSpec& k : lowered->kernels) {
      if (k.waits_itself) ++early[n->opcode() == Opcode::kFusion ? lowered->label : std::string(n->op_name())];
    }
  }
  EXPECT_EQ(early["rms_norm"], 2 * layers + 1);
  EXPECT_EQ(early["paged_attention"], layers);
  EXPECT_EQ(early["gemm"], 3 * layers + 1) << "qkv, o, down and the LM head";
  EXPECT_EQ(early["gemv"], layers) << "the gate/up GEMV computing the SwiGLU (a gemv_glu fusion)";

  testing::CompiledTrainingStep training =
      testing::CompileLlamaTinyStepWithoutMergedGemms(2, 16, Precision::kBf16, /*clip_norm=*/1.0);
  int training_early = 0;
  for (const auto& n : training.step->nodes()) {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
    ASSERT_TRUE(lowered.ok()) << n->name() << ": " << lowered.status();
    for (const KernelSpec& k : lowered->kernels) training_early += k.waits_itself;
  }
  EXPECT_EQ(training_early, 0);
}

// Without programmatic dependent launch, or for a GPU before sm_90 (griddepcontrol is PTX for
// sm_90 on), no kernel holds the wait, so the runtime launches none programmatically.
TEST(Codegen, GridDependencyWaitFollowsTheOptionAndTheTarget) {
  std::unique_ptr<Module> module = testing::BuildAllOpsModule();
  ASSERT_TRUE(LowerGemmPass().Run(*module).ok());
  CodegenOptions off;
  off.programmatic_dependent_launch = false;
  CodegenOptions ampere;
  ampere.target = TargetForArch("sm_80").value();
  int kernels = 0;
  for (const auto& f : module->functions()) {
    for (const auto& n : f->nodes()) {
      for (const CodegenOptions& options : {off, ampere}) {
        absl::StatusOr<LoweredNode> lowered = LowerNode(*n, options);
        ASSERT_TRUE(lowered.ok()) << n->op_name() << ": " << lowered.status();
        for (const KernelSpec& k : lowered->kernels) {
          ++kernels;
          EXPECT_FALSE(k.waits_for_grid_dependency) << k.name << " on " << options.target.arch;
          EXPECT_FALSE(absl::StrContains(k.source, "griddepcontrol")) << k.name << " on " << options.target.arch;
        }
      }
    }
  }
  EXPECT_GT(kernels, 100);
}

// The kernels of attention at GQA 4:2, T `t`, D 64 (O bf16 with bf16_o), and with bf16_o of
// an attention_delta reading that O, lowered for `target`: one kernel per node, in order.
std::vector<KernelSpec> LowerAttentionForward(int64_t t, const Target& target, bool bf16_o) {
  Module m;
  Builder a(m.AddFunction("f"));
  const DType bf16 = DType::kBF16;
  Node* q = *a.Parameter("q", {bf16, {1, 4, t, 64}});
  Node* k = *a.Parameter("k", {bf16, {1, 2, t, 64}});
  Node* v = *a.Parameter("v", {bf16, {1, 2, t, 64}});
  AttrMap attrs{{"scale", 0.125}};
  if (bf16_o) attrs.Set("out_dtype", Symbol{"bf16"});
  absl::StatusOr<std::vector<Node*>> r = a.MultiResultOp(Opcode::kAttention, {q, k, v}, attrs, {"o", "lse"});
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  if (bf16_o) {
    Node* dout = *a.Parameter("dout", {bf16, {1, 4, t, 64}});
    EXPECT_TRUE(a.Op(Opcode::kAttentionDelta, {(*r)[0], dout}).ok());
  }
  std::vector<KernelSpec> kernels;
  for (const auto& n : m.functions()[0]->nodes()) {
    if (n->opcode() != Opcode::kAttention && n->opcode() != Opcode::kAttentionDelta) continue;
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n, CodegenOptions{.target = target});
    EXPECT_TRUE(lowered.ok()) << lowered.status();
    if (!lowered.ok() || lowered->kernels.size() != 1) return {};
    kernels.push_back(lowered->kernels[0]);
  }
  return kernels;
}

// attention's forward is the Target's: wgmma on sm_90a when T is a multiple of 128 (the
// kernel's tiles), mma.sync on other targets and shapes. Both compile with NVRTC. The
// backward (AttentionBackwardRunsOnWgmmaWhereTheForwardDoes) follows the same rule.
TEST(Codegen, AttentionForwardRunsOnWgmmaWhereTheTargetHasIt) {
  auto lower = [](int64_t t, const Target& target) -> KernelSpec {
    std::vector<KernelSpec> kernels = LowerAttentionForward(t, target, /*bf16_o=*/false);
    return kernels.size() == 1 ? kernels[0] : KernelSpec{};
  };
  const Target hopper = *TargetForArch("sm_90a"), ampere = *TargetForArch("sm_80");
  const KernelSpec wgmma = lower(256, hopper);
  EXPECT_TRUE(absl::StrContains(wgmma.source, "FlashAttentionWgmmaForward<float, 1, 4, 2, 256, 64>")) << wgmma.source;
  EXPECT_EQ(wgmma.block[0], 384u);
  EXPECT_EQ(wgmma.grid[0], 4u * 256 / 128);
  ExpectCompiles(wgmma);
  for (const KernelSpec& k : {lower(256, ampere), lower(192, hopper)}) {
    EXPECT_TRUE(absl::StrContains(k.source, "FlashAttentionForward<float, 1, 4, 2, ")) << k.source;
    EXPECT_EQ(k.block[0], 128u);
    ExpectCompiles(k);
  }
}

// attention {out_dtype=bf16} (what narrow-activations-bf16 makes of a training step's
// attention) instantiates both forwards with a bf16 O, and attention_delta reads that O as
// bf16 (its TO); all of them compile with NVRTC.
TEST(Codegen, AttentionWithABf16OutputStoresBf16AndDeltaReadsIt) {
  auto lower = [](int64_t t, const Target& target) { return LowerAttentionForward(t, target, /*bf16_o=*/true); };
  const Target hopper = *TargetForArch("sm_90a"), ampere = *TargetForArch("sm_80");
  const std::vector<KernelSpec> wgmma = lower(256, hopper);
  ASSERT_EQ(wgmma.size(), 2u);
  EXPECT_TRUE(absl::StrContains(wgmma[0].source, "FlashAttentionWgmmaForward<__nv_bfloat16, 1, 4, 2, 256, 64>"))
      << wgmma[0].source;
  EXPECT_TRUE(absl::StrContains(wgmma[0].source, "__nv_bfloat16* out")) << wgmma[0].source;
  const std::vector<KernelSpec> mma_sync = lower(192, hopper);
  ASSERT_EQ(mma_sync.size(), 2u);
  EXPECT_TRUE(absl::StrContains(mma_sync[0].source, "FlashAttentionForward<__nv_bfloat16, 1, 4, 2, 192, 64>"))
      << mma_sync[0].source;
  for (const std::vector<KernelSpec>& kernels : {wgmma, mma_sync, lower(256, ampere)}) {
    ASSERT_EQ(kernels.size(), 2u);
    EXPECT_TRUE(absl::StrContains(kernels[1].source, "FlashAttentionBackwardDelta<__nv_bfloat16, __nv_bfloat16, "))
        << kernels[1].source;
    for (const KernelSpec& k : kernels) ExpectCompiles(k);
  }
}

// attention_grad's dq and dk/dv kernels: wgmma on sm_90a when T is a multiple of 128 (the
// forward's rule, so the two read and write the same LSE), mma.sync elsewhere; at D 128 on
// wgmma one fused kernel after dq's zeroing (unless CodegenOptions turns it off); every one
// compiles with NVRTC.
TEST(Codegen, AttentionBackwardRunsOnWgmmaWhereTheForwardDoes) {
  auto lower = [](int64_t t, int64_t d, const Target& target, bool fused = true) -> std::vector<KernelSpec> {
    Module m;
    Builder a(m.AddFunction("f"));
    const DType bf16 = DType::kBF16, f32 = DType::kF32;
    Node* q = *a.Parameter("q", {bf16, {1, 4, t, d}});
    Node* k = *a.Parameter("k", {bf16, {1, 2, t, d}});
    Node* v = *a.Parameter("v", {bf16, {1, 2, t, d}});
    Node* dout = *a.Parameter("dout", {bf16, {1, 4, t, d}});
    Node* lse = *a.Parameter("lse", {f32, {1, 4, t}});
    Node* delta = *a.Parameter("delta", {f32, {1, 4, t}});
    absl::StatusOr<std::vector<Node*>> r = a.MultiResultOp(Opcode::kAttentionGrad, {q, k, v, dout, lse, delta},
                                                           {{"scale", 0.125}}, {"dq", "dk", "dv"});
    EXPECT_TRUE(r.ok()) << r.status();
    for (const auto& n : m.functions()[0]->nodes()) {
      if (n->opcode() != Opcode::kAttentionGrad) continue;
      absl::StatusOr<LoweredNode> lowered =
          LowerNode(*n, CodegenOptions{.target = target, .fused_attention_backward = fused});
      EXPECT_TRUE(lowered.ok()) << lowered.status();
      if (!lowered.ok()) return {};
      return lowered->kernels;
    }
    return {};
  };
  const Target hopper = *TargetForArch("sm_90a"), ampere = *TargetForArch("sm_80");
  for (const auto& [d, fused] : std::vector<std::pair<int64_t, bool>>{{64, true}, {128, false}}) {
    // D 64, or the fused backward off: the dq kernel, then the dk/dv kernel
    SCOPED_TRACE(absl::StrCat("D ", d));
    const std::vector<KernelSpec> wgmma = lower(256, d, hopper, fused);
    ASSERT_EQ(wgmma.size(), 2u);
    EXPECT_TRUE(absl::StrContains(wgmma[0].source, absl::StrCat("FlashAttentionWgmmaBackwardDq<float, 1, 4, 2, 256, ",
                                                                d, ">(dq, ")))
        << wgmma[0].source;
    EXPECT_TRUE(absl::StrContains(wgmma[1].source, absl::StrCat("FlashAttentionWgmmaBackwardDkDv<float, 1, 4, 2, 256, ",
                                                                d, ">(dk, dv, ")))
        << wgmma[1].source;
    for (const KernelSpec& k : wgmma) {
      EXPECT_EQ(k.block[0], 384u);
      ExpectCompiles(k);
    }
    EXPECT_EQ(wgmma[0].grid[0], 4u * 256 / 128);  // 128 queries of each head
    EXPECT_EQ(wgmma[1].grid[0], 2u * 256 / 128);  // 128 keys of each kv head
  }
  {  // D 128: dq zeroed, then one kernel adding into it and writing dk and dv
    const std::vector<KernelSpec> wgmma = lower(256, 128, hopper);
    ASSERT_EQ(wgmma.size(), 2u);
    EXPECT_TRUE(absl::StrContains(wgmma[0].source, absl::StrCat("FlashAttentionZero<", 4 * 256 * 128, "LL>(dq)")))
        << wgmma[0].source;
    EXPECT_TRUE(absl::StrContains(wgmma[1].source, "FlashAttentionWgmmaBackward<1, 4, 2, 256, 128>(dq, dk, dv, "))
        << wgmma[1].source;
    for (const KernelSpec& k : wgmma) ExpectCompiles(k);
    EXPECT_EQ(wgmma[0].block[0], 256u);
    EXPECT_EQ(wgmma[1].block[0], 384u);
    EXPECT_EQ(wgmma[1].grid[0], 2u * 256 / 128);  // 128 keys of each kv head
  }
  for (const std::vector<KernelSpec>& kernels : {lower(256, 64, ampere), lower(192, 64, hopper)}) {
    ASSERT_EQ(kernels.size(), 2u);
    EXPECT_TRUE(absl::StrContains(kernels[0].source, "FlashAttentionBackwardDq<__nv_bfloat16, float, 1, 4, 2, "))
        << kernels[0].source;
    EXPECT_TRUE(absl::StrContains(kernels[1].source, "FlashAttentionBackwardDkDv<__nv_bfloat16, float, 1, 4, 2, "))
        << kernels[1].source;
    for (const KernelSpec& k : kernels) {
      EXPECT_EQ(k.block[0], 128u);
      ExpectCompiles(k);
    }
  }
}

TEST(Codegen, LoweringKindsOfWorklessOps) {
  OneNode reshape([](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {DType::kBF16, {4, 6}}));
    return b.Reshape(x, {24});
  });
  EXPECT_EQ(LowerNode(reshape.node())->kind, LoweringKind::kAlias);
  EXPECT_EQ(LowerNode(*reshape.node().operand(0))->kind, LoweringKind::kInput);
  OneNode dot([](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {DType::kBF16, {4, 8}}));
    ASSIGN_OR_RETURN(Node * w, b.Parameter("w", {DType::kBF16, {16, 8}}));
    return b.DotGeneral(x, w, {{}, {}, {1}, {1}}, DType::kF32);
  });
  absl::StatusOr<LoweredNode> unlowered = LowerNode(dot.node());
  ASSERT_FALSE(unlowered.ok());
  EXPECT_NE(unlowered.status().message().find("the lower-gemm pass"), std::string::npos) << unlowered.status();
  // 16 rows of A: past SmallMGemm's 8 (tests/gemv_lowering_test.cc), so cuBLASLt's.
  OneNode gemm_node([](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {DType::kBF16, {16, 8}}));
    ASSIGN_OR_RETURN(Node * w, b.Parameter("w", {DType::kBF16, {16, 8}}));
    const TensorType out{DType::kF32, {16, 16}};
    return b.Op(Opcode::kGemm, {x, w},
                AttrMap{{"batch", int64_t{1}}, {"m", int64_t{16}}, {"n", int64_t{16}}, {"k", int64_t{8}},
                        {"a_layout", Symbol{"mk"}}, {"b_layout", Symbol{"nk"}}, {"alpha", 1.0}, {"beta", 0.0},
                        {"epilogue", Symbol{"none"}}},
                &out);
  });
  absl::StatusOr<LoweredNode> gemm = LowerNode(gemm_node.node());
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  EXPECT_EQ(gemm->kind, LoweringKind::kGemm);
  EXPECT_TRUE(gemm->kernels.empty());
}

// An elementwise node on `n` elements of `in` producing `out` (via convert when they differ).
KernelSpec ElementwiseKernel(DType in, DType out, int64_t n) {
  OneNode one([&](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {in, {n}}));
    ASSIGN_OR_RETURN(Node * y, b.Parameter("y", {in, {n}}));
    if (in != out) return b.Convert(x, out);
    return b.Add(x, y);
  });
  return one.Kernel();
}

TEST(Codegen, ElementwiseUsesSixteenByteVectorsWhenTheCountAllows) {
  EXPECT_TRUE(absl::StrContains(ElementwiseKernel(DType::kF32, DType::kF32, 1024).source, "Vec<float, 4>"));
  EXPECT_TRUE(absl::StrContains(ElementwiseKernel(DType::kBF16, DType::kBF16, 4096).source, "Vec<__nv_bfloat16, 8>"));
  EXPECT_TRUE(absl::StrContains(ElementwiseKernel(DType::kF8E4M3, DType::kF8E4M3, 64).source, "Vec<__nv_fp8_e4m3, 16>"));
  // f32 -> bf16: 4 elements per access, so the f32 load is 16 bytes and the bf16 store 8.
  const KernelSpec narrow = ElementwiseKernel(DType::kF32, DType::kBF16, 1024);
  EXPECT_TRUE(absl::StrContains(narrow.source, "Vec<float, 4>"));
  EXPECT_TRUE(absl::StrContains(narrow.source, "Vec<__nv_bfloat16, 4>"));
  EXPECT_TRUE(absl::StrContains(narrow.source, "__float2bfloat16_rn"));
  // 6 bf16 elements: 2 per access; 1023: one.
  EXPECT_TRUE(absl::StrContains(ElementwiseKernel(DType::kBF16, DType::kBF16, 6).source, "Vec<__nv_bfloat16, 2>"));
  EXPECT_TRUE(absl::StrContains(ElementwiseKernel(DType::kF32, DType::kF32, 1023).source, "Vec<float, 1>"));
  for (DType in : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2, DType::kI32, DType::kI64}) {
    for (DType out : {DType::kF32, DType::kBF16, DType::kF8E5M2, DType::kI32, DType::kI64, DType::kPred}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(in), " -> ", DTypeName(out)));
      ExpectCompiles(ElementwiseKernel(in, out, 40));
    }
  }
}

// The one kernel of the (last) fusion node of `m`'s first function.
KernelSpec TheFusionsKernel(const Module& m) {
  const Node* fusion = nullptr;
  for (const auto& n : m.functions()[0]->nodes()) {
    if (n->opcode() == Opcode::kFusion) fusion = n.get();
  }
  EXPECT_NE(fusion, nullptr);
  if (fusion == nullptr) return {};
  absl::StatusOr<LoweredNode> lowered = LowerNode(*fusion);
  EXPECT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered.ok() ? lowered->kernels.size() : 0, 1u);
  return lowered.ok() && lowered->kernels.size() == 1 ? lowered->kernels[0] : KernelSpec{};
}

// A loop fusion's kernel computes 8 consecutive elements per thread: the output and the
// inputs read at the element's own index as vectors, a broadcast input element by element,
// a scalar loop for the elements past the last whole vector (and for unaligned pointers).
TEST(Codegen, LoopFusionsMoveWholeVectors) {
  for (int64_t columns : {int64_t{4096}, int64_t{1031}}) {
    SCOPED_TRACE(columns);
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(absl::StrCat(R"(module @m
func @main {
  %a = parameter() {index=0} : bf16[16,)", columns, R"(]
  %b = parameter() {index=1} : f32[16,)", columns, R"(]
  %w = parameter() {index=2} : f32[)", columns, R"(]
  %x = convert(%a) : f32[16,)", columns, R"(]
  %s = sigmoid(%x) : f32[16,)", columns, R"(]
  %y = mul(%s, %b) : f32[16,)", columns, R"(]
  %wb = broadcast(%w) {dims=[1]} : f32[16,)", columns, R"(]
  %z = add(%y, %wb) : f32[16,)", columns, R"(]
  %out = convert(%z) : bf16[16,)", columns, R"(]
  return %out
})"));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(FusionPass().Run(**m).ok());
    const KernelSpec kernel = TheFusionsKernel(**m);
    const std::string& source = kernel.source;
    EXPECT_TRUE(absl::StrContains(source, "constexpr int kWidth = 8;")) << source;
    EXPECT_TRUE(absl::StrContains(source, "const Vec<__nv_bfloat16, kWidth> a0 = LoadVec<kWidth>(in0, vec);")) << source;
    EXPECT_TRUE(absl::StrContains(source, "const Vec<float, kWidth> a1 = LoadVec<kWidth>(in1, vec);")) << source;
    EXPECT_FALSE(absl::StrContains(source, "a2 = LoadVec")) << source;  // the broadcast weight
    EXPECT_TRUE(absl::StrContains(source, "in2[")) << source;
    EXPECT_TRUE(absl::StrContains(source, "StoreVec<kWidth>(out0, vec, result);")) << source;
    EXPECT_TRUE(absl::StrContains(source, "for (Index i = (aligned ? kVectors * kWidth : 0) + first;")) << source;
    ExpectCompiles(kernel);
  }
}

// Index maps that keep the last dim carry a vector's lanes on as one contiguous run: GPT-2's
// q taken from the qkv GEMM's output (a slice at a multiple of 8 along the last dim, a
// reshape into heads, a transpose that moves the heads but not the head dim) loads whole
// vectors from the run's first index; a slice starting off a multiple of 8, or a transpose
// that moves the last dim, still reads element by element.
TEST(Codegen, LoopFusionsCarryVectorsThroughIndexMapsThatKeepTheLastDim) {
  struct Case {
    std::string slice_start, perm;
    bool vector;
  };
  for (const Case& c : std::vector<Case>{{"768", "0,2,1,3", true}, {"764", "0,2,1,3", false}, {"768", "0,1,3,2", false}}) {
    SCOPED_TRACE(c.slice_start + " perm " + c.perm);
    const bool moves_last = c.perm == "0,1,3,2";
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(absl::StrCat(R"(module @m
func @main {
  %qkv = parameter() {index=0} : bf16[2,64,2304]
  %q = slice(%qkv) {start=[0,0,)", c.slice_start, R"(], limit=[2,64,)", std::stoi(c.slice_start) + 768, R"(], stride=[1,1,1]} : bf16[2,64,768]
  %heads = reshape(%q) : bf16[2,64,12,64]
  %t = transpose(%heads) {perm=[)", c.perm, "]} : ", moves_last ? "bf16[2,64,64,12]" : "bf16[2,12,64,64]", R"(
  %f = convert(%t) : )", moves_last ? "f32[2,64,64,12]" : "f32[2,12,64,64]", R"(
  return %f
})"));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(FusionPass().Run(**m).ok());
    const KernelSpec kernel = TheFusionsKernel(**m);
    const std::string& source = kernel.source;
    EXPECT_EQ(absl::StrContains(source, "const Vec<__nv_bfloat16, kWidth> a0_r"), c.vector) << source;
    EXPECT_EQ(absl::StrContains(source, "in0[i"), true) << source;  // the scalar tail (and lanes, when not a run)
    EXPECT_TRUE(absl::StrContains(source, "StoreVec<kWidth>(out0, vec, result);")) << source;
    ExpectCompiles(kernel);
  }
}

// GPT-2's d(qkv): dq, dk and dv (f32, [B, H, T, D]) converted, transposed back to rows and
// concatenated with zeros along the last dim, then added. Every operand run is a multiple of
// 8, so a vector's lanes take one branch: lane 0 computes all 8 inside it, reading each
// gradient along a run of its own (a vector load from the run's first index), not 8 scalars.
TEST(Codegen, LoopFusionsCarryVectorsThroughConcatenatesOfWholeRuns) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %dq = parameter() {index=0} : f32[2,12,16,64]
  %dk = parameter() {index=1} : f32[2,12,16,64]
  %zeros = constant() {value=0.0} : bf16[2,16,1536]
  %zero = constant() {value=0.0} : bf16[2,16,768]
  %nq = convert(%dq) : bf16[2,12,16,64]
  %tq = transpose(%nq) {perm=[0,2,1,3]} : bf16[2,16,12,64]
  %rq = reshape(%tq) : bf16[2,16,768]
  %cq = concatenate(%rq, %zeros) {dim=2} : bf16[2,16,2304]
  %nk = convert(%dk) : bf16[2,12,16,64]
  %tk = transpose(%nk) {perm=[0,2,1,3]} : bf16[2,16,12,64]
  %rk = reshape(%tk) : bf16[2,16,768]
  %ck = concatenate(%zero, %rk, %zero) {dim=2} : bf16[2,16,2304]
  %sum = add(%cq, %ck) : bf16[2,16,2304]
  return %sum
})");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(FusionPass().Run(**m).ok());
  const KernelSpec kernel = TheFusionsKernel(**m);
  const std::string& source = kernel.source;
  EXPECT_TRUE(absl::StrContains(source, "[kWidth];")) << source;
  EXPECT_TRUE(absl::StrContains(source, "const Vec<float, kWidth> a0_r")) << source;
  EXPECT_TRUE(absl::StrContains(source, "const Vec<float, kWidth> a1_r")) << source;
  ExpectCompiles(kernel);
}

// A loop fusion of several results (rematerialize merges a recomputed value into the
// kernel that reads its inputs anyway): one loop computes every result at each index and
// stores each as a vector.
TEST(Codegen, LoopFusionsOfSeveralResultsStoreEach) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %g = parameter() {index=0} : bf16[16,1024]
  %u = parameter() {index=1} : bf16[16,1024]
  %d = parameter() {index=2} : bf16[16,1024]
  %du, %h = fusion(%g, %u, %d) {kind=loop} : (bf16[16,1024], bf16[16,1024]) {
    %g = parameter() {index=0} : bf16[16,1024]
    %u = parameter() {index=1} : bf16[16,1024]
    %d = parameter() {index=2} : bf16[16,1024]
    %s = sigmoid(%g) : bf16[16,1024]
    %du = mul(%d, %s) : bf16[16,1024]
    %h = mul(%s, %u) : bf16[16,1024]
    return %du, %h
  }
  return %du, %h
})");
  ASSERT_TRUE(m.ok()) << m.status();
  const KernelSpec kernel = TheFusionsKernel(**m);
  const std::string& source = kernel.source;
  EXPECT_TRUE(absl::StrContains(source, "__nv_bfloat16* out0, __nv_bfloat16* out1, const")) << source;
  EXPECT_TRUE(absl::StrContains(source, "StoreVec<kWidth>(out0, vec, result);")) << source;
  EXPECT_TRUE(absl::StrContains(source, "StoreVec<kWidth>(out1, vec, result);")) << source;
  EXPECT_TRUE(absl::StrContains(source, "out1[i] = ")) << source;
  ExpectCompiles(kernel);
}

TEST(Codegen, NamesSourcesAndDeterminism) {
  OneNode one([](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {DType::kF32, {8}}));
    b.set_scope("layers.0");
    return b.Unary(Opcode::kExp, x);
  });
  const KernelSpec k = one.Kernel();
  EXPECT_TRUE(absl::StartsWith(k.name, "k_")) << k.name;
  EXPECT_TRUE(absl::EndsWith(k.name, "_exp")) << k.name;
  EXPECT_TRUE(absl::StrContains(k.source, absl::StrCat("extern \"C\" __global__ void __launch_bounds__(256) ", k.name)));
  EXPECT_TRUE(absl::StrContains(k.source, PrintNode(one.node()))) << k.source;
  EXPECT_FALSE(absl::StrContains(k.source, "cuda_bf16.h"));  // f32 only: no narrow headers
  EXPECT_EQ(LowerNode(one.node())->kernels[0].source, k.source);
}

TEST(Codegen, IndexTypeWidensOnlyWhenTheCountNeedsIt) {
  auto broadcast_kernel = [](std::vector<int64_t> shape) {
    OneNode one([&](Builder& b) -> absl::StatusOr<Node*> {
      ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {DType::kF32, {}}));
      return b.BroadcastScalar(x, shape);
    });
    return one.Kernel();
  };
  EXPECT_TRUE(absl::StrContains(broadcast_kernel({1024, 1024}).source, "typedef int Index;"));
  const KernelSpec huge = broadcast_kernel({65536, 65536});
  EXPECT_TRUE(absl::StrContains(huge.source, "typedef long long Index;"));
  ExpectCompiles(huge);
}

TEST(Codegen, DataMovementMergesDimsAndVectorizesRows) {
  // A row broadcast [768] -> [16,1024,768]: rows copy as 16-byte vectors.
  OneNode row([](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * w, b.Parameter("w", {DType::kBF16, {768}}));
    return b.Broadcast(w, {2}, {16, 1024, 768});
  });
  const KernelSpec row_kernel = row.Kernel();
  EXPECT_TRUE(absl::StrContains(row_kernel.source, "kiln::LoadVec<8>(in + src, 0)")) << row_kernel.source;
  ExpectCompiles(row_kernel);
  // A column broadcast [16] -> [16,64]: one load, stored 8 times.
  OneNode column([](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {DType::kBF16, {16}}));
    return b.Broadcast(x, {0}, {16, 64});
  });
  const KernelSpec column_kernel = column.Kernel();
  EXPECT_TRUE(absl::StrContains(column_kernel.source, "r.v[j] = x;")) << column_kernel.source;
  ExpectCompiles(column_kernel);
  // A transpose reads with a stride: one element per thread.
  OneNode transpose([](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {DType::kF32, {2, 64, 32}}));
    return b.Transpose(x, {0, 2, 1});
  });
  const KernelSpec transpose_kernel = transpose.Kernel();
  EXPECT_TRUE(absl::StrContains(transpose_kernel.source, "out[v] = in[src];"));
  ExpectCompiles(transpose_kernel);
  // Concatenating runs of 64 and 32 f32 on the last dim: 4 per access.
  OneNode cat([](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {DType::kF32, {8, 64}}));
    ASSIGN_OR_RETURN(Node * y, b.Parameter("y", {DType::kF32, {8, 32}}));
    return b.Concatenate({x, y}, 1);
  });
  const KernelSpec cat_kernel = cat.Kernel();
  EXPECT_TRUE(absl::StrContains(cat_kernel.source, "kiln::Vec<float, 4> x;")) << cat_kernel.source;
  EXPECT_TRUE(absl::StrContains(cat_kernel.source, "else if ((r -= 16) < 8)")) << cat_kernel.source;
  ExpectCompiles(cat_kernel);
}

KernelSpec ReduceKernel(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> dims, bool max = false) {
  OneNode one([&](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {dtype, shape}));
    return max ? b.ReduceMax(x, dims) : b.ReduceSum(x, dims);
  });
  return one.Kernel();
}

LoweredNode LowerReduction(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> dims) {
  OneNode one([&](Builder& b) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * x, b.Parameter("x", {dtype, shape}));
    return b.ReduceSum(x, dims);
  });
  return one.Lowered();
}

// Over tokens ([16384, C] -> [C], the bias and norm-bias gradients): two stages. Stage 1
// is a block per (tile of 32 16-byte vectors, slice of rows), ~8 blocks per SM of the
// default target (132 SMs); its per-slice sums go to the node's scratch, which stage 2
// folds in slice order.
TEST(Codegen, ColumnReductionsRunInTwoStagesThroughTheScratch) {
  struct Case {
    DType dtype;
    int64_t columns;
    std::string stage1;  // the geometry comment
    uint32_t tiles, slices;
  };
  const std::vector<Case> cases = {
      {DType::kF32, 768, "tiles of 128 columns (32 lanes x 4 elements), 175 row slices of 94 rows", 6, 175},
      {DType::kBF16, 768, "tiles of 256 columns (32 lanes x 8 elements), 256 row slices of 64 rows", 3, 256},
      {DType::kF32, 2304, "tiles of 128 columns (32 lanes x 4 elements), 59 row slices of 278 rows", 18, 59},
      {DType::kBF16, 2304, "tiles of 256 columns (32 lanes x 8 elements), 118 row slices of 139 rows", 9, 118},
      {DType::kF32, 3072, "tiles of 128 columns (32 lanes x 4 elements), 44 row slices of 373 rows", 24, 44},
      {DType::kBF16, 3072, "tiles of 256 columns (32 lanes x 8 elements), 88 row slices of 187 rows", 12, 88},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), "[16384,", c.columns, "]"));
    const LoweredNode lowered = LowerReduction(c.dtype, {16384, c.columns}, {0});
    ASSERT_EQ(lowered.kernels.size(), 2u);
    const KernelSpec& partials = lowered.kernels[0];
    const KernelSpec& fold = lowered.kernels[1];
    EXPECT_TRUE(absl::StrContains(partials.source, c.stage1)) << partials.source;
    EXPECT_EQ(partials.grid, (std::array<uint32_t, 3>{c.tiles, c.slices, 1}));
    EXPECT_EQ(partials.block, (std::array<uint32_t, 3>{32, 8, 1}));
    EXPECT_EQ(lowered.scratch_bytes, int64_t{c.slices} * c.columns * 8);  // a double per slice and column
    // Both take the scratch last; no atomics, no module-scope state.
    EXPECT_TRUE(absl::StrContains(partials.source, "Acc* __restrict__ partials)")) << partials.source;
    EXPECT_TRUE(absl::StrContains(fold.source, "const Acc* __restrict__ partials)")) << fold.source;
    EXPECT_TRUE(absl::StrContains(fold.source, absl::StrCat("kSlices = ", c.slices))) << fold.source;
    for (const KernelSpec* k : {&partials, &fold}) {
      EXPECT_FALSE(absl::StrContains(k->source, "atomic")) << k->source;
      EXPECT_FALSE(absl::StrContains(k->source, "__device__ Acc")) << k->source;
    }
    EXPECT_EQ(int64_t{fold.grid[0]}, (c.columns + 31) / 32);
    ExpectCompiles(partials);
    ExpectCompiles(fold);
  }
  // Too few rows to be worth a second stage: one kernel writes the result, no scratch.
  const LoweredNode one_stage = LowerReduction(DType::kF32, {100, 768}, {0});
  ASSERT_EQ(one_stage.kernels.size(), 1u);
  EXPECT_EQ(one_stage.scratch_bytes, 0);
  EXPECT_TRUE(absl::StrContains(one_stage.kernels[0].source, "// Stage 1 of 1:")) << one_stage.kernels[0].source;
  EXPECT_FALSE(absl::StrContains(one_stage.kernels[0].source, "partials")) << one_stage.kernels[0].source;
  ExpectCompiles(one_stage.kernels[0]);
  // [A, R, C] with A > 1 and an odd width: scalar loads, fewer lanes, more row groups.
  const LoweredNode outer = LowerReduction(DType::kF32, {4, 3000, 5}, {1});
  ASSERT_FALSE(outer.kernels.empty());
  EXPECT_TRUE(absl::StrContains(outer.kernels[0].source, "(8 lanes x 1 elements)")) << outer.kernels[0].source;
  for (const KernelSpec& k : outer.kernels) ExpectCompiles(k);
}

TEST(Codegen, ReductionStrategyFollowsTheShape) {
  // Long rows: a block per row; short rows: a warp per row; tiny: a thread per output.
  const KernelSpec long_rows = ReduceKernel(DType::kBF16, {512, 32000}, {1}, /*max=*/true);
  EXPECT_TRUE(absl::StrContains(long_rows.source, "// 256 threads per row of 32000 elements")) << long_rows.source;
  EXPECT_TRUE(absl::StrContains(long_rows.source, "Vec<__nv_bfloat16, 8>"));
  const KernelSpec rows = ReduceKernel(DType::kF32, {64, 768}, {1});
  EXPECT_TRUE(absl::StrContains(rows.source, "// 32 threads per row of 768 elements, 8 rows per block"));
  EXPECT_EQ(rows.grid[0], 8u);
  // A few long rows split over blocks; the last block folds the partials.
  const KernelSpec whole = ReduceKernel(DType::kF32, {32000, 768}, {0, 1});
  EXPECT_TRUE(absl::StrContains(whole.source, "// 1056 blocks per row of 24576000 elements")) << whole.source;
  EXPECT_EQ(whole.grid[0], 1056u);
  const KernelSpec few_rows = ReduceKernel(DType::kF32, {4, 6000}, {1});  // too short to split
  EXPECT_TRUE(absl::StrContains(few_rows.source, "// 1024 threads per row of 6000 elements")) << few_rows.source;
  const KernelSpec tiny = ReduceKernel(DType::kI32, {100, 4}, {1});
  EXPECT_TRUE(absl::StrContains(tiny.source, "for (Index i = 0; i < 4; ++i)")) << tiny.source;
  // Interleaved dims ([2,3,4] over {0,2}): the general index arithmetic.
  const KernelSpec interleaved = ReduceKernel(DType::kF32, {2, 3, 4}, {0, 2}, /*max=*/true);
  EXPECT_TRUE(absl::StrContains(interleaved.source, "for (Index i = 0; i < 8; ++i)")) << interleaved.source;
  // Sums accumulate in double, maxima in the compute type.
  EXPECT_TRUE(absl::StrContains(tiny.source, "typedef double Acc;"));
  EXPECT_TRUE(absl::StrContains(long_rows.source, "typedef float Acc;"));
  for (const KernelSpec& k : {long_rows, rows, whole, few_rows, tiny, interleaved}) ExpectCompiles(k);
  for (const KernelSpec& k : LowerReduction(DType::kF16, {4, 300, 96}, {1}).kernels) ExpectCompiles(k);  // A > 1
}

TEST(Codegen, ConstantsCarryTheDtypeBitsTheReferenceRoundsTo) {
  OneNode dense([](Builder& b) { return b.ConstantValues({1, -0.0, 1.0 / 3}, {DType::kF32, {3}}); });
  const KernelSpec dense_kernel = dense.Kernel();
  EXPECT_TRUE(absl::StrContains(dense_kernel.source, "0x3f800000u, 0x80000000u, 0x3eaaaaabu,")) << dense_kernel.source;
  ExpectCompiles(dense_kernel);
  // 1/3 rounds to bf16 0x3eab; 1000 saturates in e4m3 to 448 (0x7e).
  OneNode bf16([](Builder& b) { return b.Constant(1.0 / 3, {DType::kBF16, {4, 8}}); });
  EXPECT_TRUE(absl::StrContains(bf16.Kernel().source, "= 0x3eabu;")) << bf16.Kernel().source;
  ExpectCompiles(bf16.Kernel());
  OneNode fp8([](Builder& b) { return b.Constant(1000, {DType::kF8E4M3, {16}}); });
  EXPECT_TRUE(absl::StrContains(fp8.Kernel().source, "= 0x7eu;")) << fp8.Kernel().source;
  ExpectCompiles(fp8.Kernel());
  OneNode pred([](Builder& b) { return b.ConstantValues({0, 2, 0}, {DType::kPred, {3}}); });
  EXPECT_TRUE(absl::StrContains(pred.Kernel().source, "0x00u, 0x01u, 0x00u,"));
  ExpectCompiles(pred.Kernel());
  OneNode iota([](Builder& b) { return b.Iota({DType::kBF16, {3, 500}}, 1); });
  ExpectCompiles(iota.Kernel());
}

TEST(Codegen, NvrtcErrorsNameTheKernelAndShowTheSource) {
  KernelSpec bad;
  bad.name = "k_broken";
  bad.source = "// a comment\nextern \"C\" __global__ void k_broken(float* out) {\n  out[0] = undefined_name;\n}\n";
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(bad, NvrtcOptions{});
  ASSERT_FALSE(compiled.ok());
  const std::string message(compiled.status().message());
  EXPECT_TRUE(absl::StrContains(message, "k_broken")) << message;
  EXPECT_TRUE(absl::StrContains(message, "undefined_name")) << message;
  EXPECT_TRUE(absl::StrContains(message, ">3 |   out[0] = undefined_name;")) << message;
  NvrtcOptions ptx;
  ptx.arch = "compute_90";
  EXPECT_FALSE(CompileKernel(bad, ptx).ok());
}

TEST(Codegen, CompileFunctionSharesOneCubinPerBody) {
  Module module("m");
  Builder b(module.AddFunction("f"));
  Node* x = *b.Parameter("x", {DType::kBF16, {64, 128}});
  Node* y = x;
  for (int layer = 0; layer < 4; ++layer) {
    b.set_scope(absl::StrCat("layers.", layer));
    y = *b.Add(*b.Unary(Opcode::kNeg, y), x);
  }
  ASSERT_TRUE(b.Return({y}).ok());
  absl::StatusOr<KernelCompileReport> report = CompileFunctionKernels(*module.functions()[0], NvrtcOptions{}, nullptr, 2);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->num_kernels, 8);
  EXPECT_EQ(report->num_distinct, 2);  // one neg, one add
  EXPECT_EQ(report->cache_hits, 0);
  ASSERT_EQ(report->nodes.size(), 9u);
  const NodeKernels& last_add = report->nodes.back();
  ASSERT_EQ(last_add.compiled.size(), 1u);
  EXPECT_EQ(report->nodes[2].compiled, last_add.compiled);  // the first add's cubin
  EXPECT_NE(report->kernels[last_add.compiled[0]].name, last_add.lowered.kernels[0].name);
  for (const CompiledKernel& k : report->kernels) EXPECT_TRUE(IsElf(k.cubin));
}

// The issue's CI requirement: every kernel of the Llama and GPT-2 presets, forward and
// training step, compiles for sm_90a. Runs cold (empty cache), then warm (every body a cache hit).
class PresetKernels : public ::testing::TestWithParam<const char*> {};

TEST_P(PresetKernels, EveryKernelCompilesForSm90a) {
  absl::StatusOr<ModelConfig> config = PresetConfig(GetParam());
  ASSERT_TRUE(config.ok()) << config.status();
  const auto build_start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Module>> module = BuildModelModule(*config);
  ASSERT_TRUE(module.ok()) << module.status();
  ASSERT_TRUE(BuildTrainingStep(**module, *(*module)->FindFunction("forward"), {}).ok());
  absl::StatusOr<PipelineReport> pipeline = RunDefaultPipeline(**module, CompileOptions{});
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  const double build_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count();

  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    absl::StrCat("kiln_codegen_cache_", GetParam(), "_", ::getpid());
  std::filesystem::remove_all(dir);
  absl::StatusOr<KernelCache> cache = KernelCache::Open(dir.string());
  ASSERT_TRUE(cache.ok()) << cache.status();

  absl::StatusOr<KernelCompileReport> cold = CompileModuleKernels(**module, NvrtcOptions{}, &*cache);
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ(cold->cache_hits, 0);
  EXPECT_GT(cold->num_kernels, cold->num_distinct);
  for (const CompiledKernel& k : cold->kernels) ASSERT_TRUE(IsElf(k.cubin)) << k.name;

  absl::StatusOr<KernelCompileReport> warm = CompileModuleKernels(**module, NvrtcOptions{}, &*cache);
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_EQ(warm->cache_hits, warm->num_distinct);
  EXPECT_EQ(warm->num_distinct, cold->num_distinct);

  int64_t nodes = 0;
  for (const auto& f : (*module)->functions()) nodes += f->num_nodes();
  std::printf("%s: %lld nodes, %lld kernels, %lld distinct; build+pipeline %.1fs; cold %.1fs wall (NVRTC %.1fs "
              "summed), warm %.2fs\n",
              GetParam(), static_cast<long long>(nodes), static_cast<long long>(cold->num_kernels),
              static_cast<long long>(cold->num_distinct), build_seconds, cold->wall_seconds, cold->nvrtc_seconds,
              warm->wall_seconds);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetKernels,
                         ::testing::Values("llama-tiny", "llama-S", "llama-M", "gpt2-tiny", "gpt2-124M"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace kiln

#else

TEST(Codegen, NeedsTheCudaToolkit) { GTEST_SKIP() << "built without the CUDA toolkit: no NVRTC"; }

#endif  // KILN_WITH_CUDA
