// Prefill calls of several prompts and @fresh_prefill (frontends/generator.h PlanPrefillCalls,
// frontends/llama_inference.h) on the reference backend: how a step's prefills are grouped
// into calls, that @fresh_prefill writes the same K/V as @prefill and computes its logits,
// and that a generator batching prompts still computes the full forward's logits for every
// sampled token, shared prefixes within one step included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "frontends/generator.h"
#include "frontends/llama.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "frontends/weight_init.h"
#include "ir/fusion.h"
#include "ir/reference_backend.h"
#include "passes/target.h"
#include "tests/testing/forward_logits.h"
#ifdef KILN_WITH_CUDA
#include "codegen/capabilities.h"
#endif

namespace kiln {
namespace {

using inference::BlockId;
using inference::FinishedRequest;
using inference::GenerationRequest;
using inference::PrefillWork;
using inference::RequestId;
using inference::TokenId;

ModelConfig Tiny() { return *PresetConfig("llama-tiny"); }

// A prefill of `tokens` tokens, `cached` of them from the prefix cache, over blocks `table`.
PrefillWork Work(int64_t tokens, int64_t cached, std::vector<BlockId> table) {
  PrefillWork p;
  p.tokens.assign(static_cast<size_t>(tokens), 1);
  p.num_cached_tokens = cached;
  p.block_table = std::move(table);
  return p;
}

// Blocks first, first + 1, ... enough for `tokens` tokens of block size 16.
std::vector<BlockId> Blocks(BlockId first, int64_t tokens) {
  std::vector<BlockId> b;
  for (int64_t i = 0; i < (tokens + 15) / 16; ++i) b.push_back(first + static_cast<BlockId>(i));
  return b;
}

std::string Describe(const std::vector<PrefillCall>& calls) {
  std::string s;
  for (const PrefillCall& c : calls) {
    s += std::string(InferenceFunctionName(c.shape.phase)) + "[" + std::to_string(c.shape.batch) + "," +
         std::to_string(c.shape.tokens) + "]{";
    for (size_t i : c.prefills) s += std::to_string(i) + ",";
    s += "} ";
  }
  return s;
}

// Prompts of one bucket share calls of a power of two of rows, up to the call's tokens, in
// their order; no call has a padding row.
TEST(PlanPrefillCalls, PromptsOfOneBucketShareCallsOfAPowerOfTwoRows) {
  std::vector<PrefillWork> p;
  for (int i = 0; i < 5; ++i) p.push_back(Work(500 - i, 0, Blocks(100 * i, 500)));
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 4096, 64)), "fresh_prefill[4,512]{0,1,2,3,} fresh_prefill[1,512]{4,} ");
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 1024, 64)),
            "fresh_prefill[2,512]{0,1,} fresh_prefill[2,512]{2,3,} fresh_prefill[1,512]{4,} ");
  // A budget below one prompt's bucket: a call of its own each.
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 100, 64)).size(), 5 * std::string("fresh_prefill[1,512]{0,} ").size());
  // fresh_min_tokens 0: @prefill only; above the prompts' length: the same.
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 4096, 0)), "prefill[4,512]{0,1,2,3,} prefill[1,512]{4,} ");
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 4096, 501)), "prefill[4,512]{0,1,2,3,} prefill[1,512]{4,} ");
  EXPECT_TRUE(PlanPrefillCalls({}, 16, 4096, 64).empty());
}

// Buckets and functions are kept apart; a prompt with cached tokens is @prefill's; a short
// one too.
TEST(PlanPrefillCalls, BucketsAndFunctionsAreKeptApart) {
  std::vector<PrefillWork> p = {Work(200, 0, Blocks(0, 200)),    // fresh, 256
                                Work(100, 0, Blocks(20, 100)),   // fresh, 128
                                Work(48, 32, Blocks(40, 48)),    // cached: prefill, 16
                                Work(30, 0, Blocks(60, 30)),     // short: prefill, 32
                                Work(250, 0, Blocks(80, 250)),   // fresh, 256
                                Work(20, 0, Blocks(100, 20))};   // short: prefill, 32
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 4096, 64)),
            "fresh_prefill[2,256]{0,4,} fresh_prefill[1,128]{1,} prefill[1,16]{2,} prefill[2,32]{3,5,} ");
}

// A prompt whose table holds a block an earlier prompt of the step holds (its cached prefix,
// which that prompt writes) runs in that prompt's call or later, never in an earlier call of
// its own shape.
TEST(PlanPrefillCalls, APromptReadingAnotherPromptsBlocksRunsInItsCallOrLater) {
  std::vector<PrefillWork> p = {Work(20, 0, {0, 1}),           // prefill[1,32]
                                Work(40, 0, {2, 3, 4}),        // prefill[1,64] (fresh_min 0)
                                Work(40, 32, {2, 3, 9}),       // reads blocks 2, 3: after call 1
                                Work(20, 0, {10, 11})};        // prefill[1,32], no dependency
  // Prompt 2 has 8 uncached tokens (bucket 8): its own group after prompt 1's.
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 4096, 0)), "prefill[2,32]{0,3,} prefill[1,64]{1,} prefill[1,8]{2,} ");
  // Of prompt 0's shape and after prompt 1: it cannot join prompt 0's call, which runs first.
  p[2] = Work(50, 32, {2, 3, 12, 13});  // 18 uncached tokens: bucket 32
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 4096, 0)), "prefill[2,32]{0,3,} prefill[1,64]{1,} prefill[1,32]{2,} ");
  // Of prompt 1's shape: the same call (its K/V of each layer written before any row reads).
  p[2] = Work(80, 32, {2, 3, 12, 13, 14});  // 48 uncached: bucket 64
  EXPECT_EQ(Describe(PlanPrefillCalls(p, 16, 4096, 0)), "prefill[2,32]{0,3,} prefill[2,64]{1,2,} ");
}

// How many nodes of `f` are `op`.
int CountOps(const Function& f, absl::string_view op) {
  int n = 0;
  for (const auto& node : f.nodes()) n += node->op_name() == op;
  return n;
}

// @fresh_prefill and @prefill of `config` for two prompts of `t` and 5 tokens (the second
// padded) over blocks of 4, compiled with `compile`, evaluated on the reference backend at the
// same inputs: they write the same slots of the pools (layer 0 with the same bits), and the
// pools and the logits of each prompt's last token agree: to 1e-5 in fp32 (only the order of f32 sums differs), within a few
// bf16 ulps under bf16 (the fresh attention rounds P to bf16 where paged_attention keeps it
// in f32). Returns the two compiled modules.
std::vector<std::unique_ptr<Module>> ExpectFreshPrefillIsPrefill(const ModelConfig& config, int64_t t,
                                                                 CompileOptions compile) {
  const int64_t bs = 4, m = (t + bs - 1) / bs;
  const PagedKvLayout layout{.num_blocks = 2 * m + 2, .block_size = bs, .max_blocks_per_sequence = m};
  const Precision precision = compile.precision;
  std::vector<std::unique_ptr<Module>> modules;
  for (InferencePhase phase : {InferencePhase::kPrefill, InferencePhase::kFreshPrefill}) {
    auto module = BuildLlamaInferenceModule(config, layout, precision, InferenceShape{phase, 2, t});
    EXPECT_TRUE(module.ok()) << module.status();
    if (!module.ok()) return {};
    absl::StatusOr<PipelineReport> report = CompileInferenceModule(**module, compile);
    EXPECT_TRUE(report.ok()) << report.status();
    modules.push_back(*std::move(module));
  }
  EXPECT_EQ(modules[1]->functions()[0]->name(), "fresh_prefill");
  auto weights = InferenceWeightsFromModel(config, InitLlamaWeights(config, 21), precision);
  EXPECT_TRUE(weights.ok()) << weights.status();
  auto i32 = [](std::vector<int64_t> dims, std::vector<double> v) {
    return HostTensor::FromValues({DType::kI32, std::move(dims)}, std::move(v));
  };
  // Row 0: t tokens over blocks 2m+1, 2m-1, ..., backwards; row 1: 5 tokens over blocks 0 and
  // 1, then padding (position and slot -1).
  std::vector<double> tokens(2 * t, 0), positions(2 * t, -1), slots(2 * t, -1), table(2 * m, -1);
  for (int64_t i = 0; i < m; ++i) table[i] = static_cast<double>(2 * m + 1 - i);
  table[m] = 0;
  table[m + 1] = 1;
  for (int64_t i = 0; i < t; ++i) {
    tokens[i] = static_cast<double>((i * 53 + 17) % config.vocab_size);
    positions[i] = static_cast<double>(i);
    slots[i] = table[i / bs] * bs + i % bs;
  }
  for (int64_t i = 0; i < 5; ++i) {
    tokens[t + i] = static_cast<double>((i * 71 + 5) % config.vocab_size);
    positions[t + i] = static_cast<double>(i);
    slots[t + i] = table[m + i / bs] * bs + i % bs;
  }
  // Both rows greedy (temperature 0), seed and draw 0.
  std::vector<HostTensor> args = {i32({2, t}, tokens),
                                  i32({2, t}, positions),
                                  i32({2, t}, slots),
                                  i32({2, m}, table),
                                  HostTensor::FromValues({DType::kF32, {2, 1, 3}}, {0, 0, 1, 0, 0, 1}),
                                  i32({2, 1, 3}, {0, 0, 0, 0, 0, 0})};
  const TensorType pool = KvPoolType(config, layout, precision);
  args.push_back(HostTensor(pool));
  args.push_back(HostTensor(pool));
  args.insert(args.end(), weights->begin(), weights->end());
  auto paged = EvaluateFunction(*modules[0]->functions()[0], args);
  auto fresh = EvaluateFunction(*modules[1]->functions()[0], args);
  EXPECT_TRUE(paged.ok()) << paged.status();
  EXPECT_TRUE(fresh.ok()) << fresh.status();
  if (!paged.ok() || !fresh.ok()) return modules;
  const double tolerance = precision == Precision::kFp32 ? 1e-5 : 3e-2;
  // Layer 0's K/V come from the embedding alone: the same bits. Later layers' from the
  // residual stream after attentions that differ in rounding: close.
  const int64_t layer_elements = pool.num_elements() / config.n_layers;
  for (int pool_output : {1, 2}) {
    const std::vector<double>& a = (*fresh)[pool_output].values();
    const std::vector<double>& b = (*paged)[pool_output].values();
    EXPECT_EQ(a.size(), b.size());
    EXPECT_TRUE(std::equal(a.begin(), a.begin() + layer_elements, b.begin())) << "layer 0 of pool " << pool_output;
    double scale = 0;
    for (double x : b) scale = std::max(scale, std::fabs(x));
    EXPECT_GT(scale, 0) << "the pools were written";
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::fabs(a[i] - b[i]) > tolerance * scale) {
        ADD_FAILURE() << "pool " << pool_output << " element " << i << ": " << a[i] << " against " << b[i];
        break;
      }
    }
  }
  const int64_t v = config.vocab_size;
  EXPECT_EQ((*paged)[0].type().dims, (std::vector<int64_t>{2, 1, v})) << "each prompt's last token's logits";
  for (int64_t row : {0, 1}) {
    double scale = 0;
    for (int64_t i = 0; i < v; ++i) scale = std::max(scale, std::fabs((*paged)[0].values()[row * v + i]));
    for (int64_t i = 0; i < v; ++i) {
      const double a = (*fresh)[0].values()[row * v + i], b = (*paged)[0].values()[row * v + i];
      if (std::fabs(a - b) > tolerance * scale) {
        ADD_FAILURE() << "logits row " << row << " token " << i << ": " << a << " against " << b;
        return modules;
      }
    }
  }
  return modules;
}

TEST(FreshPrefill, WritesThePoolsPrefillWritesAndItsLogits) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision == Precision::kFp32 ? "fp32" : "bf16");
    auto modules = ExpectFreshPrefillIsPrefill(Tiny(), 8, CompileOptions{.precision = precision});
    ASSERT_EQ(modules.size(), 2u);
    EXPECT_EQ(CountOps(*modules[0]->functions()[0], "paged_attention"), Tiny().n_layers);
    const Function& fresh = *modules[1]->functions()[0];
    EXPECT_EQ(CountOps(fresh, "paged_attention"), 0);
    // The attention's q and k have a RoPE of their own: each K/V write has one reader, is
    // folded into the kernel computing its rows, and joins the layer's transposes in one
    // cache_write fusion (a layer's writes and q/k/v transposes: one kernel). Under bf16: in
    // fp32 no convert ends the rows' loop (a reshape, or no loop at all for V), as in @prefill.
    if (precision != Precision::kBf16) continue;
    EXPECT_EQ(CountOps(fresh, "kv_cache_write"), 0);
    int cache_write_fusions = 0;
    for (const auto& n : fresh.nodes()) {
      cache_write_fusions += n->opcode() == Opcode::kFusion && *FusionKindOf(*n) == FusionKind::kCacheWrite;
    }
    EXPECT_EQ(cache_write_fusions, Tiny().n_layers);
  }
}

#ifdef KILN_WITH_CUDA
// Compiled as the generator compiles for a GPU (the codegen's capabilities, sm_90a), a model
// whose heads the flash kernels take (head dim 64; 64 tokens) gets one attention op a layer in
// @fresh_prefill, which the reference backend evaluates as the same function.
TEST(FreshPrefill, TakesTheFlashKernelWhereTheTargetDoes) {
  ModelConfig config = Tiny();
  config.name = "llama-tiny-dh64";
  config.head_dim = 64;
  CompileOptions compile{.target = *TargetForArch("sm_90a"), .capabilities = &CodegenCapabilities()};
  auto modules = ExpectFreshPrefillIsPrefill(config, 64, compile);
  ASSERT_EQ(modules.size(), 2u);
  EXPECT_EQ(CountOps(*modules[1]->functions()[0], "attention"), config.n_layers);
  EXPECT_EQ(CountOps(*modules[1]->functions()[0], "paged_attention"), 0);
  EXPECT_EQ(CountOps(*modules[0]->functions()[0], "attention"), 0);
}
#endif

std::vector<TokenId> Prompt(int64_t n, int64_t salt) {
  std::vector<TokenId> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<TokenId>((i * 29 + salt * 13 + 3) % 256));
  return p;
}

// Six requests submitted together (one step admits them all): one shares its first two blocks
// with the first, three share a bucket, one has a bucket of its own. Batched or one by one,
// with or without @fresh_prefill, every sampled token's logits are the full forward's at its
// position (fp32, 1e-5 of the row), and the tokens are the same.
TEST(BatchedPrefill, EverySampledTokenHasTheForwardsLogits) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 22);
  std::vector<GenerationRequest> requests;
  const std::vector<TokenId> first = Prompt(9, 1);
  std::vector<TokenId> shared(first.begin(), first.begin() + 8);
  for (TokenId t : {7, 7, 2}) shared.push_back(t);
  requests.push_back({.id = 0, .prompt = first, .max_new_tokens = 4});
  requests.push_back({.id = 1, .prompt = shared, .max_new_tokens = 5});
  requests.push_back({.id = 2, .prompt = Prompt(5, 2), .max_new_tokens = 3});
  requests.push_back({.id = 3, .prompt = Prompt(7, 3), .max_new_tokens = 6});
  requests.push_back({.id = 4, .prompt = Prompt(6, 4), .max_new_tokens = 2});
  requests.push_back({.id = 5, .prompt = Prompt(3, 5), .max_new_tokens = 4});
  for (auto& r : requests) r.sampling.temperature = 0;

  struct Config {
    int64_t call_tokens, fresh_min;
  };
  std::map<RequestId, std::vector<TokenId>> reference;
  for (const Config& c : {Config{1, 0}, Config{4096, 0}, Config{4096, 1}, Config{16, 1}}) {
    SCOPED_TRACE(::testing::Message() << "max_prefill_call_tokens " << c.call_tokens << ", fresh_prefill_min_tokens "
                                      << c.fresh_min);
    std::map<std::pair<RequestId, int64_t>, std::vector<float>> log;
    GeneratorOptions options{.precision = Precision::kFp32, .block_size = 4, .max_running = 8, .max_context = 64};
    options.max_prefill_call_tokens = c.call_tokens;
    options.fresh_prefill_min_tokens = c.fresh_min;
    options.on_logits = [&log](RequestId r, int64_t position, absl::Span<const float> logits) {
      log[{r, position}] = std::vector<float>(logits.begin(), logits.end());
    };
    auto gen = Generator::Create(Tiny(), weights, options);
    ASSERT_TRUE(gen.ok()) << gen.status();
    for (const GenerationRequest& r : requests) ASSERT_TRUE((*gen)->Submit(r).ok());
    auto done = (*gen)->Run();
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->size(), requests.size());
    const GenerationStats& stats = (*gen)->stats();
    EXPECT_EQ(stats.cached_tokens, 8) << "request 1 finds request 0's two blocks in the same step";
    if (c.call_tokens == 1) {
      EXPECT_EQ(stats.prefill_calls, 6);
    } else {
      EXPECT_LT(stats.prefill_calls, 6) << "prompts of one bucket share a call";
    }
    EXPECT_EQ(stats.fresh_prefill_calls > 0, c.fresh_min > 0);
    for (const FinishedRequest& f : *done) {
      const GenerationRequest& r = requests[f.id];
      std::vector<TokenId> context = r.prompt;
      context.insert(context.end(), f.output.begin(), f.output.end() - 1);
      const auto rows = testing::ForwardLogits(Tiny(), weights, context, Precision::kFp32);
      int64_t checked = 0;
      for (const auto& [key, logits] : log) {
        if (key.first != f.id) continue;
        double scale = 0;
        for (double x : rows[key.second]) scale = std::max(scale, std::fabs(x));
        for (size_t i = 0; i < logits.size(); ++i) {
          ASSERT_NEAR(logits[i], rows[key.second][i], 1e-5 * scale)
              << "request " << f.id << " position " << key.second << " token " << i;
        }
        ++checked;
      }
      EXPECT_EQ(checked, static_cast<int64_t>(f.output.size())) << "request " << f.id;
      if (reference.contains(f.id)) {
        EXPECT_EQ(f.output, reference[f.id]) << "request " << f.id;
      } else {
        reference[f.id] = f.output;
      }
    }
  }
}

// Bad options are refused, naming them.
TEST(BatchedPrefill, BadOptionsAreRefused) {
  GeneratorOptions options{.precision = Precision::kFp32, .block_size = 4, .max_context = 64};
  options.max_prefill_call_tokens = 0;
  auto a = Generator::Create(Tiny(), InitLlamaWeights(Tiny(), 1), options);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("max_prefill_call_tokens (0)"), std::string::npos) << a.status();
  options.max_prefill_call_tokens = 16;
  options.fresh_prefill_min_tokens = -1;
  auto b = Generator::Create(Tiny(), InitLlamaWeights(Tiny(), 1), options);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("fresh_prefill_min_tokens (-1)"), std::string::npos) << b.status();
  auto decode = BuildLlamaInferenceModule(Tiny(), {.num_blocks = 4, .block_size = 4, .max_blocks_per_sequence = 2},
                                          Precision::kFp32, InferenceShape{InferencePhase::kDecode, 2, 3});
  ASSERT_FALSE(decode.ok());
  EXPECT_NE(decode.status().message().find("one token a sequence"), std::string::npos) << decode.status();
}

}  // namespace
}  // namespace kiln
