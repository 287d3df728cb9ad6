#include "runtime/inference/scheduler.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln::inference {

absl::StatusOr<Scheduler> Scheduler::Create(const SchedulerOptions& options, BlockManager pool) {
  auto at_least_one = [](const char* name, int64_t value) -> absl::Status {
    if (value >= 1) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("scheduler: ", name, " is ", value, "; it must be at least 1"));
  };
  RETURN_IF_ERROR(at_least_one("vocab_size", options.vocab_size));
  RETURN_IF_ERROR(at_least_one("max_context", options.max_context));
  RETURN_IF_ERROR(at_least_one("max_running", options.max_running));
  RETURN_IF_ERROR(at_least_one("max_prefill_tokens", options.max_prefill_tokens));
  if (options.vocab_size > int64_t{std::numeric_limits<TokenId>::max()} + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler: vocab_size is ", options.vocab_size, ": more than a token id can name"));
  }
  if (options.eos_token.has_value() && (*options.eos_token < 0 || *options.eos_token >= options.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat("scheduler: eos_token ", *options.eos_token,
                                                   " is outside the vocabulary [0, ", options.vocab_size, ")"));
  }
  if (pool.num_sequences() != 0) {
    return absl::InvalidArgumentError("scheduler: the block manager must start with no sequences");
  }
  return Scheduler(options, std::move(pool));
}

Scheduler::Scheduler(const SchedulerOptions& options, BlockManager pool) : options_(options), pool_(std::move(pool)) {}

absl::Status Scheduler::Submit(GenerationRequest request) {
  const RequestId id = request.id;
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", id, ": the id is in use by an unfinished request"));
  }
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  if (prompt_tokens == 0) return absl::InvalidArgumentError(absl::StrCat("request ", id, ": the prompt is empty"));
  for (int64_t i = 0; i < prompt_tokens; ++i) {
    const TokenId t = request.prompt[i];
    if (t < 0 || t >= options_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("request ", id, ": prompt token ", i, " is ", t,
                                                     ", outside the vocabulary [0, ", options_.vocab_size, ")"));
    }
  }
  if (request.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": max_new_tokens is ", request.max_new_tokens, "; it must be at least 1"));
  }
  if (request.max_new_tokens > options_.max_context - prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": ", prompt_tokens, " prompt tokens + ",
                                                   request.max_new_tokens, " new tokens exceed the model's context of ",
                                                   options_.max_context));
  }
  if (absl::Status s = ValidateSamplingParams(request.sampling); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": ", s.message()));
  }
  // The last output token is never fed back, so a request holds at most this many slots.
  const int64_t most_tokens = prompt_tokens + request.max_new_tokens - 1;
  const int64_t prompt_blocks = pool_.BlocksForTokens(prompt_tokens);
  const int64_t most_blocks = pool_.BlocksForTokens(most_tokens);
  if (most_blocks > pool_.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", id, " can never fit in the KV pool: ",
        prompt_blocks > pool_.num_blocks()
            ? absl::StrCat("its ", prompt_tokens, " prompt tokens need ", prompt_blocks, " blocks")
            : absl::StrCat("its ", prompt_tokens, " prompt tokens and up to ", request.max_new_tokens - 1,
                           " fed-back output tokens need ", most_blocks, " blocks"),
        " of ", pool_.block_size(), " tokens; the pool has ", pool_.num_blocks()));
  }
  waiting_.push_back(id);
  requests_.emplace(id, RequestState{std::move(request), {}, 0});
  return absl::OkStatus();
}

std::vector<TokenId> Scheduler::Context(const RequestState& r) const {
  std::vector<TokenId> context = r.request.prompt;
  context.insert(context.end(), r.output.begin(), r.output.end());
  return context;
}

void Scheduler::Preempt(RequestId id, ScheduledStep& step) {
  KILN_CHECK(!running_.empty() && running_.back() == id);
  KILN_CHECK(pool_.FreeSequence(id).ok());
  running_.pop_back();
  waiting_.push_front(id);  // victims are taken newest first, so the front keeps admission order
  ++requests_.at(id).num_preemptions;
  step.preempted.push_back(id);
}

absl::Status Scheduler::ReserveDecodes(ScheduledStep& step) {
  for (size_t i = 0; i < running_.size(); ++i) {
    const RequestId id = running_[i];
    bool preempted_itself = false;
    while (!pool_.CanAppend(id)) {
      // Out of blocks: the newest request gives way, so that the older ones progress.
      const RequestId victim = running_.back();
      Preempt(victim, step);
      if (victim == id) {
        preempted_itself = true;
        break;
      }
    }
    if (preempted_itself) break;  // it was the newest: nobody after it is left to reserve for
    const RequestState& r = requests_.at(id);
    const TokenId token = r.output.back();
    ASSIGN_OR_RETURN(std::optional<BlockCopy> copy, pool_.AppendToken(id, token));
    if (copy.has_value()) step.block_copies.push_back(*copy);
    ASSIGN_OR_RETURN(absl::Span<const BlockId> table, pool_.BlockTable(id));
    const int64_t position = static_cast<int64_t>(r.request.prompt.size() + r.output.size()) - 1;
    step.decodes.push_back(DecodeWork{id, token, position, std::vector<BlockId>(table.begin(), table.end()),
                                      r.request.sampling, static_cast<int64_t>(r.output.size()),
                                      r.request.max_new_tokens});
  }
  return absl::OkStatus();
}

absl::Status Scheduler::AdmitWaiting(ScheduledStep& step) {
  int64_t prefill_tokens = 0;
  while (!waiting_.empty() && num_running() < options_.max_running) {
    const RequestId id = waiting_.front();
    const RequestState& r = requests_.at(id);
    const std::vector<TokenId> context = Context(r);
    const BlockManager::AllocationPlan plan = pool_.PlanAllocation(context);
    const int64_t to_prefill = static_cast<int64_t>(context.size()) - plan.num_cached_tokens;
    if (!step.prefills.empty() && prefill_tokens + to_prefill > options_.max_prefill_tokens) break;
    // First come, first served: a request that does not fit now waits for blocks, and the
    // ones behind it wait too (skipping it could starve it).
    if (!pool_.CanAllocate(context)) break;
    ASSIGN_OR_RETURN(const int64_t cached, pool_.AllocateSequence(id, context));
    // Its prefill runs before any later prefill of this step (ScheduledStep::prefills), so
    // its blocks will hold their K/V by the time a later admission could read them.
    RETURN_IF_ERROR(pool_.MarkComputed(id, static_cast<int64_t>(context.size())));
    ASSIGN_OR_RETURN(absl::Span<const BlockId> table, pool_.BlockTable(id));
    prefill_tokens += static_cast<int64_t>(context.size()) - cached;
    step.prefills.push_back(PrefillWork{id, context, cached, std::vector<BlockId>(table.begin(), table.end()),
                                        r.request.sampling, static_cast<int64_t>(r.output.size())});
    waiting_.pop_front();
    running_.push_back(id);
  }
  return absl::OkStatus();
}

absl::StatusOr<ScheduledStep> Scheduler::Schedule() {
  if (step_in_flight_) {
    return absl::FailedPreconditionError("scheduler: the previous step has not been completed (CompleteStep)");
  }
  ScheduledStep step;
  RETURN_IF_ERROR(ReserveDecodes(step));
  // A step that had to preempt has no blocks to spare: admitting now would only preempt again.
  if (step.preempted.empty()) RETURN_IF_ERROR(AdmitWaiting(step));
  if (!step.decodes.empty()) {
    ASSIGN_OR_RETURN(step.decode_bucket,
                     BucketFor(static_cast<int64_t>(step.decodes.size()), DecodeBatchBuckets(options_.max_running)));
  }
  in_flight_.clear();
  for (const PrefillWork& p : step.prefills) in_flight_.push_back(p.request);
  for (const DecodeWork& d : step.decodes) in_flight_.push_back(d.request);
  step_in_flight_ = !in_flight_.empty();
  return step;
}

absl::Status Scheduler::ValidateCompletion(absl::Span<const SampledToken> tokens) const {
  if (!step_in_flight_) return absl::FailedPreconditionError("scheduler: no step to complete (call Schedule first)");
  const absl::flat_hash_set<RequestId> owed(in_flight_.begin(), in_flight_.end());
  absl::flat_hash_set<RequestId> seen;
  for (const SampledToken& s : tokens) {
    if (!owed.contains(s.request)) {
      return absl::InvalidArgumentError(absl::StrCat("scheduler: request ", s.request, " was not in the step"));
    }
    if (!seen.insert(s.request).second) {
      return absl::InvalidArgumentError(absl::StrCat("scheduler: request ", s.request, " has two tokens in the step"));
    }
    if (s.token < 0 || s.token >= options_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("scheduler: request ", s.request, " sampled token ", s.token,
                                                     ", outside the vocabulary [0, ", options_.vocab_size, ")"));
    }
  }
  if (seen.size() != owed.size()) {
    for (RequestId id : in_flight_) {
      if (!seen.contains(id)) {
        return absl::InvalidArgumentError(absl::StrCat("scheduler: request ", id, " has no token for the step"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FinishedRequest>> Scheduler::CompleteStep(absl::Span<const SampledToken> tokens) {
  RETURN_IF_ERROR(ValidateCompletion(tokens));
  std::vector<FinishedRequest> finished;
  for (const SampledToken& s : tokens) {
    RequestState& r = requests_.at(s.request);
    // The step wrote every reserved slot's K/V: its full blocks may now serve other prompts.
    ASSIGN_OR_RETURN(absl::Span<const TokenId> held, pool_.Tokens(s.request));
    RETURN_IF_ERROR(pool_.MarkComputed(s.request, static_cast<int64_t>(held.size())));
    r.output.push_back(s.token);
    std::optional<FinishReason> reason;
    if (options_.eos_token.has_value() && s.token == *options_.eos_token) {
      reason = FinishReason::kEos;
    } else if (static_cast<int64_t>(r.output.size()) >= r.request.max_new_tokens) {
      reason = FinishReason::kMaxNewTokens;
    }
    if (!reason.has_value()) continue;
    RETURN_IF_ERROR(pool_.FreeSequence(s.request));
    running_.erase(std::find(running_.begin(), running_.end(), s.request));
    finished.push_back(FinishedRequest{s.request, std::move(r.output), *reason, r.num_preemptions});
    requests_.erase(s.request);
  }
  step_in_flight_ = false;
  in_flight_.clear();
  return finished;
}

absl::Status Scheduler::Fork(RequestId parent, RequestId child, const SamplingParams& sampling) {
  if (step_in_flight_) return absl::FailedPreconditionError("scheduler: Fork between steps only");
  if (std::find(running_.begin(), running_.end(), parent) == running_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("scheduler: cannot fork request ", parent, ": it is not running"));
  }
  if (requests_.contains(child)) {
    return absl::AlreadyExistsError(absl::StrCat("scheduler: cannot fork into request ", child, ": the id is in use"));
  }
  RETURN_IF_ERROR(ValidateSamplingParams(sampling));
  RETURN_IF_ERROR(pool_.Fork(parent, child));
  RequestState state = requests_.at(parent);
  state.request.id = child;
  state.request.sampling = sampling;
  state.num_preemptions = 0;
  requests_.emplace(child, std::move(state));
  running_.push_back(child);
  return absl::OkStatus();
}

absl::StatusOr<FinishedRequest> Scheduler::Abort(RequestId id) {
  if (step_in_flight_) return absl::FailedPreconditionError("scheduler: Abort between steps only");
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("scheduler: no unfinished request ", id));
  if (auto r = std::find(running_.begin(), running_.end(), id); r != running_.end()) {
    RETURN_IF_ERROR(pool_.FreeSequence(id));
    running_.erase(r);
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  }
  FinishedRequest done{id, std::move(it->second.output), FinishReason::kAborted, it->second.num_preemptions};
  requests_.erase(it);
  return done;
}

std::vector<int64_t> DecodeBatchBuckets(int64_t max_batch) {
  std::vector<int64_t> buckets;
  for (int64_t b = 1;; b *= 2) {
    buckets.push_back(b);
    if (b >= max_batch) break;
  }
  return buckets;
}

absl::StatusOr<int64_t> BucketFor(int64_t batch, absl::Span<const int64_t> buckets) {
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch buckets: a batch of ", batch, " sequences"));
  for (int64_t b : buckets) {
    if (b >= batch) return b;
  }
  return absl::InvalidArgumentError(absl::StrCat("batch buckets: a batch of ", batch, " exceeds the largest bucket, ",
                                                 buckets.empty() ? 0 : buckets.back()));
}

absl::StatusOr<DecodeBatch> PackDecodeBatch(absl::Span<const DecodeWork> decodes, int64_t bucket, int64_t block_size,
                                            int64_t max_blocks_per_sequence) {
  if (static_cast<int64_t>(decodes.size()) > bucket) {
    return absl::InvalidArgumentError(absl::StrCat("decode batch: ", decodes.size(), " sequences do not fit bucket ", bucket));
  }
  if (block_size < 1 || max_blocks_per_sequence < 1) {
    return absl::InvalidArgumentError(absl::StrCat("decode batch: block_size ", block_size,
                                                   " and max_blocks_per_sequence ", max_blocks_per_sequence,
                                                   " must be at least 1"));
  }
  DecodeBatch batch;
  batch.bucket = bucket;
  batch.max_blocks_per_sequence = max_blocks_per_sequence;
  batch.tokens.assign(bucket, 0);
  batch.positions.assign(bucket, 0);
  batch.context_lengths.assign(bucket, 0);
  batch.slots.assign(bucket, -1);
  batch.block_tables.assign(bucket * max_blocks_per_sequence, -1);
  const TokenSamplingOperands padding = ToOperands(TokenSampling{.temperature = 0});
  for (int64_t row = 0; row < bucket; ++row) {
    batch.sampling.insert(batch.sampling.end(), padding.sampling, padding.sampling + 3);
    batch.draws.insert(batch.draws.end(), padding.draws, padding.draws + 3);
  }
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  for (size_t row = 0; row < decodes.size(); ++row) {
    const DecodeWork& d = decodes[row];
    const int64_t blocks = static_cast<int64_t>(d.block_table.size());
    if (blocks > max_blocks_per_sequence) {
      return absl::InvalidArgumentError(absl::StrCat("decode batch: request ", d.request, " holds ", blocks,
                                                     " blocks; the batch allows ", max_blocks_per_sequence));
    }
    if (d.position < 0 || d.position / block_size >= blocks) {
      return absl::InvalidArgumentError(absl::StrCat("decode batch: request ", d.request, "'s ", blocks,
                                                     " blocks do not hold position ", d.position));
    }
    const int64_t slot = int64_t{d.block_table[d.position / block_size]} * block_size + d.position % block_size;
    if (slot > kInt32Max || d.position + 1 > kInt32Max) {
      return absl::InvalidArgumentError(absl::StrCat("decode batch: request ", d.request, "'s slot ", slot,
                                                     " does not fit in int32"));
    }
    batch.tokens[row] = d.token;
    batch.positions[row] = static_cast<int32_t>(d.position);
    batch.context_lengths[row] = static_cast<int32_t>(d.position + 1);
    batch.slots[row] = static_cast<int32_t>(slot);
    std::copy(d.block_table.begin(), d.block_table.end(), batch.block_tables.begin() + row * max_blocks_per_sequence);
    const TokenSamplingOperands operands = ToOperands(ToTokenSampling(d.sampling, d.draw));
    std::copy(operands.sampling, operands.sampling + 3, batch.sampling.begin() + 3 * row);
    std::copy(operands.draws, operands.draws + 3, batch.draws.begin() + 3 * row);
  }
  return batch;
}

}  // namespace kiln::inference
