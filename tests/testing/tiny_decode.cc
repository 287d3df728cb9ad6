#include "tests/testing/tiny_decode.h"

#include <gtest/gtest.h>

#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"

namespace kiln::testing {

std::unique_ptr<Module> TinyDecode(int64_t batch, const std::vector<std::string>& disabled_passes,
                                   const std::vector<std::string>& enabled_passes) {
  const PagedKvLayout layout{.num_blocks = 8, .block_size = 4, .max_blocks_per_sequence = 4};
  std::unique_ptr<Module> m =
      *BuildLlamaInferenceModule(*PresetConfig("llama-tiny"), layout, Precision::kBf16, InferencePhase::kDecode, batch);
  CompileOptions options;
  options.disabled_passes = disabled_passes;
  options.enabled_passes = enabled_passes;
  absl::StatusOr<PipelineReport> report = CompileInferenceModule(*m, options);
  EXPECT_TRUE(report.ok()) << report.status();
  return m;
}

std::vector<HostTensor> TinyDecodeArgs(const Function& f) {
  const std::vector<Node*> params = f.parameters();
  std::vector<HostTensor> args;
  args.push_back(HostTensor::FromValues(params[0]->type(), {3, 17, 0, 200}));  // tokens
  args.push_back(HostTensor::FromValues(params[1]->type(), {2, 5, -1, 0}));    // positions
  args.push_back(HostTensor::FromValues(params[2]->type(), {2, 13, -1, 20}));  // slots
  args.push_back(HostTensor::FromValues(params[3]->type(), {0, 1, 2, 3, 4, 3, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0}));
  for (size_t i = 4; i < params.size(); ++i) args.push_back(HostTensor::Random(params[i]->type(), 100 + i));
  return args;
}

std::vector<const Node*> FusionsOfKind(const Function& f, FusionKind kind) {
  std::vector<const Node*> found;
  for (const auto& n : f.nodes()) {
    if (n->opcode() != Opcode::kFusion) continue;
    const absl::StatusOr<FusionKind> k = FusionKindOf(*n);
    if (k.ok() && *k == kind) found.push_back(n.get());
  }
  return found;
}

void ExpectSameBits(const std::vector<HostTensor>& got, const std::vector<HostTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < got.size(); ++o) {
    ASSERT_EQ(got[o].type(), want[o].type()) << "output " << o;
    int64_t differ = 0;
    for (int64_t i = 0; i < got[o].type().num_elements(); ++i) differ += got[o][i] != want[o][i];
    EXPECT_EQ(differ, 0) << "output " << o;
  }
}

void ExpectSameDecode(const Function& fused, const Function& plain, std::vector<HostTensor>* fused_outputs) {
  const std::vector<HostTensor> args = TinyDecodeArgs(fused);
  absl::StatusOr<std::vector<HostTensor>> got = EvaluateFunction(fused, args);
  absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(plain, args);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ExpectSameBits(*got, *want);
  if (fused_outputs != nullptr) *fused_outputs = *std::move(got);
}

void ExpectTextRoundTrips(const Module& m) {
  const std::string text = PrintModule(m);
  absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PrintModule(**parsed), text);
}

}  // namespace kiln::testing
