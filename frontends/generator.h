// Text generation from a paged KV cache (issue 15): the scheduler, block manager and
// sampler of runtime/inference/ driving the @prefill and @decode functions of
// frontends/llama_inference.h, compiled through the normal pipelines and run by an
// InferenceEngine (frontends/inference_engine.h): the CPU reference backend, or a GPU
// (GeneratorOptions::device) where one executable per function size binds the one copy of
// the weights and the KV pools, and replays as a CUDA graph.
//
//   Generator::Create(config, weights, options)
//   generator->Submit(request)        rejected (InvalidArgument, changing nothing) if it can
//                                     never run; other requests are unaffected
//   generator->Run(on_token)          steps until every request is done; on_token sees each
//                                     sampled token as it comes
//
// Each step: the block copies of copy-on-write, the prefills in calls of @fresh_prefill or
// @prefill (PlanPrefillCalls: prompts of one bucket together, each prompt's uncached tokens
// padded to a power of two), then the decode batch as one call of @decode padded to its
// bucket. A function is compiled the first time its shape is needed and kept.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "frontends/inference_engine.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "passes/compile_options.h"
#include "runtime/inference/scheduler.h"
#include "runtime/step_profile.h"

namespace kiln {

class CudaDevice;

struct GeneratorOptions {
  Precision precision = Precision::kBf16;
  int64_t block_size = 16;
  // KV blocks in the pool; 0: enough for max_running sequences of max_context tokens.
  int64_t num_blocks = 0;
  int64_t max_running = 8;  // also the largest decode bucket
  // Tokens of one sequence (prompt + output) at most; 0: the model's max_position_embeddings,
  // or for a preset (which declares none) its training seq_len.
  int64_t max_context = 0;
  int64_t max_prefill_tokens = 8192;
  // Tokens of one prefill call at most, padding included (rows x the bucket): prompts of one
  // bucket share a call up to it, a prompt longer than it has a call of its own. Larger
  // calls make larger GEMMs, and each shape has an arena of its own.
  int64_t max_prefill_call_tokens = 4096;
  // Prompts with nothing cached and at least this many tokens prefill through @fresh_prefill
  // (the training forward's attention over the call's own keys: one flash kernel where the
  // target takes the shape, which needs 64 or more); the others through @prefill
  // (paged_attention). 0: always @prefill.
  int64_t fresh_prefill_min_tokens = 64;
  bool enable_prefix_caching = true;
  // Passes the prefill and decode compiles skip (names as `kiln compile --help` lists them), on
  // top of those CompileInferenceModule always skips: for A/B runs of one pass.
  std::vector<std::string> disabled_passes;
  // Passes that are off by default to run in both compiles (Pass::off_by_default).
  std::vector<std::string> enabled_passes;
  std::optional<inference::TokenId> eos_token;
  // Run on this GPU (it outlives the Generator); null: on the CPU reference backend. A build
  // without CUDA refuses a device.
  CudaDevice* device = nullptr;
  // >= 0: that call of @decode (0 is the first) runs through CudaExecutable::Profile (timed
  // in its CUDA graph, or one by one): decode_profile() then says where its time went.
  int64_t profile_decode_call = -1;
  // >= 0: that prefill call (0 is the first) runs through CudaExecutable::Profile the same
  // way: prefill_profile() then says where its time went (its time, profiled, is still
  // counted as prefill time: a benchmark leaves it unset).
  int64_t profile_prefill_call = -1;
  // A GPU's decode calls timed with CUDA events (GenerationStats::decode_call_gpu_seconds;
  // frontends/cuda_inference_engine.h says what that costs).
  bool time_decode_calls = false;
  // Decode lookahead: when every request of a decode step will decode again next step (no
  // waiting request has room to be admitted, none reaches max_new_tokens, and a request whose
  // next token opens a block will find a free block that holds nothing cached) and no logits
  // are wanted (on_logits), the next step's call is started before this one's tokens are read
  // back, fed this step's tokens on the device (InferenceEngine::Start's feed_rows), each
  // request's draw index one on. The host's scheduling, sampling and bookkeeping
  // then overlap the GPU's next step. The next step uses that call only when its inputs are
  // exactly what the lookahead assumed; otherwise (a request sampled EOS, a Fork, an Abort or
  // a preemption came between the steps) the call is dropped, its one write per request
  // landing in a slot past the end of every sequence that holds the block, which nothing
  // reads before writing it again. Unset: on for a GPU; off on the CPU, which computes a call
  // as it is started (nothing overlaps, and a dropped call is wasted work), where tests turn
  // it on.
  std::optional<bool> decode_lookahead;
  // For tests: called with the logits of every token drawn (the functions draw them,
  // sample_tokens; this brings the logits off the device too): the request, the position of
  // the token whose next-token logits these are, and the logits.
  std::function<void(inference::RequestId, int64_t position, absl::Span<const float> logits)> on_logits;
};

// Time and tokens of each phase, the compiles kept apart.
struct GenerationStats {
  int64_t prefill_tokens = 0;  // tokens computed by prefill calls (cached ones excluded)
  int64_t prefill_calls = 0;   // calls of @prefill and @fresh_prefill
  int64_t fresh_prefill_calls = 0;  // of those, @fresh_prefill's
  int64_t cached_tokens = 0;   // prompt tokens whose K/V came from the prefix cache
  int64_t decode_tokens = 0;   // tokens computed by @decode (padding rows excluded)
  int64_t decode_steps = 0;    // calls of @decode
  int64_t lookahead_started = 0;  // decode calls started ahead (GeneratorOptions::decode_lookahead)
  int64_t lookahead_used = 0;     // of those, the ones whose step came as assumed
  double prefill_seconds = 0;
  double decode_seconds = 0;
  // Each @decode call's share of decode_seconds, in order: from the end of the step before
  // (its tokens in the host's hands) when that step decoded too and this one prefills and
  // copies nothing, so the host's work between two decode steps (the scheduler, the
  // callbacks, the inputs) is counted, or overlapped where the lookahead hides it; else from
  // the call's own start.
  std::vector<double> decode_call_seconds;
  // Of each call, the GPU's part (InferenceEngine::Rows::gpu_seconds); 0 for a profiled call,
  // on the CPU, and without GeneratorOptions::time_decode_calls.
  std::vector<double> decode_call_gpu_seconds;
  double compile_seconds = 0;
  int64_t steps = 0;
  int64_t functions_compiled = 0;
};

// The spread of the decode calls' times, in milliseconds (all 0 without a call): what a
// benchmark reports beside the mean (decode_seconds over decode_steps).
struct DecodeCallTimes {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  double gpu_median_ms = 0;  // the median of the calls' GPU time; 0 without a GPU
};
DecodeCallTimes SummarizeDecodeCalls(const GenerationStats& stats);

using TokenCallback = std::function<void(inference::RequestId, inference::TokenId)>;

class Generator {
 public:
  // InvalidArgument for weights that do not match LlamaWeights(config), or options that
  // cannot work.
  static absl::StatusOr<std::unique_ptr<Generator>> Create(const ModelConfig& config, std::vector<HostTensor> weights,
                                                           const GeneratorOptions& options);

  // The scheduler's checks: an empty prompt, a token outside the vocabulary, prompt +
  // max_new_tokens beyond max_context, bad sampling values, a duplicate id, a request that
  // could not fit the pool are InvalidArgument naming the request, and change nothing.
  absl::Status Submit(inference::GenerationRequest request);

  // One scheduled step; returns the requests it finished (empty when nothing is left).
  // Requests are checked at Submit, so an error here is internal (a function that failed to
  // compile or evaluate): the pools are left as they were, but the scheduler's step stays
  // open, and the Generator should be dropped.
  absl::StatusOr<std::vector<inference::FinishedRequest>> Step(const TokenCallback& on_token = nullptr);
  // Steps until no request is left; the finished requests in the order they finished.
  absl::StatusOr<std::vector<inference::FinishedRequest>> Run(const TokenCallback& on_token = nullptr);

  const GenerationStats& stats() const { return stats_; }
  const inference::Scheduler& scheduler() const { return *scheduler_; }
  int64_t max_context() const { return max_context_; }
  const PagedKvLayout& layout() const { return layout_; }
  // The profiled @decode call's launches (GeneratorOptions::profile_decode_call), and its batch
  // bucket; empty before that call, or on the CPU.
  const std::vector<StepTiming>& decode_profile() const { return decode_profile_; }
  int64_t decode_profile_bucket() const { return decode_profile_bucket_; }
  // The profiled prefill call's launches (GeneratorOptions::profile_prefill_call), and its
  // function's shape; empty before that call, or on the CPU.
  const std::vector<StepTiming>& prefill_profile() const { return prefill_profile_; }
  const InferenceShape& prefill_profile_shape() const { return prefill_profile_shape_; }
  ~Generator();

 private:
  Generator(const ModelConfig& config, const GeneratorOptions& options);

  absl::StatusOr<const Function*> FunctionFor(const InferenceShape& shape);
  // A call's row to read a token from: the row, its request, and the position of the token
  // whose next-token logits it holds.
  struct RowToRead {
    size_t row;
    inference::RequestId request;
    int64_t position;
  };
  // Each row's token as the function drew it (its sample_tokens output), the logits handed to
  // on_logits first; InvalidArgument naming the request where none could be drawn (NaN or
  // +inf logits, or all -inf).
  absl::StatusOr<std::vector<inference::TokenId>> ReadTokens(const InferenceEngine::Rows& picked,
                                                             absl::Span<const RowToRead> rows);
  absl::StatusOr<std::vector<inference::SampledToken>> RunPrefills(const inference::ScheduledStep& step);
  absl::StatusOr<std::vector<inference::SampledToken>> RunDecodes(const inference::ScheduledStep& step);
  // The inputs of the step after `step` (packed as `batch`) as the lookahead assumes them, or
  // nullopt where it cannot start that step now (GeneratorOptions::decode_lookahead).
  std::optional<inference::DecodeBatch> LookaheadBatch(const inference::ScheduledStep& step,
                                                       const inference::DecodeBatch& batch, bool with_logits) const;
  // Waits for the decode call started ahead, if any, and forgets it.
  absl::Status DropLookahead();

  ModelConfig config_;
  GeneratorOptions options_;
  PagedKvLayout layout_;
  int64_t max_context_ = 0;
  std::optional<inference::Scheduler> scheduler_;
  std::unique_ptr<InferenceEngine> engine_;  // the weights and the pools
  std::map<InferenceShape, std::unique_ptr<Module>> compiled_;
  GenerationStats stats_;
  std::vector<StepTiming> decode_profile_;
  int64_t decode_profile_bucket_ = 0;
  std::vector<StepTiming> prefill_profile_;
  InferenceShape prefill_profile_shape_;
  // The decode call in flight for the next step (GeneratorOptions::decode_lookahead): its
  // bucket and inputs, tokens included once the call before it has handed them back.
  struct Lookahead {
    int64_t bucket = 0;
    inference::DecodeBatch batch;
  };
  std::optional<Lookahead> lookahead_;
  // When the last decode step's tokens came back, while steps keep decoding and nothing else.
  std::optional<std::chrono::steady_clock::time_point> last_decode_end_;
};

// The prefill size a context of `num_tokens` uncached tokens is padded to: the next power of
// two, at least 1.
int64_t PrefillBucket(int64_t num_tokens);

// One prefill call: its function's shape and the prefills it runs, one a row (indices into
// the step's prefills, in their order; rows past them are padding).
struct PrefillCall {
  InferenceShape shape;
  std::vector<size_t> prefills;
};

// How a step's prefills run, in order. A prompt with nothing cached and at least
// `fresh_min_tokens` uncached tokens (0: none) is @fresh_prefill's, any other @prefill's.
// Prompts of one function and one bucket share a call, `call_tokens` tokens at most (rows x
// bucket; at least one row), in a power of two of rows, no padding rows. A prompt whose
// table holds a block that an earlier prompt of the step also holds (the prefix it found
// cached: marked computed at admission, written by that prompt's call) runs in that prompt's
// call or a later one: a call writes every row's K/V of a layer before any row's attention
// of that layer reads it, so the prefix is written before it is read.
std::vector<PrefillCall> PlanPrefillCalls(absl::Span<const inference::PrefillWork> prefills, int64_t block_size,
                                          int64_t call_tokens, int64_t fresh_min_tokens);

}  // namespace kiln
