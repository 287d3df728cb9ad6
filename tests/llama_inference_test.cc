// The inference functions (frontends/llama_inference.h) and the generator
// (frontends/generator.h) on the reference backend, checked against the model's own @forward:
// every sampled token's logits equal the full forward's logits at its position, through
// block boundaries, prefix-cache hits, decode batch padding and continuous batching.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "frontends/generator.h"
#include "frontends/llama.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "frontends/weight_init.h"
#include "ir/fusion.h"
#include "ir/reference_backend.h"
#include "tests/testing/forward_logits.h"

namespace kiln {
namespace {

using inference::FinishedRequest;
using inference::GenerationRequest;
using inference::RequestId;
using inference::SamplingParams;
using inference::TokenId;

ModelConfig Tiny() { return *PresetConfig("llama-tiny"); }

const SamplingParams kGreedy{.temperature = 0};

using testing::ForwardLogits;

int64_t Argmax(const std::vector<double>& row) {
  return std::max_element(row.begin(), row.end()) - row.begin();
}

// What the generator showed for each (request, position).
using LogitsLog = std::map<std::pair<RequestId, int64_t>, std::vector<float>>;

GeneratorOptions Options(Precision precision, int64_t block_size, LogitsLog* log) {
  GeneratorOptions options{.precision = precision, .block_size = block_size, .max_context = 64};
  if (log != nullptr) {
    options.on_logits = [log](RequestId r, int64_t position, absl::Span<const float> logits) {
      (*log)[{r, position}] = std::vector<float>(logits.begin(), logits.end());
    };
  }
  return options;
}

std::vector<TokenId> Prompt(int64_t n, int64_t salt) {
  std::vector<TokenId> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<TokenId>((i * 37 + salt * 11 + 5) % 256));
  return p;
}

// Every logged step of `request` against the full forward over its final context: equal to
// 1e-5 of the row's largest magnitude (fp32).
void ExpectLogitsMatchForward(const LogitsLog& log, RequestId request, const std::vector<TokenId>& prompt,
                              const std::vector<TokenId>& output, const std::vector<HostTensor>& weights,
                              double tolerance = 1e-5) {
  std::vector<TokenId> context = prompt;
  context.insert(context.end(), output.begin(), output.end() - 1);  // the last output is never fed back
  const auto rows = ForwardLogits(Tiny(), weights, context, Precision::kFp32);
  int64_t checked = 0;
  for (const auto& [key, logits] : log) {
    if (key.first != request) continue;
    const int64_t position = key.second;
    ASSERT_LT(position, static_cast<int64_t>(rows.size()));
    double scale = 0;
    for (double v : rows[position]) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < logits.size(); ++i) {
      ASSERT_NEAR(logits[i], rows[position][i], tolerance * scale)
          << "request " << request << " position " << position << " token " << i;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int64_t>(output.size())) << "one logged step per output token";
}

// @forward's weights, in its order, with each layer's q/k/v and gate/up joined by rows: every
// forward weight is in exactly one inference weight, and a joint one's shape is its pieces'.
// The inference compile is one compile of the forward and default pipelines: a pass of
// either may be disabled (`kiln compile --inference decode --disable-pass fuse-loops`), and
// an unknown one is an error naming both.
TEST(LlamaInference, CompileDisablesAPassOfEitherPipeline) {
  const ModelConfig config = *PresetConfig("llama-tiny");
  const PagedKvLayout layout{.num_blocks = 8, .block_size = 4, .max_blocks_per_sequence = 4};
  for (const std::string& pass : {"fuse-loops", "select-flash-attention"}) {
    std::unique_ptr<Module> m = *BuildLlamaInferenceModule(config, layout, Precision::kBf16, InferencePhase::kDecode, 2);
    CompileOptions options;
    options.disabled_passes = {pass};
    absl::StatusOr<PipelineReport> report = CompileInferenceModule(*m, options);
    ASSERT_TRUE(report.ok()) << pass << ": " << report.status();
    int fusions = 0;
    for (const auto& n : m->functions()[0]->nodes()) fusions += n->opcode() == Opcode::kFusion;
    EXPECT_EQ(fusions == 0, pass == "fuse-loops") << pass;
  }
  std::unique_ptr<Module> m = *BuildLlamaInferenceModule(config, layout, Precision::kBf16, InferencePhase::kDecode, 2);
  CompileOptions options;
  options.disabled_passes = {"bogus"};
  absl::StatusOr<PipelineReport> report = CompileInferenceModule(*m, options);
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::StrContains(report.status().message(),
                                "cannot disable unknown pass 'bogus'; pipeline forward has: select-flash-attention, dce; "
                                "pipeline default has: simplify"))
      << report.status();
}

TEST(LlamaInference, FunctionsTakeTheForwardsWeightsInItsOrder) {
  const ModelConfig config = Tiny();
  auto forward = BuildLlamaModule(config, {.batch = 1, .seq_len = 8});
  ASSERT_TRUE(forward.ok());
  const std::vector<Node*> fp = (*forward)->FindFunction("forward")->parameters();
  const std::vector<InferenceWeight> joined = LlamaInferenceWeights(config);
  ASSERT_EQ(joined.size(), fp.size() - 2 - 3 * static_cast<size_t>(config.n_layers)) << "3 fewer weights a layer";
  int next_source = 0;
  for (const InferenceWeight& w : joined) {
    int64_t rows = 0;
    for (int source : w.sources) {
      EXPECT_EQ(source, next_source++) << w.spec.name;
      const Node* piece = fp[2 + source];
      EXPECT_EQ(std::vector<int64_t>(piece->type().dims.begin() + 1, piece->type().dims.end()),
                std::vector<int64_t>(w.spec.shape.begin() + 1, w.spec.shape.end()))
          << w.spec.name << " joins " << piece->name() << " by rows";
      rows += piece->type().dims[0];
    }
    EXPECT_EQ(rows, w.spec.shape[0]) << w.spec.name;
    if (w.sources.size() == 1) EXPECT_EQ(w.spec.name, fp[2 + w.sources[0]]->name());
  }
  EXPECT_EQ(next_source, static_cast<int>(fp.size()) - 2);
  EXPECT_EQ(joined[2].spec.name, "model.layers.0.self_attn.qkv_proj.weight");
  EXPECT_EQ(joined[2].spec.shape, (std::vector<int64_t>{(config.n_heads + 2 * config.n_kv_heads) * config.head_dim,
                                                        config.d_model}));
  EXPECT_EQ(joined[5].spec.name, "model.layers.0.mlp.gate_up_proj.weight");
  EXPECT_EQ(joined[5].spec.shape, (std::vector<int64_t>{2 * config.d_ff, config.d_model}));

  const PagedKvLayout layout{.num_blocks = 8, .block_size = 4, .max_blocks_per_sequence = 4};
  for (auto [phase, name] : {std::pair{InferencePhase::kPrefill, "prefill"}, std::pair{InferencePhase::kDecode, "decode"}}) {
    auto module = BuildLlamaInferenceModule(config, layout, Precision::kBf16, phase, 4);
    ASSERT_TRUE(module.ok()) << module.status();
    const Function* f = (*module)->FindFunction(name);
    ASSERT_NE(f, nullptr);
    const std::vector<Node*> p = f->parameters();
    ASSERT_EQ(p.size() - kInferenceFirstWeightParameter, joined.size());
    int gemm_operands = 0;
    for (size_t i = 0; i < joined.size(); ++i) {
      const Node* w = p[i + kInferenceFirstWeightParameter];
      EXPECT_EQ(w->name(), joined[i].spec.name);
      EXPECT_EQ(w->type().dims, joined[i].spec.shape);
      // The GEMM operands in bf16, which @forward rounds them to before each use.
      EXPECT_EQ(w->type().dtype, joined[i].spec.gemm_operand ? DType::kBF16 : DType::kF32) << w->name();
      gemm_operands += joined[i].spec.gemm_operand;
    }
    EXPECT_EQ(gemm_operands, 4 * config.n_layers + (config.tie_embeddings ? 0 : 1));
    EXPECT_EQ(p[kInferenceKPoolParameter]->type().ToString(), "bf16[2,8,2,4,32]");
    EXPECT_EQ(f->output_aliases(),
              (std::vector<int64_t>{-1, kInferenceKPoolParameter, kInferenceVPoolParameter, -1}));
    // One row of logits a sequence: a prefill's last token's.
    EXPECT_EQ(f->outputs()[kInferenceTokenOutput]->type().ToString(),
              phase == InferencePhase::kPrefill ? "i32[1,1]" : "i32[4,1]");
    EXPECT_EQ(f->outputs()[0]->type().dims,
              (std::vector<int64_t>{phase == InferencePhase::kPrefill ? 1 : 4, 1, 256}));
    // The normal pipelines run on them, and the donated pools survive them.
    absl::StatusOr<PipelineReport> report = CompileInferenceModule(**module, CompileOptions{});
    ASSERT_TRUE(report.ok()) << report.status();
    std::map<Opcode, int> ops;
    for (const auto& n : f->nodes()) ++ops[n->opcode()];
    EXPECT_EQ(ops[Opcode::kDotGeneral], 0) << "lower-gemm ran";
    // qkv, o, gate_up, down; the head (merge-sibling-gemms is off: it would copy the bf16
    // weight parameters into one every call; the joint weights are joined once, at bind)
    // (Four rows: each layer's gate/up GEMV computes its SwiGLU, a gemv_glu fusion holding it.)
    int glus = 0;
    for (const auto& n : f->nodes()) glus += n->opcode() == Opcode::kFusion && *FusionKindOf(*n) == FusionKind::kGemvGlu;
    EXPECT_EQ(glus, config.n_layers) << "fuse-gemv-glu";
    EXPECT_EQ(ops[Opcode::kGemm] + glus, 4 * config.n_layers + 1);
    EXPECT_EQ(ops[Opcode::kConcatenate], 0);
    EXPECT_GT(ops[Opcode::kFusion], 0) << "fuse-loops ran";
    // Each layer's K and V rows are stored into the pools by the kernel that computes them
    // (fuse-cache-write): no kv_cache_write is left on its own.
    EXPECT_EQ(ops[Opcode::kKvCacheWrite], 0);
    // And one kernel a layer writes both (merge-cache-write-siblings).
    int cache_write_fusions = 0, cache_writes = 0;
    for (const auto& n : f->nodes()) {
      if (n->opcode() != Opcode::kFusion || *FusionKindOf(*n) != FusionKind::kCacheWrite) continue;
      ++cache_write_fusions;
      for (const Node* out : n->body()->outputs()) cache_writes += out->opcode() == Opcode::kKvCacheWrite;
    }
    EXPECT_EQ(cache_writes, 2 * config.n_layers);
    EXPECT_EQ(cache_write_fusions, config.n_layers);
    EXPECT_EQ(ops[Opcode::kPagedAttention], config.n_layers);
    EXPECT_EQ(f->output_aliases(),
              (std::vector<int64_t>{-1, kInferenceKPoolParameter, kInferenceVPoolParameter, -1}));
    EXPECT_EQ(f->outputs()[kInferenceTokenOutput]->type().ToString(),
              phase == InferencePhase::kPrefill ? "i32[1,1]" : "i32[4,1]");
  }
}

// Binding joins the pieces' rows in order (each value as it was, rounded once to the GEMM
// dtype), passes the others through, and refuses a list of the wrong length.
TEST(LlamaInference, InferenceWeightsFromModelJoinsRowsOnce) {
  const ModelConfig config = Tiny();
  const std::vector<HostTensor> model = InitLlamaWeights(config, 3);
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    absl::StatusOr<std::vector<HostTensor>> bound = InferenceWeightsFromModel(config, model, precision);
    ASSERT_TRUE(bound.ok()) << bound.status();
    const std::vector<InferenceWeight> specs = LlamaInferenceWeights(config);
    ASSERT_EQ(bound->size(), specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ((*bound)[i].type(), InferenceWeightType(specs[i].spec, precision)) << specs[i].spec.name;
      std::vector<double> want;
      for (int source : specs[i].sources) {
        const std::vector<double>& v = model[source].values();
        want.insert(want.end(), v.begin(), v.end());
      }
      want = HostTensor::FromValues((*bound)[i].type(), want).values();
      EXPECT_EQ((*bound)[i].values(), want) << specs[i].spec.name;
    }
  }
  std::vector<HostTensor> short_list(model.begin(), model.end() - 1);
  absl::StatusOr<std::vector<HostTensor>> refused = InferenceWeightsFromModel(config, short_list, Precision::kBf16);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("weights, got"), std::string::npos) << refused.status();
}

// Block size 4, a 10-token prompt (blocks 0-2, the last partly filled) and 12 new tokens:
// every decode step crosses or fills blocks, and each step's logits are the full forward's.
TEST(LlamaInference, DecodeLogitsEqualTheFullForwardAcrossBlockBoundaries) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 7);
  LogitsLog log;
  auto gen = Generator::Create(Tiny(), weights, Options(Precision::kFp32, 4, &log));
  ASSERT_TRUE(gen.ok()) << gen.status();
  const std::vector<TokenId> prompt = Prompt(10, 1);
  ASSERT_TRUE((*gen)->Submit({.id = 1, .prompt = prompt, .max_new_tokens = 12, .sampling = kGreedy}).ok());
  auto finished = (*gen)->Run();
  ASSERT_TRUE(finished.ok()) << finished.status();
  ASSERT_EQ(finished->size(), 1u);
  ASSERT_EQ((*finished)[0].output.size(), 12u);
  ExpectLogitsMatchForward(log, 1, prompt, (*finished)[0].output, weights);
  EXPECT_EQ((*gen)->stats().prefill_tokens, 10);
  EXPECT_EQ((*gen)->stats().decode_tokens, 11);
}

// A second request sharing the first one's 8-token prefix (two full blocks of 4) reuses its
// cached blocks, prefilling only the rest, and still computes the forward's logits.
TEST(LlamaInference, PrefixCacheHitsGiveTheForwardsLogits) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 8);
  LogitsLog log;
  auto gen = Generator::Create(Tiny(), weights, Options(Precision::kFp32, 4, &log));
  ASSERT_TRUE(gen.ok()) << gen.status();
  const std::vector<TokenId> first = Prompt(9, 2);
  std::vector<TokenId> second(first.begin(), first.begin() + 8);
  for (TokenId t : {3, 1, 4}) second.push_back(t);
  ASSERT_TRUE((*gen)->Submit({.id = 1, .prompt = first, .max_new_tokens = 6, .sampling = kGreedy}).ok());
  auto a = (*gen)->Run();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*gen)->Submit({.id = 2, .prompt = second, .max_new_tokens = 6, .sampling = kGreedy}).ok());
  auto b = (*gen)->Run();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*gen)->stats().cached_tokens, 8);
  EXPECT_EQ((*gen)->stats().prefill_tokens, 9 + 3);
  ExpectLogitsMatchForward(log, 1, first, (*a)[0].output, weights);
  ExpectLogitsMatchForward(log, 2, second, (*b)[0].output, weights);
}

// Requests of different lengths run together (decode buckets 4 with padding rows, prefills
// and decodes in one step) and produce what each produces alone.
TEST(LlamaInference, ContinuousBatchingChangesNoRequestsTokens) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 9);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 3; ++i) {
    requests.push_back({.id = i, .prompt = Prompt(3 + 5 * i, i), .max_new_tokens = 4 + 3 * i, .sampling = kGreedy});
  }
  std::map<RequestId, std::vector<TokenId>> alone;
  for (const GenerationRequest& r : requests) {
    auto gen = Generator::Create(Tiny(), weights, Options(Precision::kBf16, 4, nullptr));
    ASSERT_TRUE(gen.ok());
    ASSERT_TRUE((*gen)->Submit(r).ok());
    auto done = (*gen)->Run();
    ASSERT_TRUE(done.ok()) << done.status();
    alone[r.id] = (*done)[0].output;
  }
  LogitsLog log;
  GeneratorOptions options = Options(Precision::kBf16, 4, &log);
  options.max_running = 4;
  auto gen = Generator::Create(Tiny(), weights, options);
  ASSERT_TRUE(gen.ok());
  ASSERT_TRUE((*gen)->Submit(requests[0]).ok());
  ASSERT_TRUE((*gen)->Step().ok());  // request 0 is decoding when the others arrive
  ASSERT_TRUE((*gen)->Submit(requests[1]).ok());
  ASSERT_TRUE((*gen)->Submit(requests[2]).ok());
  auto done = (*gen)->Run();
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->size(), 3u);
  for (const FinishedRequest& f : *done) EXPECT_EQ(f.output, alone[f.id]) << "request " << f.id;
}

// Greedy generation under the bf16 policy is the argmax of the full forward, run again on
// the growing context for every token.
TEST(LlamaInference, GreedyGenerationIsTheArgmaxOfRepeatedFullForwards) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 10);
  auto gen = Generator::Create(Tiny(), weights, Options(Precision::kBf16, 16, nullptr));
  ASSERT_TRUE(gen.ok());
  const std::vector<TokenId> prompt = {'h', 'e', 'l', 'l', 'o'};
  ASSERT_TRUE((*gen)->Submit({.id = 0, .prompt = prompt, .max_new_tokens = 8, .sampling = kGreedy}).ok());
  auto done = (*gen)->Run();
  ASSERT_TRUE(done.ok()) << done.status();
  std::vector<TokenId> context = prompt;
  std::vector<TokenId> expected;
  for (int i = 0; i < 8; ++i) {
    const auto rows = ForwardLogits(Tiny(), weights, context, Precision::kBf16);
    expected.push_back(static_cast<TokenId>(Argmax(rows.back())));
    context.push_back(expected.back());
  }
  EXPECT_EQ((*done)[0].output, expected);
  // Every decode call's time is kept, summing to the total the mean is taken from.
  const GenerationStats& stats = (*gen)->stats();
  ASSERT_EQ(stats.decode_call_seconds.size(), static_cast<size_t>(stats.decode_steps));
  double sum = 0;
  for (double s : stats.decode_call_seconds) sum += s;
  EXPECT_NEAR(sum, stats.decode_seconds, 1e-9 * stats.decode_steps);
  const DecodeCallTimes calls = SummarizeDecodeCalls(stats);
  EXPECT_LE(calls.min_ms, calls.median_ms);
  EXPECT_LE(calls.median_ms, calls.max_ms);
  EXPECT_GT(calls.min_ms, 0.0);
}

// The median of an even count is the mean of the middle two; no calls, all zero.
TEST(LlamaInference, DecodeCallTimesSummarizeTheCalls) {
  GenerationStats stats;
  EXPECT_EQ(SummarizeDecodeCalls(stats).max_ms, 0.0);
  stats.decode_call_seconds = {0.004, 0.001, 0.003, 0.010};
  const DecodeCallTimes calls = SummarizeDecodeCalls(stats);
  EXPECT_DOUBLE_EQ(calls.median_ms, 3.5);
  EXPECT_DOUBLE_EQ(calls.min_ms, 1.0);
  EXPECT_DOUBLE_EQ(calls.max_ms, 10.0);
  stats.decode_call_seconds.push_back(0.002);
  EXPECT_DOUBLE_EQ(SummarizeDecodeCalls(stats).median_ms, 3.0);
  // The GPU's part: the median of the timed calls only (0: a profiled or untimed call).
  EXPECT_EQ(SummarizeDecodeCalls(stats).gpu_median_ms, 0.0);
  stats.decode_call_gpu_seconds = {0.0030, 0.0, 0.0010, 0.0020, 0.0};
  EXPECT_DOUBLE_EQ(SummarizeDecodeCalls(stats).gpu_median_ms, 2.0);
}

// The functions draw every token themselves (sample_tokens), and what they draw is what the
// host's Sampler draws from the same logits with the same parameters and draw index: each
// request's sampling operands reach its row, through prefills, decode steps and padding.
TEST(LlamaInference, TheFunctionsDrawWhatTheSamplerDraws) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 13);
  const std::vector<SamplingParams> kinds = {kGreedy,
                                             {.temperature = 0.7, .seed = 1},
                                             {.temperature = 1.0, .top_k = 5, .seed = 2},
                                             {.temperature = 1.2, .top_p = 0.8, .seed = 3},
                                             {.temperature = 0.9, .top_k = 40, .top_p = 0.9, .seed = 0xfedcba9876543210ULL},
                                             {.temperature = 2.0, .top_p = 0.5, .seed = 6}};
  struct Drawn {
    RequestId request;
    int64_t position;
    std::vector<float> logits;
  };
  std::vector<Drawn> drawn;
  GeneratorOptions options = Options(Precision::kBf16, 16, nullptr);
  options.on_logits = [&](RequestId r, int64_t position, absl::Span<const float> logits) {
    drawn.push_back({r, position, std::vector<float>(logits.begin(), logits.end())});
  };
  auto gen = Generator::Create(Tiny(), weights, options);
  ASSERT_TRUE(gen.ok()) << gen.status();
  std::map<RequestId, int64_t> prompt_length;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const std::vector<TokenId> prompt = Prompt(5 + i, 7 + i);
    prompt_length[i] = static_cast<int64_t>(prompt.size());
    ASSERT_TRUE((*gen)->Submit({.id = static_cast<RequestId>(i), .prompt = prompt, .max_new_tokens = 12,
                                .sampling = kinds[i]}).ok());
  }
  auto done = (*gen)->Run();
  ASSERT_TRUE(done.ok()) << done.status();
  std::map<RequestId, std::vector<TokenId>> outputs;
  for (const FinishedRequest& f : *done) outputs[f.id] = f.output;
  ASSERT_EQ(outputs.size(), kinds.size());
  ASSERT_EQ(drawn.size(), kinds.size() * 12);
  inference::Sampler sampler;
  int sampled_differently_from_greedy = 0;
  for (const Drawn& d : drawn) {
    // The token whose next-token logits these are is at `position`: the output's draw index
    // is position + 1 - the prompt's length.
    const int64_t draw = d.position + 1 - prompt_length[d.request];
    const SamplingParams& params = kinds[d.request];
    absl::StatusOr<TokenId> want = sampler.Sample(d.logits, params, draw);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(outputs[d.request][draw], *want) << "request " << d.request << ", draw " << draw;
    absl::StatusOr<TokenId> greedy = sampler.Sample(d.logits, kGreedy, draw);
    sampled_differently_from_greedy += *greedy != *want;
  }
  EXPECT_GT(sampled_differently_from_greedy, 10) << "the sampled requests drew more than their argmax";
}

// Decode lookahead (GeneratorOptions::decode_lookahead) starts the next decode step fed with
// this step's tokens before the host has read them; the next step uses it only when its
// inputs came out as assumed. Whatever happens between the steps (a request samples EOS,
// another joins and prefills, one ends at max_new_tokens), the tokens are those of the
// generator without it, step for step, sampled requests' too.
TEST(LlamaInference, DecodeLookaheadChangesNoTokens) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 14);
  struct Outcome {
    std::map<RequestId, std::vector<TokenId>> outputs;
    std::map<RequestId, inference::FinishReason> reasons;
    GenerationStats stats;
  };
  auto run = [&](bool lookahead, std::optional<TokenId> eos, bool with_sampled) {
    GeneratorOptions options = Options(Precision::kBf16, 4, nullptr);
    options.max_running = 4;
    options.eos_token = eos;
    options.decode_lookahead = lookahead;
    auto gen = Generator::Create(Tiny(), weights, options);
    EXPECT_TRUE(gen.ok());
    Outcome o;
    EXPECT_TRUE((*gen)->Submit({.id = 0, .prompt = Prompt(6, 1), .max_new_tokens = 20, .sampling = kGreedy}).ok());
    EXPECT_TRUE((*gen)->Submit({.id = 1, .prompt = Prompt(9, 2), .max_new_tokens = 14, .sampling = kGreedy}).ok());
    for (int step = 0; step < 100 && (*gen)->scheduler().HasUnfinishedRequests(); ++step) {
      if (step == 7) {  // joins while 0 and 1 decode: its prefill ends a lookahead
        const SamplingParams sampling =
            with_sampled ? SamplingParams{.temperature = 0.8, .top_k = 20, .seed = 5} : kGreedy;
        EXPECT_TRUE((*gen)->Submit({.id = 2, .prompt = Prompt(5, 3), .max_new_tokens = 6, .sampling = sampling}).ok());
      }
      auto done = (*gen)->Step();
      EXPECT_TRUE(done.ok()) << done.status();
      if (!done.ok()) break;
      for (const FinishedRequest& f : *done) {
        o.outputs[f.id] = f.output;
        o.reasons[f.id] = f.reason;
      }
    }
    o.stats = (*gen)->stats();
    return o;
  };
  const Outcome plain = run(false, std::nullopt, false);
  ASSERT_EQ(plain.outputs.size(), 3u);
  EXPECT_EQ(plain.stats.lookahead_started, 0);
  const Outcome ahead = run(true, std::nullopt, false);
  EXPECT_EQ(ahead.outputs, plain.outputs);
  // Blocks of 4 and two requests in different phases: every other step or so one of them
  // opens a block, which the lookahead takes from the free list as the scheduler will. Only
  // the join of request 2, the steps where a request reaches max_new_tokens and the last
  // step of all start nothing ahead; without EOS only the join can drop a call started ahead.
  EXPECT_GE(ahead.stats.lookahead_used, ahead.stats.decode_steps - 6)
      << ahead.stats.lookahead_used << " of " << ahead.stats.lookahead_started << " started, "
      << ahead.stats.decode_steps << " steps";
  EXPECT_GE(ahead.stats.lookahead_used + 1, ahead.stats.lookahead_started);
  EXPECT_EQ(ahead.stats.decode_steps, plain.stats.decode_steps);
  // EOS: a token of request 0's output at several places, so some EOS falls on a step that
  // had started the next one (that call is dropped, its K/V write harmless).
  int64_t dropped = 0;
  for (size_t at : {3u, 5u, 6u, 9u}) {
    ASSERT_LT(at, plain.outputs.at(0).size());
    const TokenId eos = plain.outputs.at(0)[at];
    const Outcome a = run(false, eos, false), b = run(true, eos, false);
    EXPECT_EQ(b.outputs, a.outputs) << "EOS " << eos;
    EXPECT_EQ(b.reasons, a.reasons) << "EOS " << eos;
    EXPECT_EQ(a.reasons.at(0), inference::FinishReason::kEos);
    dropped += b.stats.lookahead_started - b.stats.lookahead_used;
  }
  EXPECT_GT(dropped, 0) << "an EOS fell on a step started ahead";
  // A sampled request is drawn on the device too (its next draw index known ahead): the
  // lookahead runs while it decodes, and it draws what it draws without one.
  const Outcome sampled_plain = run(false, std::nullopt, true), sampled = run(true, std::nullopt, true);
  EXPECT_EQ(sampled.outputs, sampled_plain.outputs);
  EXPECT_GE(sampled.stats.lookahead_used, sampled.stats.decode_steps - 6);
}

// An engine holds at most kMaxCallsInFlight started calls; Finish hands them back oldest
// first; Run wants none in flight; feed_rows cannot take more tokens than the last call
// had. Misuse is a clear error that leaves the engine usable.
TEST(LlamaInference, EngineCallsInFlightAreBoundedAndOrdered) {
  const ModelConfig config = Tiny();
  const PagedKvLayout layout{.num_blocks = 8, .block_size = 4, .max_blocks_per_sequence = 4};
  std::unique_ptr<Module> m = *BuildLlamaInferenceModule(config, layout, Precision::kFp32, InferencePhase::kDecode, 2);
  ASSERT_TRUE(CompileInferenceModule(*m, CompileOptions{}).ok());
  const Function& decode = *m->functions()[0];
  auto weights = InferenceWeightsFromModel(config, InitLlamaWeights(config, 15), Precision::kFp32);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto engine = CreateReferenceInferenceEngine(config, layout, Precision::kFp32, *std::move(weights));
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto i32 = [](std::vector<int64_t> dims, std::vector<double> v) {
    return HostTensor::FromValues({DType::kI32, std::move(dims)}, std::move(v));
  };
  // Two sequences at positions 0 and 1 of blocks 0 and 1 (position 0 of sequence 1 unwritten:
  // attention reads only slot 5, its own).
  auto inputs = [&](double first_token) {
    return InferenceEngine::Inputs{i32({2, 1}, {first_token, 7}),
                                   i32({2, 1}, {0, 0}),
                                   i32({2, 1}, {0, 4}),
                                   i32({2, 4}, {0, -1, -1, -1, 1, -1, -1, -1}),
                                   HostTensor::FromValues({DType::kF32, {2, 1, 3}}, {0, 0, 1, 0, 0, 1}),
                                   i32({2, 1, 3}, {0, 0, 0, 0, 0, 0})};
  };
  const std::vector<int64_t> rows = {0, 1};
  ASSERT_TRUE((*engine)->Start(decode, inputs(3), rows, false).ok());
  ASSERT_TRUE((*engine)->Start(decode, inputs(9), rows, false).ok());
  EXPECT_EQ((*engine)->calls_in_flight(), 2);
  absl::Status third = (*engine)->Start(decode, inputs(3), rows, false);
  EXPECT_EQ(third.code(), absl::StatusCode::kFailedPrecondition) << third;
  EXPECT_EQ((*engine)->Run(decode, inputs(3), rows, false).status().code(), absl::StatusCode::kFailedPrecondition);
  auto first = (*engine)->Finish();
  auto second = (*engine)->Finish();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ((*engine)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  // The second call's row 1 saw the same token and context as the first's.
  EXPECT_EQ(first->tokens[1], second->tokens[1]);
  // Fed: row 0 of the next call takes the last call's token of row 0 instead of 5.
  ASSERT_TRUE((*engine)->Start(decode, inputs(5), rows, false, /*feed_rows=*/1).ok());
  auto fed = (*engine)->Finish();
  auto direct = (*engine)->Run(decode, inputs(second->tokens[0]), rows, false);
  ASSERT_TRUE(fed.ok() && direct.ok());
  EXPECT_EQ(fed->tokens, direct->tokens);
  absl::Status too_many = (*engine)->Start(decode, inputs(3), rows, false, /*feed_rows=*/3);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument) << too_many;
  EXPECT_EQ((*engine)->calls_in_flight(), 0);
}

TEST(LlamaInference, SamplingIsDeterministicPerSeed) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 11);
  auto run = [&](uint64_t seed) {
    auto gen = Generator::Create(Tiny(), weights, Options(Precision::kBf16, 16, nullptr));
    EXPECT_TRUE(gen.ok());
    SamplingParams sampling{.temperature = 1.0, .top_k = 50, .top_p = 0.95, .seed = seed};
    EXPECT_TRUE((*gen)->Submit({.id = 0, .prompt = Prompt(6, 3), .max_new_tokens = 16, .sampling = sampling}).ok());
    auto done = (*gen)->Run();
    EXPECT_TRUE(done.ok()) << done.status();
    return (*done)[0].output;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

// Bad requests are refused at Submit with a message naming the request and the problem, and
// a good request next to them runs as it would alone.
TEST(LlamaInference, BadRequestsAreClearErrorsAndHarmNoOther) {
  const std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 12);
  auto gen = Generator::Create(Tiny(), weights, Options(Precision::kBf16, 16, nullptr));
  ASSERT_TRUE(gen.ok());
  struct Bad {
    GenerationRequest request;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{.id = 1, .prompt = {}, .max_new_tokens = 4}, "request 1: the prompt is empty"},
      {{.id = 2, .prompt = {1, 256}, .max_new_tokens = 4}, "prompt token 1 is 256, outside the vocabulary [0, 256)"},
      {{.id = 3, .prompt = Prompt(70, 0), .max_new_tokens = 1}, "exceed the model's context of 64"},
      {{.id = 4, .prompt = {1}, .max_new_tokens = 4, .sampling = {.temperature = -1}}, "temperature"},
      {{.id = 5, .prompt = {1}, .max_new_tokens = 4, .sampling = {.top_p = 0}}, "top_p"},
      {{.id = 6, .prompt = {1}, .max_new_tokens = 0}, "max_new_tokens is 0"},
  };
  const GenerationRequest good{.id = 0, .prompt = Prompt(5, 4), .max_new_tokens = 5, .sampling = kGreedy};
  ASSERT_TRUE((*gen)->Submit(good).ok());
  for (const Bad& b : bad) {
    absl::Status st = (*gen)->Submit(b.request);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(b.message), std::string::npos) << st;
  }
  auto done = (*gen)->Run();
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->size(), 1u);
  auto alone = Generator::Create(Tiny(), weights, Options(Precision::kBf16, 16, nullptr));
  ASSERT_TRUE((*alone)->Submit(good).ok());
  EXPECT_EQ((*(*alone)->Run())[0].output, (*done)[0].output);
}

TEST(LlamaInference, WeightsOfAnotherShapeAreRefused) {
  std::vector<HostTensor> weights = InitLlamaWeights(Tiny(), 1);
  weights.pop_back();
  auto gen = Generator::Create(Tiny(), weights, {});
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.status().message().find("takes"), std::string::npos) << gen.status();
}

}  // namespace
}  // namespace kiln
