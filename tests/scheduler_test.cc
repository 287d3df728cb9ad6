// The continuous-batching scheduler (runtime/inference/scheduler.h): admission while blocks
// are free, retirement at EOS and max_new_tokens, preemption of the newest request when the
// pool runs out (and no running request failed), the submission checks, the prefix cache
// seen from a step, fork's copy-on-write, and decode batches padded to their bucket.
//
// A fake device runs the steps: its KV pool records, per slot, which token's K/V it holds;
// a prefill checks that the cached prefix is really there and writes the rest, a decode
// writes its slot and reads its whole context back through its block table, and the "model"
// computes logits from the context read back. So a wrong block table, a missed block copy
// or a false prefix hit changes the tokens or fails a check.
#include "runtime/inference/scheduler.h"

#include <gtest/gtest.h>

#include <map>

#include "absl/strings/match.h"

namespace kiln::inference {
namespace {

constexpr int64_t kVocab = 50;

BlockManager MakePool(int64_t num_blocks, int64_t block_size) {
  absl::StatusOr<BlockManager> pool = BlockManager::Create({.num_blocks = num_blocks, .block_size = block_size});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

Scheduler MakeScheduler(int64_t num_blocks, int64_t block_size, SchedulerOptions options = {}) {
  if (options.vocab_size == 0) options.vocab_size = kVocab;
  if (options.max_context == 0) options.max_context = 256;
  absl::StatusOr<Scheduler> s = Scheduler::Create(options, MakePool(num_blocks, block_size));
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

std::vector<TokenId> Prompt(int64_t n, TokenId first = 1) {
  std::vector<TokenId> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<TokenId>((first + i) % kVocab);
  return tokens;
}

GenerationRequest Request(RequestId id, std::vector<TokenId> prompt, int64_t max_new_tokens,
                          SamplingParams sampling = {.temperature = 1.0, .seed = 0}) {
  if (sampling.seed == 0) sampling.seed = 1000 + id;
  return GenerationRequest{id, std::move(prompt), max_new_tokens, sampling};
}

std::vector<RequestId> Ids(const std::vector<PrefillWork>& prefills) {
  std::vector<RequestId> ids;
  for (const PrefillWork& p : prefills) ids.push_back(p.request);
  return ids;
}

std::vector<RequestId> Ids(const std::vector<DecodeWork>& decodes) {
  std::vector<RequestId> ids;
  for (const DecodeWork& d : decodes) ids.push_back(d.request);
  return ids;
}

// The model: logits that depend on the whole context (a hash of it).
std::vector<float> Logits(const std::vector<TokenId>& context) {
  uint64_t h = 1469598103934665603ULL;
  for (TokenId t : context) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ULL;
  std::vector<float> logits(kVocab);
  for (int64_t v = 0; v < kVocab; ++v) {
    uint64_t x = h + 0x9e3779b97f4a7c15ULL * (v + 1);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    logits[v] = static_cast<float>(x % 1000) / 200.f;
  }
  return logits;
}

// Drives a scheduler through a fake device and checks every step against its own record
// of each request's context.
class Harness {
 public:
  explicit Harness(Scheduler scheduler) : s_(std::move(scheduler)) {
    const BlockManager& pool = s_.block_manager();
    kv_.assign(pool.num_blocks(), std::vector<TokenId>(pool.block_size(), -1));
  }

  absl::Status Submit(const GenerationRequest& r) {
    absl::Status status = s_.Submit(r);
    if (status.ok()) context_[r.id] = r.prompt, prompt_size_[r.id] = r.prompt.size();
    return status;
  }
  absl::Status Fork(RequestId parent, RequestId child, const SamplingParams& sampling) {
    absl::Status status = s_.Fork(parent, child, sampling);
    if (status.ok()) {
      context_[child] = context_[parent];
      prompt_size_[child] = prompt_size_[parent];
      running_.push_back(child);
    }
    return status;
  }
  const std::map<RequestId, FinishedRequest>& finished() const { return finished_; }
  int64_t preemptions() const { return preemptions_; }
  int64_t block_copies() const { return copies_; }
  int64_t cached_tokens() const { return cached_tokens_; }
  const std::vector<ScheduledStep>& steps() const { return steps_; }

  // One step; returns false when there was nothing to do.
  bool Step() {
    absl::StatusOr<ScheduledStep> step = s_.Schedule();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok() || step->empty()) return false;
    // The victims are the newest running requests, newest first.
    for (RequestId victim : step->preempted) {
      EXPECT_FALSE(running_.empty());
      if (running_.empty()) return false;
      EXPECT_EQ(victim, running_.back()) << "preempted a request that was not the newest";
      running_.pop_back();
      ++preemptions_;
    }
    const int64_t bs = s_.block_manager().block_size();
    for (const BlockCopy& c : step->block_copies) {
      std::copy(kv_[c.src].begin(), kv_[c.src].begin() + c.num_tokens, kv_[c.dst].begin());
      ++copies_;
    }
    std::vector<SampledToken> sampled;
    for (const PrefillWork& p : step->prefills) {
      running_.push_back(p.request);
      EXPECT_EQ(p.tokens, context_[p.request]) << "request " << p.request;
      EXPECT_EQ(p.draw, static_cast<int64_t>(context_[p.request].size() - prompt_size_[p.request]));
      EXPECT_EQ(static_cast<int64_t>(p.block_table.size()), (static_cast<int64_t>(p.tokens.size()) + bs - 1) / bs);
      for (int64_t pos = 0; pos < static_cast<int64_t>(p.tokens.size()); ++pos) {
        TokenId& slot = kv_[p.block_table[pos / bs]][pos % bs];
        if (pos < p.num_cached_tokens) {
          EXPECT_EQ(slot, p.tokens[pos]) << "a cached block does not hold position " << pos;
        } else {
          slot = p.tokens[pos];
        }
      }
      cached_tokens_ += p.num_cached_tokens;
      sampled.push_back({p.request, Sample(ReadBack(p.block_table, p.tokens.size()), p.sampling, p.draw)});
    }
    EXPECT_EQ(step->decode_bucket, step->decodes.empty() ? 0 : BucketFor(step->decodes.size(), DecodeBatchBuckets(64)).value());
    for (const DecodeWork& d : step->decodes) {
      const std::vector<TokenId>& context = context_[d.request];
      EXPECT_EQ(d.token, context.back());
      EXPECT_EQ(d.position, static_cast<int64_t>(context.size()) - 1);
      EXPECT_EQ(d.draw, static_cast<int64_t>(context.size() - prompt_size_[d.request]));
      kv_[d.block_table[d.position / bs]][d.position % bs] = d.token;
      const std::vector<TokenId> read = ReadBack(d.block_table, d.position + 1);
      EXPECT_EQ(read, context) << "request " << d.request << " reads other K/V through its block table";
      sampled.push_back({d.request, Sample(read, d.sampling, d.draw)});
    }
    absl::StatusOr<std::vector<FinishedRequest>> done = s_.CompleteStep(sampled);
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok()) return false;
    for (const SampledToken& t : sampled) context_[t.request].push_back(t.token);
    for (FinishedRequest& f : *done) {
      const std::vector<TokenId>& context = context_[f.id];
      EXPECT_EQ(f.output, std::vector<TokenId>(context.begin() + prompt_size_[f.id], context.end()));
      running_.erase(std::find(running_.begin(), running_.end(), f.id));
      finished_[f.id] = std::move(f);
    }
    steps_.push_back(*std::move(step));
    return true;
  }

  void RunToCompletion(int64_t max_steps = 10000) {
    for (int64_t i = 0; i < max_steps && !::testing::Test::HasFailure(); ++i) {
      if (!Step()) break;
    }
    EXPECT_FALSE(s_.HasUnfinishedRequests());
    EXPECT_EQ(s_.block_manager().num_free_blocks(), s_.block_manager().num_blocks()) << "blocks leaked";
    EXPECT_TRUE(s_.block_manager().CheckInvariants().ok());
  }

 private:
  std::vector<TokenId> ReadBack(const std::vector<BlockId>& table, int64_t n) const {
    const int64_t bs = s_.block_manager().block_size();
    std::vector<TokenId> read;
    for (int64_t pos = 0; pos < n; ++pos) read.push_back(kv_[table[pos / bs]][pos % bs]);
    return read;
  }

  TokenId Sample(const std::vector<TokenId>& context, const SamplingParams& params, int64_t draw) {
    absl::StatusOr<TokenId> t = sampler_.Sample(Logits(context), params, draw);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.value_or(0);
  }

  Scheduler s_;
  Sampler sampler_;
  std::vector<std::vector<TokenId>> kv_;
  std::map<RequestId, std::vector<TokenId>> context_;
  std::map<RequestId, size_t> prompt_size_;
  std::vector<RequestId> running_;  // admission order, as the harness saw it
  std::map<RequestId, FinishedRequest> finished_;
  std::vector<ScheduledStep> steps_;
  int64_t preemptions_ = 0, copies_ = 0, cached_tokens_ = 0;
};

TEST(Scheduler, AdmitsWhatFitsThenDecodesAndRetiresAtMaxNewTokens) {
  Scheduler s = MakeScheduler(8, 4);
  for (RequestId id : {1, 2, 3}) ASSERT_TRUE(s.Submit(Request(id, Prompt(6, id), 3)).ok());
  ScheduledStep step = s.Schedule().value();
  EXPECT_EQ(Ids(step.prefills), (std::vector<RequestId>{1, 2, 3}));
  EXPECT_TRUE(step.decodes.empty());
  EXPECT_EQ(step.decode_bucket, 0);
  EXPECT_EQ(step.prefills[0].num_cached_tokens, 0);
  EXPECT_EQ(step.prefills[0].block_table.size(), 2u);
  EXPECT_EQ(s.block_manager().num_free_blocks(), 2);
  EXPECT_TRUE(s.CompleteStep({{1, 10}, {2, 11}, {3, 12}}).value().empty());

  step = s.Schedule().value();
  EXPECT_TRUE(step.prefills.empty());
  EXPECT_EQ(Ids(step.decodes), (std::vector<RequestId>{1, 2, 3}));
  EXPECT_EQ(step.decodes[0].token, 10);
  EXPECT_EQ(step.decodes[0].position, 6);
  EXPECT_EQ(step.decodes[0].draw, 1);
  EXPECT_EQ(step.decode_bucket, 4);
  EXPECT_TRUE(s.CompleteStep({{3, 22}, {1, 20}, {2, 21}}).value().empty());

  step = s.Schedule().value();
  std::vector<FinishedRequest> done = s.CompleteStep({{1, 30}, {2, 31}, {3, 32}}).value();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].id, 1);
  EXPECT_EQ(done[0].output, (std::vector<TokenId>{10, 20, 30}));
  EXPECT_EQ(done[0].reason, FinishReason::kMaxNewTokens);
  EXPECT_FALSE(s.HasUnfinishedRequests());
  EXPECT_EQ(s.block_manager().num_free_blocks(), 8);
  EXPECT_TRUE(s.Schedule().value().empty());
}

TEST(Scheduler, EosRetiresARequestAtOnceAndFreesItsBlocks) {
  Scheduler s = MakeScheduler(8, 4, {.eos_token = 0});
  ASSERT_TRUE(s.Submit(Request(1, Prompt(6), 10)).ok());
  ASSERT_TRUE(s.Submit(Request(2, Prompt(6, 20), 10)).ok());
  ASSERT_TRUE(s.Schedule().ok());
  ASSERT_TRUE(s.CompleteStep({{1, 5}, {2, 6}}).ok());
  ASSERT_TRUE(s.Schedule().ok());
  std::vector<FinishedRequest> done = s.CompleteStep({{1, 0}, {2, 7}}).value();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 1);
  EXPECT_EQ(done[0].reason, FinishReason::kEos);
  EXPECT_EQ(done[0].output, (std::vector<TokenId>{5, 0}));
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.block_manager().num_free_blocks(), 6);  // request 2's two blocks remain
  EXPECT_EQ(Ids(s.Schedule().value().decodes), (std::vector<RequestId>{2}));
}

TEST(Scheduler, AWaitingRequestIsAdmittedWhenBlocksFreeUp) {
  Scheduler s = MakeScheduler(4, 4);
  ASSERT_TRUE(s.Submit(Request(1, Prompt(12), 2)).ok());    // 3 blocks, then a 4th
  ASSERT_TRUE(s.Submit(Request(2, Prompt(8, 30), 2)).ok());  // 2 blocks: does not fit beside it
  ScheduledStep step = s.Schedule().value();
  EXPECT_EQ(Ids(step.prefills), (std::vector<RequestId>{1}));
  EXPECT_EQ(s.num_waiting(), 1);
  ASSERT_TRUE(s.CompleteStep({{1, 3}}).ok());
  step = s.Schedule().value();
  EXPECT_EQ(Ids(step.decodes), (std::vector<RequestId>{1}));
  EXPECT_TRUE(step.prefills.empty());
  ASSERT_EQ(s.CompleteStep({{1, 4}}).value().size(), 1u);  // request 1 is done
  step = s.Schedule().value();
  EXPECT_EQ(Ids(step.prefills), (std::vector<RequestId>{2}));
  EXPECT_EQ(s.num_waiting(), 0);
}

TEST(Scheduler, ThePrefillBudgetAndTheRunningLimitHoldAdmissionsBack) {
  Scheduler s = MakeScheduler(64, 4, {.max_running = 2, .max_prefill_tokens = 10});
  for (RequestId id : {1, 2, 3, 4}) ASSERT_TRUE(s.Submit(Request(id, Prompt(8, id * 10), 5)).ok());
  ScheduledStep step = s.Schedule().value();
  EXPECT_EQ(Ids(step.prefills), (std::vector<RequestId>{1}));  // 8 + 8 > 10
  ASSERT_TRUE(s.CompleteStep({{1, 1}}).ok());
  step = s.Schedule().value();
  EXPECT_EQ(Ids(step.prefills), (std::vector<RequestId>{2}));
  ASSERT_TRUE(s.CompleteStep({{1, 1}, {2, 1}}).ok());
  step = s.Schedule().value();
  EXPECT_TRUE(step.prefills.empty());  // two running: the limit
  EXPECT_EQ(s.num_waiting(), 2);
  // A prompt longer than the budget still runs, alone in its step.
  Scheduler t = MakeScheduler(64, 4, {.max_prefill_tokens = 10});
  ASSERT_TRUE(t.Submit(Request(1, Prompt(30), 2)).ok());
  ASSERT_TRUE(t.Submit(Request(2, Prompt(3), 2)).ok());
  EXPECT_EQ(Ids(t.Schedule().value().prefills), (std::vector<RequestId>{1}));
}

TEST(Scheduler, WhenThePoolRunsOutTheNewestRequestIsPreemptedAndEveryRequestFinishes) {
  // 6 blocks of 4 tokens; four requests that each grow to 15 tokens (4 blocks): they cannot
  // all run at once, so some are preempted and recomputed.
  auto run = [](int64_t num_blocks) {
    Harness h(MakeScheduler(num_blocks, 4));
    for (RequestId id : {1, 2, 3, 4}) EXPECT_TRUE(h.Submit(Request(id, Prompt(4, 7 * id), 12)).ok());
    h.RunToCompletion();
    return h;
  };
  Harness tight = run(6);
  EXPECT_GT(tight.preemptions(), 0) << "the pool never ran out: the test would prove nothing";
  ASSERT_EQ(tight.finished().size(), 4u);
  int64_t preempted = 0;
  for (const auto& [id, f] : tight.finished()) {
    EXPECT_EQ(f.reason, FinishReason::kMaxNewTokens) << "request " << id;
    EXPECT_EQ(f.output.size(), 12u);
    preempted += f.num_preemptions;
  }
  EXPECT_EQ(preempted, tight.preemptions());
  // A step that preempted admitted nobody.
  for (const ScheduledStep& step : tight.steps()) {
    if (!step.preempted.empty()) {
      EXPECT_TRUE(step.prefills.empty());
    }
  }
  // Preemption changes when tokens are computed, never which: the same outputs as a pool
  // large enough for everyone (sampled, with each request's seed and draw index).
  Harness roomy = run(64);
  EXPECT_EQ(roomy.preemptions(), 0);
  for (const auto& [id, f] : roomy.finished()) EXPECT_EQ(tight.finished().at(id).output, f.output) << "request " << id;
  // The recomputes reused the preempted requests' cached blocks.
  EXPECT_GT(tight.cached_tokens(), 0);
}

TEST(Scheduler, ManyRequestsThroughASmallPool) {
  Harness h(MakeScheduler(24, 4, {.max_running = 8, .eos_token = 3}));
  for (RequestId id = 1; id <= 40; ++id) {
    // Shared beginnings (the prefix cache) and varied lengths.
    std::vector<TokenId> prompt = Prompt(8 * (id % 3), 100);
    for (TokenId t : Prompt(1 + id % 11, 5 * id)) prompt.push_back(t);
    ASSERT_TRUE(h.Submit(Request(id, prompt, 4 + id % 17)).ok());
  }
  h.RunToCompletion();
  EXPECT_EQ(h.finished().size(), 40u);
  EXPECT_GT(h.preemptions(), 0);
  EXPECT_GT(h.cached_tokens(), 0);
  for (const auto& [id, f] : h.finished()) {
    if (f.reason == FinishReason::kEos) {
      EXPECT_EQ(f.output.back(), 3);
    } else {
      EXPECT_EQ(static_cast<int64_t>(f.output.size()), 4 + id % 17);
    }
  }
}

TEST(Scheduler, APromptSharingAComputedPrefixIsPrefilledFromWhereTheCacheEnds) {
  Harness h(MakeScheduler(32, 16));
  const std::vector<TokenId> prefix = Prompt(32, 3);
  std::vector<TokenId> b = prefix;
  for (TokenId t : Prompt(5, 40)) b.push_back(t);
  ASSERT_TRUE(h.Submit(Request(1, prefix, 4)).ok());
  ASSERT_TRUE(h.Step());  // request 1's prefill computes both its blocks
  ASSERT_TRUE(h.Submit(Request(2, b, 4)).ok());
  ASSERT_TRUE(h.Step());
  const PrefillWork& p = h.steps().back().prefills.at(0);
  EXPECT_EQ(p.request, 2);
  EXPECT_EQ(p.num_cached_tokens, 32);  // only its own 5 tokens are prefilled
  EXPECT_EQ(p.block_table[0], h.steps()[0].prefills[0].block_table[0]);
  EXPECT_EQ(p.block_table[1], h.steps()[0].prefills[0].block_table[1]);
  h.RunToCompletion();
}

// Prompts sharing a start, submitted together: the first prefill of the step computes the
// shared blocks and the later ones of the same step reuse them (the harness runs a step's
// prefills in order and checks every cached block holds its positions).
TEST(Scheduler, PrefillsOfOneStepShareAPrefixTheFirstOfThemComputes) {
  Harness h(MakeScheduler(32, 16));
  const std::vector<TokenId> prefix = Prompt(32, 3);
  for (RequestId id = 1; id <= 3; ++id) {
    std::vector<TokenId> prompt = prefix;
    for (TokenId t : Prompt(5, static_cast<TokenId>(40 * id))) prompt.push_back(t);
    ASSERT_TRUE(h.Submit(Request(id, prompt, 4)).ok());
  }
  ASSERT_TRUE(h.Step());
  const std::vector<PrefillWork>& prefills = h.steps().back().prefills;
  ASSERT_EQ(Ids(prefills), (std::vector<RequestId>{1, 2, 3}));
  EXPECT_EQ(prefills[0].num_cached_tokens, 0);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(prefills[i].num_cached_tokens, 32) << "request " << prefills[i].request;  // its own 5 tokens only
    EXPECT_EQ(prefills[i].block_table[0], prefills[0].block_table[0]);
    EXPECT_EQ(prefills[i].block_table[1], prefills[0].block_table[1]);
    EXPECT_NE(prefills[i].block_table[2], prefills[0].block_table[2]);
  }
  EXPECT_EQ(h.cached_tokens(), 64);
  h.RunToCompletion();
}

TEST(Scheduler, AForkSharesBlocksAndItsFirstDecodeCopiesTheSharedPartialBlock) {
  Harness h(MakeScheduler(16, 4));
  ASSERT_TRUE(h.Submit(Request(1, Prompt(6), 5)).ok());
  ASSERT_TRUE(h.Step());
  ASSERT_TRUE(h.Fork(1, 2, {.temperature = 1.0, .seed = 77}).ok());
  EXPECT_EQ(h.Fork(1, 2, {}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(h.Fork(9, 3, {}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.Fork(1, 3, {.top_p = 2}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(h.Step());
  const ScheduledStep& step = h.steps().back();
  EXPECT_EQ(Ids(step.decodes), (std::vector<RequestId>{1, 2}));
  ASSERT_EQ(step.block_copies.size(), 1u);  // block 1 held 2 tokens and both wrote a third
  EXPECT_EQ(step.block_copies[0].num_tokens, 2);
  EXPECT_EQ(step.decodes[0].block_table[0], step.decodes[1].block_table[0]);  // the full block stays shared
  EXPECT_NE(step.decodes[0].block_table[1], step.decodes[1].block_table[1]);
  h.RunToCompletion();
  EXPECT_EQ(h.finished().size(), 2u);
  EXPECT_NE(h.finished().at(1).output, h.finished().at(2).output);  // different seeds
}

TEST(Scheduler, BadRequestsAreRejectedAtSubmissionAndHarmNoOther) {
  Scheduler s = MakeScheduler(8, 4, {.max_context = 64});
  ASSERT_TRUE(s.Submit(Request(1, Prompt(6), 4)).ok());
  auto rejected = [&](GenerationRequest r, absl::StatusCode code, const std::string& says) {
    absl::Status status = s.Submit(std::move(r));
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), says)) << status;
  };
  rejected(Request(2, {}, 4), absl::StatusCode::kInvalidArgument, "the prompt is empty");
  rejected(Request(3, {1, 2, 50}, 4), absl::StatusCode::kInvalidArgument, "prompt token 2 is 50, outside the vocabulary [0, 50)");
  rejected(Request(4, {-1}, 4), absl::StatusCode::kInvalidArgument, "prompt token 0 is -1");
  rejected(Request(5, Prompt(30), 35), absl::StatusCode::kInvalidArgument, "exceed the model's context of 64");
  rejected(Request(6, Prompt(40), 1), absl::StatusCode::kInvalidArgument, "40 prompt tokens need 10 blocks");
  rejected(Request(7, Prompt(20), 20), absl::StatusCode::kInvalidArgument, "never fit in the KV pool");
  rejected(Request(8, Prompt(4), 0), absl::StatusCode::kInvalidArgument, "max_new_tokens is 0");
  rejected(Request(9, Prompt(4), 2, {.temperature = -1}), absl::StatusCode::kInvalidArgument, "temperature is -1");
  rejected(Request(1, Prompt(4), 2), absl::StatusCode::kAlreadyExists, "in use");
  EXPECT_EQ(s.num_waiting(), 1);
  // The largest request that can fit is accepted: 20 + 13 - 1 = 32 tokens = the whole pool.
  EXPECT_TRUE(s.Submit(Request(10, Prompt(20), 13)).ok());
  ScheduledStep step = s.Schedule().value();
  EXPECT_EQ(Ids(step.prefills), (std::vector<RequestId>{1, 10}));
}

TEST(Scheduler, StepsMustAlternateAndCompletionsMustMatchTheStep) {
  Scheduler s = MakeScheduler(8, 4);
  EXPECT_EQ(s.CompleteStep({}).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.Submit(Request(1, Prompt(6), 4)).ok());
  ASSERT_TRUE(s.Submit(Request(2, Prompt(6, 9), 4)).ok());
  ASSERT_TRUE(s.Schedule().ok());
  EXPECT_EQ(s.Schedule().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Fork(1, 5, {}).code(), absl::StatusCode::kFailedPrecondition);
  auto fails = [&](std::vector<SampledToken> tokens, const std::string& says) {
    absl::StatusOr<std::vector<FinishedRequest>> r = s.CompleteStep(tokens);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), says)) << r.status();
  };
  fails({{1, 4}}, "request 2 has no token");
  fails({{1, 4}, {2, 4}, {3, 4}}, "request 3 was not in the step");
  fails({{1, 4}, {1, 5}}, "request 1 has two tokens");
  fails({{1, 4}, {2, 50}}, "sampled token 50");
  ASSERT_TRUE(s.CompleteStep({{2, 4}, {1, 5}}).ok());  // nothing was changed by the failures
  ScheduledStep step = s.Schedule().value();
  ASSERT_EQ(step.decodes.size(), 2u);
  EXPECT_EQ(step.decodes[0].token, 5);
  EXPECT_EQ(step.decodes[1].token, 4);
}

TEST(Scheduler, AbortDropsWaitingAndRunningRequests) {
  Scheduler s = MakeScheduler(4, 4);
  ASSERT_TRUE(s.Submit(Request(1, Prompt(12), 3)).ok());
  // A prompt of its own (sharing no block with request 1's): 2 blocks, and 1 is left, so it waits.
  ASSERT_TRUE(s.Submit(Request(2, Prompt(8, 50), 3)).ok());
  ASSERT_TRUE(s.Schedule().ok());
  ASSERT_TRUE(s.CompleteStep({{1, 7}}).ok());
  FinishedRequest waiting = s.Abort(2).value();
  EXPECT_EQ(waiting.reason, FinishReason::kAborted);
  EXPECT_TRUE(waiting.output.empty());
  FinishedRequest running = s.Abort(1).value();
  EXPECT_EQ(running.output, (std::vector<TokenId>{7}));
  EXPECT_EQ(s.block_manager().num_free_blocks(), 4);
  EXPECT_EQ(s.Abort(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(s.HasUnfinishedRequests());
}

TEST(Scheduler, OptionsThatCannotWorkAreRefused) {
  EXPECT_EQ(Scheduler::Create({.vocab_size = 0, .max_context = 8}, MakePool(4, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.vocab_size = 8, .max_context = 0}, MakePool(4, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.vocab_size = 8, .max_context = 8, .eos_token = 8}, MakePool(4, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scheduler::Create({.vocab_size = 8, .max_context = 8, .max_running = 0}, MakePool(4, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DecodeBatch, BucketsArePowersOfTwoAndABatchIsPaddedToItsBucket) {
  EXPECT_EQ(DecodeBatchBuckets(64), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(DecodeBatchBuckets(48), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(DecodeBatchBuckets(1), (std::vector<int64_t>{1}));
  const std::vector<int64_t> buckets = DecodeBatchBuckets(64);
  EXPECT_EQ(BucketFor(1, buckets).value(), 1);
  EXPECT_EQ(BucketFor(3, buckets).value(), 4);
  EXPECT_EQ(BucketFor(17, buckets).value(), 32);
  EXPECT_EQ(BucketFor(64, buckets).value(), 64);
  EXPECT_EQ(BucketFor(65, buckets).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BucketFor(0, buckets).status().code(), absl::StatusCode::kInvalidArgument);

  // Three decodes from the scheduler: bucket 4, the fourth row padding.
  Scheduler s = MakeScheduler(16, 4);
  for (RequestId id : {1, 2, 3}) ASSERT_TRUE(s.Submit(Request(id, Prompt(3 + id, id), 4)).ok());
  ASSERT_TRUE(s.Schedule().ok());
  ASSERT_TRUE(s.CompleteStep({{1, 9}, {2, 8}, {3, 7}}).ok());
  const ScheduledStep step = s.Schedule().value();
  ASSERT_EQ(step.decode_bucket, 4);
  const DecodeBatch batch = PackDecodeBatch(step.decodes, step.decode_bucket, 4, 3).value();
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{9, 8, 7, 0}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{4, 5, 6, 0}));
  EXPECT_EQ(batch.context_lengths, (std::vector<int32_t>{5, 6, 7, 0}));
  for (int row = 0; row < 3; ++row) {
    const DecodeWork& d = step.decodes[row];
    EXPECT_EQ(batch.slots[row], d.block_table[d.position / 4] * 4 + d.position % 4);
    EXPECT_EQ(batch.block_tables[row * 3 + 0], d.block_table[0]);
    EXPECT_EQ(batch.block_tables[row * 3 + 1], d.block_table[1]);
    EXPECT_EQ(batch.block_tables[row * 3 + 2], -1);  // past the table's end
  }
  EXPECT_EQ(batch.slots[3], -1);  // padding writes nothing
  EXPECT_EQ(std::vector<int32_t>(batch.block_tables.begin() + 9, batch.block_tables.end()),
            (std::vector<int32_t>{-1, -1, -1}));
  EXPECT_EQ(PackDecodeBatch(step.decodes, 2, 4, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PackDecodeBatch(step.decodes, 4, 4, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::inference
