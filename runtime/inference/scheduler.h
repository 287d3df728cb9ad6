// Continuous batching over the paged KV pool (DESIGN.md, "The inference lowering"): which
// requests run in each step, which of them prefill and which decode, and where their K/V
// lives. The scheduler decides; it runs nothing. A caller drives it:
//
//   Submit(request)...           rejected at once (and harmlessly) if it can never run
//   loop:
//     step = Schedule()          block copies, prefills, decodes (with their block tables)
//     run step.block_copies, then the prefills and the decode batch (padded to
//     step.decode_bucket) on the device; sample one token per prefill and per decode
//     finished = CompleteStep(tokens)
//
// Each step, running requests come first: every one reserves the slot of the token it
// decodes next. When the pool is out of blocks, the most recently admitted running request
// is preempted (its blocks freed, the request put back at the front of the waiting queue to
// be recomputed later, its output kept) rather than failing anyone; the prefix cache keeps
// its computed blocks, so the recompute is mostly hits. Then, unless someone was preempted in
// this step, waiting requests are admitted in order while their blocks fit, the running set
// is below max_running and the step's prefill token budget lasts. A request is retired in
// CompleteStep as soon as it samples EOS or its max_new_tokens-th token.
//
// Submission refuses what could never complete: an empty prompt, a token outside the
// vocabulary, prompt + max_new_tokens beyond the model's context, bad sampling values, and
// a request whose prompt and output could not fit in the whole pool even running alone. So
// every admitted request can finish, and preemption never livelocks.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/inference/block_manager.h"
#include "runtime/inference/inference_types.h"
#include "runtime/inference/sampler.h"

namespace kiln::inference {

struct SchedulerOptions {
  int64_t vocab_size = 0;
  int64_t max_context = 0;   // the model's: prompt + output tokens of one sequence, at most
  int64_t max_running = 64;  // running requests at most (the largest decode bucket)
  // Uncached prompt tokens prefilled per step; the first prefill of a step may exceed it
  // (or a long prompt would never run).
  int64_t max_prefill_tokens = 8192;
  std::optional<TokenId> eos_token;  // none: requests stop at max_new_tokens only
};

struct GenerationRequest {
  RequestId id = 0;
  std::vector<TokenId> prompt;
  int64_t max_new_tokens = 0;  // >= 1
  SamplingParams sampling;
};

enum class FinishReason { kEos, kMaxNewTokens, kAborted };

struct FinishedRequest {
  RequestId id = 0;
  std::vector<TokenId> output;  // the sampled tokens, EOS included when it ended the request
  FinishReason reason = FinishReason::kMaxNewTokens;
  int64_t num_preemptions = 0;
};

// Compute the K/V of tokens[num_cached_tokens, end) at those positions into the blocks of
// `block_table` (attention also reads the cached ones), and the logits of the last token.
struct PrefillWork {
  RequestId request = 0;
  // The whole context: the prompt, plus the output so far when a preempted request is
  // recomputed.
  std::vector<TokenId> tokens;
  int64_t num_cached_tokens = 0;  // their K/V is in the blocks already (prefix cache)
  std::vector<BlockId> block_table;
  SamplingParams sampling;
  int64_t draw = 0;  // the sampler's draw index for the token this prefill yields
};

// Decode one token: `token` at `position`, its K/V written to slot `position` of
// `block_table`, attention over positions [0, position].
struct DecodeWork {
  RequestId request = 0;
  TokenId token = 0;
  int64_t position = 0;
  std::vector<BlockId> block_table;
  SamplingParams sampling;
  int64_t draw = 0;            // tokens the request has sampled so far
  int64_t max_new_tokens = 0;  // the request's: it ends after this step when draw + 1 reaches it
};

struct ScheduledStep {
  std::vector<BlockCopy> block_copies;  // to run before any prefill or decode of the step
  // To run one after another in this order: a prefill may reuse, as its cached prefix, full
  // blocks of an earlier prefill of the same step (a burst of requests sharing a prompt's
  // start computes it once), so each must have written its K/V before the next one reads.
  std::vector<PrefillWork> prefills;
  std::vector<DecodeWork> decodes;      // oldest admitted first
  int64_t decode_bucket = 0;            // decodes.size() rounded up to its batch bucket; 0 for none
  std::vector<RequestId> preempted;     // sent back to the waiting queue in this step

  bool empty() const { return prefills.empty() && decodes.empty(); }
};

// The token sampled for one request of the step.
struct SampledToken {
  RequestId request = 0;
  TokenId token = 0;
};

class Scheduler {
 public:
  // InvalidArgument for options that cannot work (no vocabulary, no context, an EOS outside
  // the vocabulary, limits below 1).
  static absl::StatusOr<Scheduler> Create(const SchedulerOptions& options, BlockManager pool);

  // Queues a request. Rejects it (InvalidArgument, AlreadyExists for an id in use), changing
  // nothing, as the header comment lists.
  absl::Status Submit(GenerationRequest request);

  // The next step. FailedPrecondition while the previous step awaits CompleteStep. An empty
  // step means there is nothing to do (no request is waiting or running).
  absl::StatusOr<ScheduledStep> Schedule();

  // One token for every request the step scheduled (any order). Retires the requests that
  // are done and returns them. InvalidArgument, changing nothing, for a missing, extra or
  // repeated request or a token outside the vocabulary.
  absl::StatusOr<std::vector<FinishedRequest>> CompleteStep(absl::Span<const SampledToken> tokens);

  // Starts request `child` as a copy of running request `parent` (same context and output,
  // sharing its blocks), to sample a different continuation with `sampling`. Between steps
  // only.
  absl::Status Fork(RequestId parent, RequestId child, const SamplingParams& sampling);

  // Drops a waiting or running request, freeing its blocks. Between steps only.
  absl::StatusOr<FinishedRequest> Abort(RequestId id);

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  bool HasUnfinishedRequests() const { return !requests_.empty(); }
  const BlockManager& block_manager() const { return pool_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  struct RequestState {
    GenerationRequest request;
    std::vector<TokenId> output;
    int64_t num_preemptions = 0;
  };

  Scheduler(const SchedulerOptions& options, BlockManager pool);

  std::vector<TokenId> Context(const RequestState& r) const;
  void Preempt(RequestId id, ScheduledStep& step);
  absl::Status ReserveDecodes(ScheduledStep& step);
  absl::Status AdmitWaiting(ScheduledStep& step);
  absl::Status ValidateCompletion(absl::Span<const SampledToken> tokens) const;

  SchedulerOptions options_;
  BlockManager pool_;
  absl::flat_hash_map<RequestId, RequestState> requests_;  // every unfinished request
  std::deque<RequestId> waiting_;                          // admitted from the front
  std::vector<RequestId> running_;                         // oldest admitted first
  bool step_in_flight_ = false;
  std::vector<RequestId> in_flight_;  // the requests the step in flight owes a token
};

// Decode batch buckets: 1, 2, 4, ... up to the first power of two >= max_batch (a decode
// CUDA graph is captured per bucket, and a batch is padded to the smallest that holds it).
std::vector<int64_t> DecodeBatchBuckets(int64_t max_batch);

// The smallest of `buckets` (ascending) that holds `batch`. InvalidArgument when batch < 1
// or no bucket is large enough.
absl::StatusOr<int64_t> BucketFor(int64_t batch, absl::Span<const int64_t> buckets);

// A decode batch as the device's fixed-shape buffers want it: `bucket` rows, the padding
// rows after the real ones. A padding row has context length 0 and slot -1: kernels must
// neither read K/V for it nor write any (slot -1: write nothing).
struct DecodeBatch {
  int64_t bucket = 0;
  int64_t max_blocks_per_sequence = 0;
  std::vector<int32_t> tokens;           // [bucket]
  std::vector<int32_t> positions;        // [bucket]
  std::vector<int32_t> context_lengths;  // [bucket]: position + 1; 0 for padding
  std::vector<int32_t> slots;            // [bucket]: block * block_size + offset of the new K/V; -1 for padding
  std::vector<int32_t> block_tables;     // [bucket, max_blocks_per_sequence], -1 past a table's end
  // [bucket, 3] each: the rows' sampling operands (ir/token_sampling.h's TokenSamplingOperands;
  // padding rows greedy).
  std::vector<float> sampling;
  std::vector<int32_t> draws;
};

// InvalidArgument when there are more decodes than `bucket`, a table is longer than
// max_blocks_per_sequence or does not cover its position, or a slot does not fit in int32.
absl::StatusOr<DecodeBatch> PackDecodeBatch(absl::Span<const DecodeWork> decodes, int64_t bucket, int64_t block_size,
                                            int64_t max_blocks_per_sequence);

}  // namespace kiln::inference
