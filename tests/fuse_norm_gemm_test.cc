// fuse-norm-gemm (passes/fuse_norm_gemm.h): an rms_norm read only as a few-row gemm's A is
// computed by that gemm's kernel. The pass changes no value (the reference backend gives the
// decode function's every output the same bits with it and without it), fuses only what the
// backend says its kernel takes, the norm_gemm kind is checked by the verifier and
// round-trips as text, and codegen lowers it to SmallMGemm::RunNormalized (NVRTC compiles it).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "ir/fusion.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "passes/backend_capabilities.h"

#ifdef KILN_WITH_CUDA
#include "codegen/capabilities.h"
#include "codegen/lower_node.h"
#include "codegen/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

// A backend whose GEMM kernel normalizes A for gemms of at most `max_rows` rows.
class FewRowCapabilities final : public BackendCapabilities {
 public:
  explicit FewRowCapabilities(int64_t max_rows) : max_rows_(max_rows) {}
  std::string AttentionUnsupportedReason(const AttentionKernelShape&, const Target&) const override { return "none"; }
  std::string AttentionImplementation(const Target&) const override { return "none"; }
  std::string Fp8GemmUnsupportedReason(const Fp8GemmShape&, const Target&) const override { return "none"; }
  std::string NormGemmUnsupportedReason(const Node& gemm, const Target&) const override {
    const int64_t m = gemm.attrs().GetInt("m").value_or(-1);
    return m >= 1 && m <= max_rows_ ? "" : absl::StrCat("m ", m);
  }

 private:
  int64_t max_rows_;
};

const PagedKvLayout kLayout{.num_blocks = 8, .block_size = 4, .max_blocks_per_sequence = 4};

std::unique_ptr<Module> Decode(int64_t sequences, const BackendCapabilities* capabilities,
                               const std::vector<std::string>& disabled = {}) {
  std::unique_ptr<Module> m = *BuildLlamaInferenceModule(*PresetConfig("llama-tiny"), kLayout, Precision::kBf16,
                                                         InferencePhase::kDecode, sequences);
  CompileOptions options;
  options.capabilities = capabilities;
  options.disabled_passes = disabled;
  absl::StatusOr<PipelineReport> report = CompileInferenceModule(*m, options);
  EXPECT_TRUE(report.ok()) << report.status();
  return m;
}

std::vector<const Node*> Fused(const Function& f) {
  std::vector<const Node*> fused;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kFusion && *FusionKindOf(*n) == FusionKind::kNormGemm) fused.push_back(n.get());
  }
  return fused;
}

int64_t Count(const Function& f, Opcode op) {
  int64_t count = 0;
  for (const auto& n : f.nodes()) count += n->opcode() == op;
  return count;
}

std::vector<HostTensor> DecodeArgs(const Function& f) {
  const std::vector<Node*> params = f.parameters();
  std::vector<HostTensor> args;
  args.push_back(HostTensor::FromValues(params[0]->type(), {3, 17, 0, 200}));  // tokens
  args.push_back(HostTensor::FromValues(params[1]->type(), {2, 5, -1, 0}));    // positions (one padding)
  args.push_back(HostTensor::FromValues(params[2]->type(), {2, 13, -1, 20}));  // slots
  args.push_back(HostTensor::FromValues(params[3]->type(), {0, 1, 2, 3, 4, 3, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0}));
  for (size_t i = 4; i < params.size(); ++i) args.push_back(HostTensor::Random(params[i]->type(), 100 + i));
  return args;
}

TEST(FuseNormGemm, DecodeNormalizesEveryProjectionsAInItsGemmWithTheSameBits) {
  const FewRowCapabilities capabilities(8);
  std::unique_ptr<Module> fused = Decode(4, &capabilities);
  std::unique_ptr<Module> plain = Decode(4, &capabilities, {"fuse-norm-gemm"});
  const Function& f = *fused->functions()[0];
  const int layers = PresetConfig("llama-tiny")->n_layers;
  // Each layer's two norms (before q/k/v and before gate/up) and the final norm before the LM head.
  EXPECT_EQ(Fused(f).size(), static_cast<size_t>(2 * layers + 1));
  EXPECT_EQ(Count(f, Opcode::kRmsNorm), 0);
  EXPECT_EQ(Count(*plain->functions()[0], Opcode::kRmsNorm), 2 * layers + 1);
  EXPECT_TRUE(Fused(*plain->functions()[0]).empty());

  const std::vector<HostTensor> args = DecodeArgs(f);
  absl::StatusOr<std::vector<HostTensor>> got = EvaluateFunction(f, args);
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(*plain->functions()[0], args);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < got->size(); ++o) {
    ASSERT_EQ((*got)[o].type(), (*want)[o].type());
    int64_t differ = 0;
    for (int64_t i = 0; i < (*got)[o].type().num_elements(); ++i) differ += (*got)[o][i] != (*want)[o][i];
    EXPECT_EQ(differ, 0) << "output " << o;
  }

  const std::string text = PrintModule(*fused);
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PrintModule(**parsed), text);
  EXPECT_NE(text.find("{kind=norm_gemm}"), std::string::npos);
}

TEST(FuseNormGemm, FusesOnlyWhatTheBackendTakes) {
  // 16 sequences: more rows than the kernel takes; no capabilities: nothing is fused.
  const FewRowCapabilities capabilities(8);
  EXPECT_TRUE(Fused(*Decode(16, &capabilities)->functions()[0]).empty());
  EXPECT_TRUE(Fused(*Decode(4, nullptr)->functions()[0]).empty());
}

TEST(FuseNormGemm, TheVerifierWantsOneNormFeedingTheGemmsA) {
  const std::string opening = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[1,8]
  %w = parameter() {index=1} : f32[8]
  %b = parameter() {index=2} : bf16[4,8]
  %y = fusion(%x, %w, %b) {kind=norm_gemm} : f32[1,4] {
    %x = parameter() {index=0} : f32[1,8]
    %w = parameter() {index=1} : f32[8]
    %b = parameter() {index=2} : bf16[4,8]
)";
  const std::string gemm_attrs =
      "{a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=8, m=1, n=4} : f32[1,4]\n";
  const std::string closing = "    return %y\n  }\n  return %y\n}\n";
  // The valid body parses.
  absl::StatusOr<std::unique_ptr<Module>> ok = ParseModule(
      opening + "    %n = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[1,8]\n    %y = gemm(%n, %b) " +
      gemm_attrs + closing);
  ASSERT_TRUE(ok.ok()) << ok.status();
  // B computed in the body.
  absl::StatusOr<std::unique_ptr<Module>> computed_b = ParseModule(
      opening + "    %n = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[1,8]\n    %nb = neg(%b) : bf16[4,8]\n" +
      "    %y = gemm(%n, %nb) " + gemm_attrs + closing);
  ASSERT_FALSE(computed_b.ok());
  EXPECT_TRUE(absl::StrContains(computed_b.status().message(), "is neither the rms_norm nor the gemm it feeds"))
      << computed_b.status();
  // A that is no norm.
  absl::StatusOr<std::unique_ptr<Module>> no_norm = ParseModule(
      opening + "    %n = convert(%x) : bf16[1,8]\n    %y = gemm(%n, %b) " + gemm_attrs + closing);
  ASSERT_FALSE(no_norm.ok());
  EXPECT_TRUE(absl::StrContains(no_norm.status().message(), "does not read an rms_norm as its A")) << no_norm.status();
}

#ifdef KILN_WITH_CUDA
// With codegen's own answer (SmallMGemm's), every fused gemm lowers to one RunNormalized
// kernel, which NVRTC compiles for sm_90a.
TEST(FuseNormGemm, LowersToSmallMGemmRunNormalized) {
  std::unique_ptr<Module> m = Decode(4, &CodegenCapabilities());
  const std::vector<const Node*> fused = Fused(*m->functions()[0]);
  ASSERT_FALSE(fused.empty());
  for (const Node* n : fused) {
    absl::StatusOr<LoweredNode> lowered = LowerNode(*n);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_EQ(lowered->kernels.size(), 1u);
    EXPECT_TRUE(absl::StrContains(lowered->kernels[0].source, "::RunNormalized(out, in0, in1, ")) << lowered->kernels[0].source;
    absl::StatusOr<CompiledKernel> compiled = CompileKernel(lowered->kernels[0], NvrtcOptions{.arch = "sm_90a"});
    ASSERT_TRUE(compiled.ok()) << compiled.status() << "\n" << lowered->kernels[0].source;
  }
  // SmallMGemm off: the lowering says why, it does not run another kernel.
  absl::StatusOr<LoweredNode> refused = LowerNode(*fused[0], CodegenOptions{.small_m_gemv = false});
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "small_m_gemv is off")) << refused.status();
}
#endif

}  // namespace
}  // namespace kiln
