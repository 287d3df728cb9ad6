// Generation on the GPU (frontends/cuda_inference_engine.h) against the CPU reference
// backend: the same requests, submitted at the same steps, through the same scheduler, give
// the same tokens and the same logits, through block boundaries, prefix-cache hits,
// copy-on-write and requests that join and leave the decode batch (which moves it between
// captured graphs). Skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "frontends/generator.h"
#include "frontends/weight_init.h"
#include "runtime/inference/sampler.h"
#include "tests/testing/gpu.h"

namespace kiln {
namespace {

using inference::RequestId;
using inference::TokenId;

using LogitsLog = std::map<std::pair<RequestId, int64_t>, std::vector<float>>;

struct Generation {
  std::map<RequestId, std::vector<TokenId>> outputs;
  LogitsLog logits;
  GenerationStats stats;
};

std::vector<TokenId> Prompt(int64_t n, int64_t salt) {
  std::vector<TokenId> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<TokenId>((i * 37 + salt * 11 + 5) % 256));
  return p;
}

// Five greedy requests on llama-tiny with blocks of 4: 2 shares 1's 8-token prefix (two
// full blocks, cached once 1 is prefilled), 3 repeats 1's prompt exactly (its last token is
// recomputed), and 4 and 5 join after two and five steps, while others run or have left.
// With `sampled`, requests 1 to 5 sample (temperature, top-k, top-p, both, a low temperature)
// instead.
const std::map<RequestId, inference::SamplingParams>& SampledKinds() {
  static const auto* kinds = new std::map<RequestId, inference::SamplingParams>{
      {1, {.temperature = 1.0, .seed = 11}},
      {2, {.temperature = 0.8, .top_k = 10, .seed = 12}},
      {3, {.temperature = 1.3, .top_p = 0.7, .seed = 13}},
      {4, {.temperature = 0.9, .top_k = 40, .top_p = 0.9, .seed = 0xfedcba9876543210ULL}},
      {5, {.temperature = 0.3, .seed = 15}}};
  return *kinds;
}

Generation Generate(CudaDevice* device, Precision precision, bool log_logits = true, bool sampled = false) {
  const ModelConfig config = *PresetConfig("llama-tiny");
  Generation g;
  GeneratorOptions options{.precision = precision, .block_size = 4, .max_running = 4, .max_context = 64};
  options.device = device;
  if (log_logits) {  // otherwise greedy tokens come from the functions' own pick, on the device
    options.on_logits = [&g](RequestId r, int64_t position, absl::Span<const float> logits) {
      g.logits[{r, position}] = std::vector<float>(logits.begin(), logits.end());
    };
  }
  auto gen = Generator::Create(config, InitLlamaWeights(config, 21), options);
  EXPECT_TRUE(gen.ok()) << gen.status();
  if (!gen.ok()) return g;
  auto sampling = [&](RequestId r) {
    return sampled ? SampledKinds().at(r) : inference::SamplingParams{.temperature = 0};
  };
  std::vector<TokenId> second = Prompt(8, 1);
  for (TokenId t : {3, 1, 4}) second.push_back(t);
  std::map<int64_t, std::vector<inference::GenerationRequest>> submit_at = {
      {0, {{.id = 1, .prompt = Prompt(8, 1), .max_new_tokens = 6, .sampling = sampling(1)}}},
      {1, {{.id = 2, .prompt = second, .max_new_tokens = 9, .sampling = sampling(2)},
           {.id = 3, .prompt = Prompt(8, 1), .max_new_tokens = 5, .sampling = sampling(3)}}},
      {2, {{.id = 4, .prompt = Prompt(13, 4), .max_new_tokens = 12, .sampling = sampling(4)}}},
      {5, {{.id = 5, .prompt = Prompt(3, 5), .max_new_tokens = 7, .sampling = sampling(5)}}},
  };
  for (int64_t step = 0; step < 200; ++step) {
    if (auto it = submit_at.find(step); it != submit_at.end()) {
      for (auto& request : it->second) EXPECT_TRUE((*gen)->Submit(request).ok());
    }
    auto done = (*gen)->Step();
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok()) break;
    for (const auto& f : *done) g.outputs[f.id] = f.output;
    if (step > 5 && !(*gen)->scheduler().HasUnfinishedRequests()) break;
  }
  g.stats = (*gen)->stats();
  return g;
}

// Each step's GPU logits within `tolerance` of the largest |reference logit|, for every
// request and position where both runs generated the same tokens so far (bf16 may part at a
// near-tie; the contexts differ from there). Returns how many were compared.
int64_t ExpectSameLogitsWhileTokensAgree(const Generation& gpu, const Generation& cpu, double tolerance) {
  int64_t compared = 0;
  for (const auto& [key, logits] : gpu.logits) {
    auto it = cpu.logits.find(key);
    EXPECT_NE(it, cpu.logits.end()) << "request " << key.first << " position " << key.second;
    if (it == cpu.logits.end()) continue;
    const auto& out_gpu = gpu.outputs.at(key.first);
    const auto& out_cpu = cpu.outputs.at(key.first);
    if (!std::equal(out_gpu.begin(), out_gpu.begin() + std::min(out_gpu.size(), out_cpu.size()), out_cpu.begin())) {
      continue;
    }
    double scale = 0, worst = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(it->second[i])));
      worst = std::max(worst, std::fabs(static_cast<double>(logits[i]) - it->second[i]));
    }
    EXPECT_LE(worst, tolerance * scale) << "request " << key.first << " position " << key.second;
    ++compared;
  }
  return compared;
}

void ExpectSameGeneration(const Generation& gpu, const Generation& cpu, double tolerance, bool same_tokens) {
  ASSERT_EQ(gpu.outputs.size(), 5u);
  ASSERT_EQ(cpu.outputs.size(), 5u);
  EXPECT_EQ(gpu.stats.cached_tokens, cpu.stats.cached_tokens);
  EXPECT_GT(cpu.stats.cached_tokens, 0) << "the shared prefix came from the cache";
  EXPECT_EQ(gpu.stats.prefill_tokens, cpu.stats.prefill_tokens);
  if (same_tokens) {
    EXPECT_EQ(gpu.outputs, cpu.outputs);
  }
  const int64_t compared = ExpectSameLogitsWhileTokensAgree(gpu, cpu, tolerance);
  EXPECT_GE(compared, 30);
}

// The scenario covers what the header says (on the CPU alone, so this runs on CI too).
TEST(GpuGenerate, TheScenarioReachesEveryPath) {
  const Generation cpu = Generate(nullptr, Precision::kFp32);
  ASSERT_EQ(cpu.outputs.size(), 5u);
  EXPECT_EQ(cpu.outputs.at(4).size(), 12u);
  EXPECT_GE(cpu.stats.cached_tokens, 12) << "2 and 3 hit the prefix cache";
  EXPECT_GE(cpu.stats.functions_compiled, 5) << "several prefill sizes and decode buckets";
  EXPECT_GT(cpu.stats.decode_steps, 12);
}

TEST(GpuGenerate, MatchesTheReferenceBackendFp32) {
  KILN_REQUIRE_GPU();
  const Generation gpu = Generate(testing::TestDevice(), Precision::kFp32);
  const Generation cpu = Generate(nullptr, Precision::kFp32);
  ExpectSameGeneration(gpu, cpu, 1e-4, /*same_tokens=*/true);
  EXPECT_GE(gpu.stats.functions_compiled, 4) << "prefill and decode sizes, each its own executable";
}

TEST(GpuGenerate, MatchesTheReferenceBackendBf16) {
  KILN_REQUIRE_GPU();
  const Generation gpu = Generate(testing::TestDevice(), Precision::kBf16);
  const Generation cpu = Generate(nullptr, Precision::kBf16);
  // The bf16 policy's roundings are the same on both; what differs is f32 summation order,
  // which a bf16 rounding can turn into one bf16 ulp of an activation.
  ExpectSameGeneration(gpu, cpu, 2e-2, /*same_tokens=*/false);
}

// Without on_logits only B tokens come back: the functions draw them on the device
// (sample_tokens), greedy and sampled alike, the same tokens as on the CPU.
TEST(GpuGenerate, TokensDrawnOnTheDeviceMatchTheReference) {
  KILN_REQUIRE_GPU();
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    const Generation gpu = Generate(testing::TestDevice(), Precision::kFp32, /*log_logits=*/false, sampled);
    const Generation cpu = Generate(nullptr, Precision::kFp32, /*log_logits=*/false, sampled);
    ASSERT_EQ(cpu.outputs.size(), 5u);
    EXPECT_EQ(gpu.outputs, cpu.outputs);
  }
}

// Each token the device drew is the host's Sampler's draw from the logits it drew it from
// (downloaded by on_logits), with the request's parameters and draw index: bf16, where the
// logits' many ties exercise the cuts' order by id.
TEST(GpuGenerate, EachDeviceDrawIsTheSamplersDraw) {
  KILN_REQUIRE_GPU();
  const Generation gpu = Generate(testing::TestDevice(), Precision::kBf16, /*log_logits=*/true, /*sampled=*/true);
  ASSERT_EQ(gpu.outputs.size(), 5u);
  const std::map<RequestId, int64_t> prompt_length = {{1, 8}, {2, 11}, {3, 8}, {4, 13}, {5, 3}};
  inference::Sampler sampler;
  int64_t checked = 0;
  for (const auto& [key, logits] : gpu.logits) {
    const auto [request, position] = key;
    const int64_t draw = position + 1 - prompt_length.at(request);
    absl::StatusOr<TokenId> want = sampler.Sample(logits, SampledKinds().at(request), draw);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(gpu.outputs.at(request).at(draw), *want) << "request " << request << " draw " << draw;
    ++checked;
  }
  EXPECT_EQ(checked, 6 + 9 + 5 + 12 + 7);
}

// Sixteen requests decoded together (the decode bucket of 16: cuBLASLt's few-row GEMMs and the
// paged attention's combine kernel, past fold_max_rows) give the reference backend's logits at
// every step, bf16.
Generation GenerateSixteen(CudaDevice* device) {
  const ModelConfig config = *PresetConfig("llama-tiny");
  Generation g;
  GeneratorOptions options{.precision = Precision::kBf16, .block_size = 4, .max_running = 16, .max_context = 64};
  options.device = device;
  options.on_logits = [&g](RequestId r, int64_t position, absl::Span<const float> logits) {
    g.logits[{r, position}] = std::vector<float>(logits.begin(), logits.end());
  };
  auto gen = Generator::Create(config, InitLlamaWeights(config, 21), options);
  EXPECT_TRUE(gen.ok()) << gen.status();
  if (!gen.ok()) return g;
  for (RequestId id = 1; id <= 16; ++id) {
    EXPECT_TRUE((*gen)->Submit({.id = id, .prompt = Prompt(5 + id % 7, 100 + id), .max_new_tokens = 6,
                                .sampling = {.temperature = 0}})
                    .ok());
  }
  for (int64_t step = 0; step < 100 && (*gen)->scheduler().HasUnfinishedRequests(); ++step) {
    auto done = (*gen)->Step();
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok()) break;
    for (const auto& f : *done) g.outputs[f.id] = f.output;
  }
  g.stats = (*gen)->stats();
  return g;
}

TEST(GpuGenerate, DecodesSixteenTogetherAsTheReference) {
  KILN_REQUIRE_GPU();
  const Generation gpu = GenerateSixteen(testing::TestDevice());
  const Generation cpu = GenerateSixteen(nullptr);
  ASSERT_EQ(gpu.outputs.size(), 16u);
  ASSERT_EQ(cpu.outputs.size(), 16u);
  const int64_t compared = ExpectSameLogitsWhileTokensAgree(gpu, cpu, 2e-2);
  EXPECT_GE(compared, 16 * 4) << "most steps of most requests compared";
}

// Prompts of 65 to 200 tokens on a model whose heads the flash kernels take (head dim 64),
// submitted together: batched prefill calls of @fresh_prefill (the flash kernel on the GPU),
// then decoding. The GPU's logits at every step are the reference backend's (bf16), with the
// same calls made; and the GPU's fresh prefill gives the tokens its paged prefill gives
// (fresh_prefill_min_tokens 0) until the first near-tie.
Generation GenerateLongPrompts(CudaDevice* device, int64_t fresh_min_tokens, Precision precision = Precision::kBf16) {
  ModelConfig config = *PresetConfig("llama-tiny");
  config.name = "llama-tiny-dh64";
  config.head_dim = 64;
  Generation g;
  GeneratorOptions options{.precision = precision, .block_size = 16, .max_running = 8, .max_context = 256};
  options.fresh_prefill_min_tokens = fresh_min_tokens;
  options.device = device;
  options.on_logits = [&g](RequestId r, int64_t position, absl::Span<const float> logits) {
    g.logits[{r, position}] = std::vector<float>(logits.begin(), logits.end());
  };
  auto gen = Generator::Create(config, InitLlamaWeights(config, 23), options);
  EXPECT_TRUE(gen.ok()) << gen.status();
  if (!gen.ok()) return g;
  const int64_t lengths[] = {65, 100, 128, 77, 200, 150};
  for (RequestId id = 0; id < 6; ++id) {
    EXPECT_TRUE((*gen)->Submit({.id = id, .prompt = Prompt(lengths[id], 300 + id), .max_new_tokens = 5,
                                .sampling = {.temperature = 0}})
                    .ok());
  }
  auto done = (*gen)->Run();
  EXPECT_TRUE(done.ok()) << done.status();
  if (done.ok()) {
    for (const auto& f : *done) g.outputs[f.id] = f.output;
  }
  g.stats = (*gen)->stats();
  return g;
}

TEST(GpuGenerate, BatchedFreshPrefillsMatchTheReference) {
  KILN_REQUIRE_GPU();
  const Generation gpu = GenerateLongPrompts(testing::TestDevice(), 64);
  const Generation cpu = GenerateLongPrompts(nullptr, 64);
  ASSERT_EQ(gpu.outputs.size(), 6u);
  ASSERT_EQ(cpu.outputs.size(), 6u);
  EXPECT_EQ(gpu.stats.prefill_calls, cpu.stats.prefill_calls);
  EXPECT_EQ(gpu.stats.fresh_prefill_calls, gpu.stats.prefill_calls) << "every prompt is fresh and 64 or longer";
  EXPECT_LT(gpu.stats.prefill_calls, 6) << "prompts of one bucket share a call";
  EXPECT_GE(ExpectSameLogitsWhileTokensAgree(gpu, cpu, 2e-2), 6 * 3);
  const Generation paged = GenerateLongPrompts(testing::TestDevice(), 0);
  EXPECT_EQ(paged.stats.fresh_prefill_calls, 0);
  EXPECT_GE(ExpectSameLogitsWhileTokensAgree(gpu, paged, 2e-2), 6 * 3);
}

// The same in fp32 (the flash kernels take bf16: the attention stays the decomposed pattern,
// batched GEMMs and a softmax): the reference's tokens, and its logits to 1e-4.
TEST(GpuGenerate, BatchedFreshPrefillsMatchTheReferenceFp32) {
  KILN_REQUIRE_GPU();
  const Generation gpu = GenerateLongPrompts(testing::TestDevice(), 64, Precision::kFp32);
  const Generation cpu = GenerateLongPrompts(nullptr, 64, Precision::kFp32);
  ASSERT_EQ(gpu.outputs.size(), 6u);
  EXPECT_EQ(gpu.outputs, cpu.outputs);
  EXPECT_EQ(gpu.stats.fresh_prefill_calls, gpu.stats.prefill_calls);
  EXPECT_GE(ExpectSameLogitsWhileTokensAgree(gpu, cpu, 1e-4), 6 * 5);
}

}  // namespace
}  // namespace kiln
