#include "frontends/generator.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "frontends/inference_engine.h"
#include "frontends/llama.h"
#include "ir/token_sampling.h"
#include "ir/status_macros.h"
#ifdef KILN_WITH_CUDA
#include "codegen/capabilities.h"
#include "frontends/cuda_inference_engine.h"
#include "runtime/cuda/device.h"
#endif

namespace kiln {
namespace {

using inference::BlockId;
using inference::DecodeWork;
using inference::PrefillWork;
using inference::SampledToken;
using inference::TokenId;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

HostTensor I32(std::vector<int64_t> dims, const std::vector<int32_t>& values) {
  std::vector<double> v(values.begin(), values.end());
  return HostTensor::FromValues(TensorType{DType::kI32, std::move(dims)}, std::move(v));
}

HostTensor F32(std::vector<int64_t> dims, const std::vector<float>& values) {
  std::vector<double> v(values.begin(), values.end());
  return HostTensor::FromValues(TensorType{DType::kF32, std::move(dims)}, std::move(v));
}

}  // namespace

int64_t PrefillBucket(int64_t num_tokens) {
  int64_t bucket = 1;
  while (bucket < num_tokens) bucket *= 2;
  return bucket;
}

std::vector<PrefillCall> PlanPrefillCalls(absl::Span<const PrefillWork> prefills, int64_t block_size,
                                          int64_t call_tokens, int64_t fresh_min_tokens) {
  struct Group {
    InferencePhase phase;
    int64_t bucket;
    std::vector<size_t> members;
  };
  std::vector<Group> groups;
  // For each block in a table so far, the last group holding a prompt whose table has it.
  absl::flat_hash_map<BlockId, size_t> holder;
  for (size_t i = 0; i < prefills.size(); ++i) {
    const PrefillWork& p = prefills[i];
    const int64_t context = static_cast<int64_t>(p.tokens.size());
    const int64_t fresh = context - p.num_cached_tokens;
    const int64_t bucket = PrefillBucket(fresh);
    const InferencePhase phase = p.num_cached_tokens == 0 && fresh_min_tokens > 0 && fresh >= fresh_min_tokens
                                     ? InferencePhase::kFreshPrefill
                                     : InferencePhase::kPrefill;
    const int64_t used_blocks = std::min<int64_t>(static_cast<int64_t>(p.block_table.size()),
                                                  (context + block_size - 1) / block_size);
    size_t earliest = 0;
    for (int64_t b = 0; b < used_blocks; ++b) {
      if (auto it = holder.find(p.block_table[b]); it != holder.end()) earliest = std::max(earliest, it->second);
    }
    const size_t rows = static_cast<size_t>(std::max<int64_t>(1, call_tokens / bucket));
    size_t g = earliest;
    while (g < groups.size() &&
           (groups[g].phase != phase || groups[g].bucket != bucket || groups[g].members.size() >= rows)) {
      ++g;
    }
    if (g == groups.size()) groups.push_back({phase, bucket, {}});
    groups[g].members.push_back(i);
    for (int64_t b = 0; b < used_blocks; ++b) {
      size_t& h = holder[p.block_table[b]];
      h = std::max(h, g);
    }
  }
  std::vector<PrefillCall> calls;
  for (const Group& group : groups) {
    // The largest power of two of rows left, then the next: no padding rows, few shapes.
    for (size_t next = 0; next < group.members.size();) {
      size_t rows = 1;
      while (rows * 2 <= group.members.size() - next) rows *= 2;
      PrefillCall call{{group.phase, static_cast<int64_t>(rows), group.bucket}, {}};
      call.prefills.assign(group.members.begin() + next, group.members.begin() + next + rows);
      calls.push_back(std::move(call));
      next += rows;
    }
  }
  return calls;
}

Generator::Generator(const ModelConfig& config, const GeneratorOptions& options) : config_(config), options_(options) {}
Generator::~Generator() = default;

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(const ModelConfig& config, std::vector<HostTensor> weights,
                                                             const GeneratorOptions& options) {
  RETURN_IF_ERROR(config.Validate());
  if (config.family != ModelFamily::kLlama) {
    return absl::UnimplementedError(absl::StrCat("model '", config.name,
                                                 "' is a GPT-2 model: the paged-KV inference functions "
                                                 "(frontends/llama_inference.h) are built for Llama models only"));
  }
  const std::vector<WeightSpec> specs = LlamaWeights(config);
  if (weights.size() != specs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", config.name, "' takes ", specs.size(), " weights, got ",
                                                   weights.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorType want{DType::kF32, specs[i].shape};
    if (weights[i].type() != want) {
      return absl::InvalidArgumentError(absl::StrCat("weight ", specs[i].name, " must be ", want.ToString(), ", got ",
                                                     weights[i].type().ToString()));
    }
  }
  if (options.block_size < 1 || options.max_running < 1 || options.max_prefill_call_tokens < 1 ||
      options.num_blocks < 0 || options.max_context < 0 || options.fresh_prefill_min_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generator options: block_size (", options.block_size, "), max_running (", options.max_running,
        ") and max_prefill_call_tokens (", options.max_prefill_call_tokens, ") must be >= 1, num_blocks (",
        options.num_blocks, "), max_context (", options.max_context, ") and fresh_prefill_min_tokens (",
        options.fresh_prefill_min_tokens, ") >= 0"));
  }
  auto g = std::unique_ptr<Generator>(new Generator(config, options));
  const int64_t model_context = config.max_positions > 0 ? config.max_positions : config.seq_len;
  if (options.max_context > model_context && config.max_positions > 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_context ", options.max_context, " is beyond model '",
                                                   config.name, "''s max_position_embeddings of ",
                                                   config.max_positions));
  }
  g->max_context_ = options.max_context > 0 ? options.max_context : model_context;
  g->layout_.block_size = options.block_size;
  g->layout_.max_blocks_per_sequence = (g->max_context_ + options.block_size - 1) / options.block_size;
  g->layout_.num_blocks =
      options.num_blocks > 0 ? options.num_blocks : options.max_running * g->layout_.max_blocks_per_sequence;

  ASSIGN_OR_RETURN(inference::BlockManager blocks,
                   inference::BlockManager::Create({.num_blocks = g->layout_.num_blocks,
                                                    .block_size = options.block_size,
                                                    .enable_prefix_caching = options.enable_prefix_caching}));
  ASSIGN_OR_RETURN(inference::Scheduler scheduler,
                   inference::Scheduler::Create({.vocab_size = config.vocab_size,
                                                 .max_context = g->max_context_,
                                                 .max_running = options.max_running,
                                                 .max_prefill_tokens = options.max_prefill_tokens,
                                                 .eos_token = options.eos_token},
                                                std::move(blocks)));
  g->scheduler_.emplace(std::move(scheduler));

  // As the inference functions take them: q/k/v and gate/up joined, the GEMM operands in the
  // GEMM dtype. Done once here, so no call copies a weight.
  ASSIGN_OR_RETURN(weights, InferenceWeightsFromModel(config, std::move(weights), options.precision));
  if (options.device == nullptr) {
    ASSIGN_OR_RETURN(g->engine_,
                     CreateReferenceInferenceEngine(config, g->layout_, options.precision, std::move(weights)));
  } else {
#ifdef KILN_WITH_CUDA
    ASSIGN_OR_RETURN(g->engine_, CreateCudaInferenceEngine(config, g->layout_, options.precision, std::move(weights),
                                                           *options.device, CudaExecutableOptions{},
                                                           options.time_decode_calls));
#else
    return absl::FailedPreconditionError("generation on a GPU: this kiln was built without CUDA");
#endif
  }
  return g;
}

absl::Status Generator::Submit(inference::GenerationRequest request) {
  return scheduler_->Submit(std::move(request));  // its errors name the request
}

absl::StatusOr<const Function*> Generator::FunctionFor(const InferenceShape& shape) {
  auto it = compiled_.find(shape);
  if (it == compiled_.end()) {
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(std::unique_ptr<Module> module,
                     BuildLlamaInferenceModule(config_, layout_, options_.precision, shape));
    CompileOptions compile;
    compile.precision = options_.precision;
    compile.disabled_passes = options_.disabled_passes;
    compile.enabled_passes = options_.enabled_passes;
#ifdef KILN_WITH_CUDA
    // What the kernels take: @fresh_prefill's attention becomes the flash kernel where the
    // target takes its shape (select-flash-attention selects nothing without it). Both
    // backends select the same ops, so that they compute one graph (as frontends/compile.cc).
    compile.capabilities = &CodegenCapabilities();
    if (options_.device != nullptr) compile.target = options_.device->target();
#endif
    RETURN_IF_ERROR(CompileInferenceModule(*module, compile).status());
    RETURN_IF_ERROR(engine_->Load(*module->functions()[0]));
    it = compiled_.emplace(shape, std::move(module)).first;
    stats_.compile_seconds += Seconds(start);
    ++stats_.functions_compiled;
  }
  return it->second->functions()[0].get();
}

absl::StatusOr<std::vector<TokenId>> Generator::ReadTokens(const InferenceEngine::Rows& picked,
                                                           absl::Span<const RowToRead> rows) {
  const int64_t vocab = config_.vocab_size;
  std::vector<TokenId> tokens(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (options_.on_logits) {
      options_.on_logits(rows[i].request, rows[i].position,
                         absl::MakeConstSpan(picked.logits).subspan(rows[i].row * vocab, vocab));
    }
    tokens[i] = picked.tokens[rows[i].row];
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("request ", rows[i].request,
                                                     ": no token can be drawn from the logits at position ",
                                                     rows[i].position, ": they hold a NaN or +inf, or are all -inf"));
    }
  }
  return tokens;
}

absl::StatusOr<std::vector<SampledToken>> Generator::RunPrefills(const inference::ScheduledStep& step) {
  // In the step's order, whatever order the calls run them in: the tokens stream, and the
  // requests finish, as they did one prefill a call.
  std::vector<SampledToken> sampled(step.prefills.size());
  const int64_t bs = layout_.block_size, m = layout_.max_blocks_per_sequence;
  for (const PrefillCall& call : PlanPrefillCalls(step.prefills, bs, options_.max_prefill_call_tokens,
                                                  options_.fresh_prefill_min_tokens)) {
    ASSIGN_OR_RETURN(const Function* f, FunctionFor(call.shape));
    const auto run_start = std::chrono::steady_clock::now();
    const int64_t b = call.shape.batch, t = call.shape.tokens;
    // Padding (a row's tokens past its prompt): position -1 and slot -1, written nowhere.
    std::vector<int32_t> tokens(b * t, 0), positions(b * t, -1), slots(b * t, -1), table(b * m, -1);
    std::vector<int64_t> rows;  // the logits' rows: one a prompt, its last token's
    // Each prompt's sampling operands (padding rows greedy).
    std::vector<float> sampling;
    std::vector<int32_t> draws;
    for (int64_t r = 0; r < b; ++r) {
      const TokenSamplingOperands o =
          r < static_cast<int64_t>(call.prefills.size())
              ? ToOperands(inference::ToTokenSampling(step.prefills[call.prefills[r]].sampling,
                                                      step.prefills[call.prefills[r]].draw))
              : ToOperands(TokenSampling{.temperature = 0});
      sampling.insert(sampling.end(), o.sampling, o.sampling + 3);
      draws.insert(draws.end(), o.draws, o.draws + 3);
    }
    const bool with_logits = options_.on_logits != nullptr;
    for (int64_t r = 0; r < static_cast<int64_t>(call.prefills.size()); ++r) {
      const PrefillWork& p = step.prefills[call.prefills[r]];
      const int64_t context = static_cast<int64_t>(p.tokens.size());
      const int64_t fresh = context - p.num_cached_tokens;
      for (int64_t i = 0; i < static_cast<int64_t>(p.block_table.size()) && i < m; ++i) {
        table[r * m + i] = p.block_table[i];
      }
      for (int64_t i = 0; i < fresh; ++i) {
        const int64_t pos = p.num_cached_tokens + i;
        tokens[r * t + i] = p.tokens[pos];
        positions[r * t + i] = static_cast<int32_t>(pos);
        slots[r * t + i] = static_cast<int32_t>(p.block_table[pos / bs] * bs + pos % bs);
      }
      rows.push_back(r);
      stats_.prefill_tokens += fresh;
      stats_.cached_tokens += p.num_cached_tokens;
    }
    const bool profiled = stats_.prefill_calls == options_.profile_prefill_call;
    ASSIGN_OR_RETURN(InferenceEngine::Rows picked,
                     engine_->Run(*f, {I32({b, t}, tokens), I32({b, t}, positions), I32({b, t}, slots),
                                       I32({b, m}, table), F32({b, 1, 3}, sampling), I32({b, 1, 3}, draws)},
                                  rows, with_logits, profiled ? &prefill_profile_ : nullptr));
    if (profiled) prefill_profile_shape_ = call.shape;
    std::vector<RowToRead> to_read;
    for (size_t r = 0; r < call.prefills.size(); ++r) {
      const PrefillWork& p = step.prefills[call.prefills[r]];
      to_read.push_back({r, p.request, static_cast<int64_t>(p.tokens.size()) - 1});
    }
    ASSIGN_OR_RETURN(std::vector<TokenId> next, ReadTokens(picked, to_read));
    for (size_t r = 0; r < call.prefills.size(); ++r) sampled[call.prefills[r]] = {to_read[r].request, next[r]};
    ++stats_.prefill_calls;
    if (call.shape.phase == InferencePhase::kFreshPrefill) ++stats_.fresh_prefill_calls;
    stats_.prefill_seconds += Seconds(run_start);
  }
  return sampled;
}

namespace {

// A decode batch as @decode's six per-row inputs. Padding rows attend to nothing: position
// -1 (context length 0).
InferenceEngine::Inputs DecodeInputs(const inference::DecodeBatch& batch) {
  const int64_t bucket = batch.bucket;
  std::vector<int32_t> positions(bucket);
  for (int64_t i = 0; i < bucket; ++i) positions[i] = batch.context_lengths[i] - 1;
  return {I32({bucket, 1}, batch.tokens),
          I32({bucket, 1}, positions),
          I32({bucket, 1}, batch.slots),
          I32({bucket, batch.max_blocks_per_sequence}, batch.block_tables),
          F32({bucket, 1, 3}, batch.sampling),
          I32({bucket, 1, 3}, batch.draws)};
}

bool SameDecodeInputs(const inference::DecodeBatch& a, const inference::DecodeBatch& b) {
  return a.bucket == b.bucket && a.max_blocks_per_sequence == b.max_blocks_per_sequence && a.tokens == b.tokens &&
         a.context_lengths == b.context_lengths && a.slots == b.slots && a.block_tables == b.block_tables &&
         a.sampling == b.sampling && a.draws == b.draws;
}

}  // namespace

std::optional<inference::DecodeBatch> Generator::LookaheadBatch(const inference::ScheduledStep& step,
                                                               const inference::DecodeBatch& batch,
                                                               bool with_logits) const {
  // The next call is number decode_steps + 1: a profiled one runs on its own. A waiting
  // request is admitted next step only if the running set has room (or someone ends early,
  // which changes the batch anyway).
  const bool admits = scheduler_->num_waiting() > 0 && scheduler_->num_running() < options_.max_running;
  if (!options_.decode_lookahead.value_or(options_.device != nullptr) || with_logits || !step.prefills.empty() ||
      admits || stats_.decode_steps + 1 == options_.profile_decode_call) {
    return std::nullopt;
  }
  const int64_t bs = layout_.block_size;
  int64_t opening = 0;
  for (const DecodeWork& d : step.decodes) {
    if (d.draw + 1 >= d.max_new_tokens) return std::nullopt;
    if ((d.position + 1) % bs == 0) ++opening;
  }
  // A request whose next token opens a block takes the free list's next block then, in the
  // order of the rows (the scheduler reserves them in running order). Only a block that holds
  // nothing findable is assumed: if the step takes another after all, the write to it harms
  // nothing (a cached block's K/V would be corrupted for a later prefix hit).
  const inference::BlockManager& pool = scheduler_->block_manager();
  const std::vector<BlockId> fresh = pool.NextFreeBlocks(opening);
  if (static_cast<int64_t>(fresh.size()) < opening) return std::nullopt;
  for (BlockId b : fresh) {
    if (pool.IsCached(b)) return std::nullopt;
  }
  inference::DecodeBatch next = batch;
  size_t taken = 0;
  for (size_t i = 0; i < step.decodes.size(); ++i) {
    ++next.draws[3 * i + 2];  // the request's next draw
    const int64_t position = next.context_lengths[i]++;  // the next token's
    if (position % bs == 0) {
      const BlockId block = fresh[taken++];
      next.block_tables[i * next.max_blocks_per_sequence + position / bs] = block;
      next.slots[i] = static_cast<int32_t>(int64_t{block} * bs);
    } else {
      ++next.slots[i];
    }
  }
  return next;
}

absl::Status Generator::DropLookahead() {
  if (!lookahead_.has_value()) return absl::OkStatus();
  lookahead_.reset();
  return engine_->Finish().status();  // its rows are not this step's
}

absl::StatusOr<std::vector<SampledToken>> Generator::RunDecodes(const inference::ScheduledStep& step) {
  if (step.decodes.empty()) return std::vector<SampledToken>{};
  const int64_t bucket = step.decode_bucket;
  ASSIGN_OR_RETURN(const Function* f, FunctionFor({InferencePhase::kDecode, bucket, 1}));
  const auto start = last_decode_end_.value_or(std::chrono::steady_clock::now());
  ASSIGN_OR_RETURN(inference::DecodeBatch batch, inference::PackDecodeBatch(step.decodes, bucket, layout_.block_size,
                                                                            layout_.max_blocks_per_sequence));
  const bool profiled = stats_.decode_steps == options_.profile_decode_call;
  std::vector<int64_t> rows(step.decodes.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  const bool with_logits = options_.on_logits != nullptr;
  // The call started ahead is this step's when it computed exactly these inputs.
  const bool ahead = lookahead_.has_value() && SameDecodeInputs(lookahead_->batch, batch);
  if (ahead) {
    lookahead_.reset();
    ++stats_.lookahead_used;
  } else {
    RETURN_IF_ERROR(DropLookahead());
  }
  InferenceEngine::Rows picked;
  if (profiled && !ahead) {
    ASSIGN_OR_RETURN(picked, engine_->Run(*f, DecodeInputs(batch), rows, with_logits, &decode_profile_));
    decode_profile_bucket_ = bucket;
  } else {
    if (!ahead) RETURN_IF_ERROR(engine_->Start(*f, DecodeInputs(batch), rows, with_logits));
    if (std::optional<inference::DecodeBatch> next = LookaheadBatch(step, batch, with_logits); next.has_value()) {
      // The next step of the same requests, one position on; its tokens are this step's,
      // fed on the device.
      RETURN_IF_ERROR(engine_->Start(*f, DecodeInputs(*next), rows, /*with_logits=*/false,
                                     /*feed_rows=*/static_cast<int64_t>(rows.size())));
      lookahead_ = Lookahead{bucket, *std::move(next)};
      ++stats_.lookahead_started;
    }
    ASSIGN_OR_RETURN(picked, engine_->Finish());
    if (lookahead_.has_value()) {
      for (size_t i = 0; i < rows.size(); ++i) lookahead_->batch.tokens[i] = picked.tokens[i];
    }
  }
  std::vector<RowToRead> to_read;
  for (size_t i = 0; i < step.decodes.size(); ++i) {
    to_read.push_back({i, step.decodes[i].request, step.decodes[i].position});
  }
  ASSIGN_OR_RETURN(std::vector<TokenId> tokens, ReadTokens(picked, to_read));
  std::vector<SampledToken> sampled;
  for (size_t i = 0; i < step.decodes.size(); ++i) sampled.push_back({step.decodes[i].request, tokens[i]});
  stats_.decode_tokens += static_cast<int64_t>(step.decodes.size());
  ++stats_.decode_steps;
  const auto end = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(end - start).count();
  last_decode_end_ = end;
  stats_.decode_seconds += seconds;
  stats_.decode_call_seconds.push_back(seconds);
  stats_.decode_call_gpu_seconds.push_back(picked.gpu_seconds);
  return sampled;
}

namespace {

// Sorted milliseconds of the nonzero `seconds`.
std::vector<double> SortedMs(const std::vector<double>& seconds) {
  std::vector<double> ms;
  ms.reserve(seconds.size());
  for (double s : seconds) {
    if (s > 0) ms.push_back(1e3 * s);
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

double Median(const std::vector<double>& sorted) {
  const size_t n = sorted.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

}  // namespace

DecodeCallTimes SummarizeDecodeCalls(const GenerationStats& stats) {
  const std::vector<double> ms = SortedMs(stats.decode_call_seconds);
  if (ms.empty()) return {};
  return {.median_ms = Median(ms),
          .min_ms = ms.front(),
          .max_ms = ms.back(),
          .gpu_median_ms = Median(SortedMs(stats.decode_call_gpu_seconds))};
}

absl::StatusOr<std::vector<inference::FinishedRequest>> Generator::Step(const TokenCallback& on_token) {
  ASSIGN_OR_RETURN(inference::ScheduledStep step, scheduler_->Schedule());
  if (step.empty()) {  // nothing to run; a call started ahead for requests that ended is dropped
    last_decode_end_.reset();
    RETURN_IF_ERROR(DropLookahead());
    return std::vector<inference::FinishedRequest>{};
  }
  ++stats_.steps;
  // A step that prefills or copies blocks is not a decode step following the last: its
  // decode call is timed from its own start. The prefills run through the engine alone.
  if (!step.prefills.empty() || !step.block_copies.empty()) last_decode_end_.reset();
  if (!step.prefills.empty() || step.decodes.empty()) RETURN_IF_ERROR(DropLookahead());
  RETURN_IF_ERROR(engine_->CopyBlocks(step.block_copies));
  ASSIGN_OR_RETURN(std::vector<SampledToken> sampled, RunPrefills(step));
  ASSIGN_OR_RETURN(std::vector<SampledToken> decoded, RunDecodes(step));
  sampled.insert(sampled.end(), decoded.begin(), decoded.end());
  if (on_token) {
    for (const SampledToken& s : sampled) on_token(s.request, s.token);
  }
  return scheduler_->CompleteStep(sampled);
}

absl::StatusOr<std::vector<inference::FinishedRequest>> Generator::Run(const TokenCallback& on_token) {
  std::vector<inference::FinishedRequest> finished;
  int64_t idle_steps = 0;
  while (scheduler_->HasUnfinishedRequests()) {
    const int64_t before = stats_.steps;
    ASSIGN_OR_RETURN(std::vector<inference::FinishedRequest> done, Step(on_token));
    finished.insert(finished.end(), done.begin(), done.end());
    // A step that preempts its only running request schedules nothing; the next admits it.
    idle_steps = stats_.steps == before ? idle_steps + 1 : 0;
    if (idle_steps > 2) {
      return absl::InternalError("the scheduler scheduled nothing for three steps with requests unfinished");
    }
  }
  return finished;
}

}  // namespace kiln
