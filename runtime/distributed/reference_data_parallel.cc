#include "runtime/distributed/reference_data_parallel.h"

#include <exception>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ir/numerics.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

std::string RankLabel(int rank, int world_size) { return absl::StrCat("data-parallel rank ", rank, " of ", world_size); }

// The mean over ranks of each tensor, written back to every rank's copy: summed in rank order
// 0..N-1 in double, divided by N and rounded once to the dtype, so every rank holds the same
// value and one rank (N = 1) keeps its own exactly.
void AverageInPlace(const std::vector<std::vector<HostTensor*>>& per_rank, bool f32_as_f64) {
  const size_t n = per_rank.size();
  for (size_t k = 0; k < per_rank[0].size(); ++k) {
    const DType dtype = per_rank[0][k]->type().dtype;
    std::vector<double> mean(per_rank[0][k]->values().size(), 0.0);
    for (size_t r = 0; r < n; ++r) {
      const std::vector<double>& v = per_rank[r][k]->values();
      for (size_t j = 0; j < mean.size(); ++j) mean[j] += v[j];
    }
    for (double& x : mean) x /= static_cast<double>(n);
    RoundValuesToDType(mean.data(), static_cast<int64_t>(mean.size()), dtype, f32_as_f64);
    for (size_t r = 0; r < n; ++r) per_rank[r][k]->mutable_values() = mean;
  }
}

// Where the ranks meet at each bucket. The last rank to arrive averages everyone's tensors
// (the others are blocked, so nobody reads them meanwhile) and releases them all. A rank that
// fails aborts the rendezvous: the ranks waiting, and those arriving later, return an error
// instead of waiting for a rank that will never come.
class BucketRendezvous {
 public:
  BucketRendezvous(int world_size, bool f32_as_f64)
      : world_size_(world_size), f32_as_f64_(f32_as_f64), arrived_(world_size) {}

  absl::Status AllReduceMean(int rank, int64_t bucket, std::vector<HostTensor*> tensors) {
    absl::MutexLock lock(&mu_);
    if (failed_rank_.has_value()) return Aborted(rank, bucket);
    if (bucket != completed_) {
      // Every rank runs the same node order, so this is a bug of the runner, not of the input.
      return AbortLocked(rank, absl::InternalError(absl::StrCat("reached bucket ", bucket, " while the ranks are at bucket ",
                                                                completed_)));
    }
    arrived_[rank] = std::move(tensors);
    if (++num_arrived_ == world_size_) {
      AverageInPlace(arrived_, f32_as_f64_);
      num_arrived_ = 0;
      ++completed_;
      released_.SignalAll();
      return absl::OkStatus();
    }
    while (completed_ == bucket && !failed_rank_.has_value()) released_.Wait(&mu_);
    if (completed_ > bucket) return absl::OkStatus();  // done before the abort: the values are the mean
    return Aborted(rank, bucket);
  }

  // Records the first failure (the root cause) and wakes every waiting rank.
  void Abort(int rank, absl::Status why) {
    absl::MutexLock lock(&mu_);
    (void)AbortLocked(rank, std::move(why));
  }

  // The first failing rank and its error, if any.
  std::optional<int> failed_rank() {
    absl::MutexLock lock(&mu_);
    return failed_rank_;
  }
  absl::Status failure() {
    absl::MutexLock lock(&mu_);
    return failure_;
  }

 private:
  absl::Status AbortLocked(int rank, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failed_rank_.has_value()) {
      failed_rank_ = rank;
      failure_ = absl::Status(why.code(), absl::StrCat(RankLabel(rank, world_size_), ": ", why.message()));
      released_.SignalAll();
    }
    return failure_;
  }
  absl::Status Aborted(int rank, int64_t bucket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::AbortedError(absl::StrCat(RankLabel(rank, world_size_), ": stopped at gradient bucket ", bucket,
                                           "'s all-reduce because rank ", *failed_rank_, " failed"));
  }

  const int world_size_;
  const bool f32_as_f64_;
  absl::Mutex mu_;
  absl::CondVar released_;
  std::vector<std::vector<HostTensor*>> arrived_ ABSL_GUARDED_BY(mu_);  // per rank, this bucket's gradients
  int num_arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;  // buckets all-reduced so far
  std::optional<int> failed_rank_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

// One rank's view of the plan while its step runs: the gradients it has computed so far
// (pointers into the evaluator's values, which stay in place until their last user has run;
// CheckGradientsReadAfterAllReduce guarantees no user runs before the all-reduce) and the
// next bucket to all-reduce.
class RankAllReduce {
 public:
  RankAllReduce(int rank, const GradBucketPlan& plan, BucketRendezvous& rendezvous)
      : rank_(rank), plan_(plan), rendezvous_(rendezvous), pending_(plan.buckets.size()) {
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
      pending_[b].resize(plan.buckets[b].gradients.size(), nullptr);
      for (size_t k = 0; k < plan.buckets[b].gradients.size(); ++k) {
        slot_of_[plan.buckets[b].gradients[k].gradient] = {static_cast<int64_t>(b), static_cast<int64_t>(k)};
      }
    }
  }

  absl::Status AfterNode(const Node& node, absl::Span<HostTensor> results) {
    auto it = slot_of_.find(&node);
    if (it != slot_of_.end()) pending_[it->second.first][it->second.second] = &results[0];
    if (next_bucket_ >= static_cast<int64_t>(plan_.buckets.size()) || &node != plan_.buckets[next_bucket_].ready_after) {
      return absl::OkStatus();
    }
    const int64_t b = next_bucket_++;
    for (size_t k = 0; k < pending_[b].size(); ++k) {
      if (pending_[b][k] == nullptr) {
        return absl::InternalError(absl::StrCat("gradient bucket ", b, " is ready after %", node.name(), " but %",
                                                plan_.buckets[b].gradients[k].gradient->name(), " (the gradient of %",
                                                plan_.buckets[b].gradients[k].param_name, ") has not been computed"));
      }
    }
    return rendezvous_.AllReduceMean(rank_, b, std::move(pending_[b]));
  }

  int64_t buckets_done() const { return next_bucket_; }

 private:
  const int rank_;
  const GradBucketPlan& plan_;
  BucketRendezvous& rendezvous_;
  absl::flat_hash_map<const Node*, std::pair<int64_t, int64_t>> slot_of_;  // gradient -> (bucket, index)
  std::vector<std::vector<HostTensor*>> pending_;
  int64_t next_bucket_ = 0;
};

// "output 3 (the new %model.norm.weight)": outputs after the loss follow the inputs' order.
std::string OutputLabel(const Function& step, size_t i) {
  if (i == 0) return "output 0 (the loss)";
  const std::vector<Node*> params = step.parameters();
  if (i - 1 < params.size()) return absl::StrCat("output ", i, " (the new %", params[i - 1]->name(), ")");
  return absl::StrCat("output ", i);
}

absl::Status CheckRankArguments(const Function& step, const TrainingStepLayout& layout,
                                absl::Span<const std::vector<HostTensor>> rank_args) {
  const int world_size = static_cast<int>(rank_args.size());
  if (world_size < 1) {
    return absl::InvalidArgumentError("data-parallel step: needs at least one rank's arguments, got none");
  }
  const std::vector<Node*> params = step.parameters();
  for (int r = 0; r < world_size; ++r) {
    if (rank_args[r].size() != params.size()) {
      return absl::InvalidArgumentError(absl::StrCat(RankLabel(r, world_size), ": @", step.name(), " takes ",
                                                     params.size(), " arguments, got ", rank_args[r].size()));
    }
  }
  // Ranks that start from different weights or optimizer state would each apply the mean
  // gradient to their own state and drift apart; only the batch differs between ranks.
  const int64_t batch_begin = layout.first_batch_input(), batch_end = batch_begin + layout.num_batch_inputs;
  for (int r = 1; r < world_size; ++r) {
    for (int64_t i = 0; i < static_cast<int64_t>(params.size()); ++i) {
      if (i >= batch_begin && i < batch_end) continue;
      const HostTensor& a = rank_args[0][i];
      const HostTensor& b = rank_args[r][i];
      if (a.type() != b.type() || a.values() != b.values()) {
        return absl::InvalidArgumentError(absl::StrCat(
            RankLabel(r, world_size), ": argument ", i, " (%", params[i]->name(), ") differs from rank 0's; the ranks "
            "must start from the same parameters, optimizer state, t and lr, only the batch inputs differ"));
      }
    }
  }
  return absl::OkStatus();
}

// Every rank's outputs against rank 0's: after the all-reduce they must be the same bit for
// bit (the same function on the same means), so any difference is a gradient or state that
// escaped the all-reduce.
absl::Status CheckRanksAgree(const Function& step, const std::vector<std::vector<HostTensor>>& outputs) {
  const int world_size = static_cast<int>(outputs.size());
  for (int r = 1; r < world_size; ++r) {
    for (size_t i = 0; i < outputs[0].size(); ++i) {
      const std::vector<double>& a = outputs[0][i].values();
      const std::vector<double>& b = outputs[r][i].values();
      for (size_t j = 0; j < a.size(); ++j) {
        if (a[j] != b[j] && !(a[j] != a[j] && b[j] != b[j])) {  // NaN on both ranks agrees
          return absl::InternalError(absl::StrCat(
              RankLabel(r, world_size), ": ", OutputLabel(step, i), " differs from rank 0's at element ", j, " (",
              b[j], " vs ", a[j], "); a value it depends on was not all-reduced"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckGradientsReadAfterAllReduce(const Function& step, const GradBucketPlan& plan) {
  absl::flat_hash_map<const Node*, int64_t> position;
  for (int64_t i = 0; i < step.num_nodes(); ++i) position[step.nodes()[i].get()] = i;
  absl::flat_hash_map<const Node*, std::string> owner;  // gradient -> its parameter
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const GradBucket& bucket = plan.buckets[b];
    for (const GradientSlot& g : bucket.gradients) {
      auto [it, inserted] = owner.emplace(g.gradient, g.param_name);
      if (!inserted) {
        return absl::FailedPreconditionError(absl::StrCat("data-parallel step: %", g.gradient->name(),
                                                          " is the gradient of both %", it->second, " and %",
                                                          g.param_name, "; it would be all-reduced twice"));
      }
      for (const Node* user : g.gradient->users()) {
        auto p = position.find(user);
        if (p == position.end() || p->second > bucket.ready_position) continue;
        return absl::FailedPreconditionError(absl::StrCat(
            "data-parallel step: %", user->name(), " (", user->op_name(), ", node ", p->second, " of @", step.name(),
            ") reads %", g.gradient->name(), ", the gradient of %", g.param_name, " (node ", g.position,
            "), before its all-reduce: gradient bucket ", b, " can be all-reduced only after %",
            bucket.ready_after->name(), " (node ", bucket.ready_position,
            "), its last gradient, so the reader would see this rank's gradient, not the mean over ranks. "
            "The step must read gradients only after their bucket is complete (a smaller cap_bytes may help)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<HostTensor>>> RunReferenceDataParallelStep(
    const Function& step, const TrainingStepLayout& layout, absl::Span<const std::vector<HostTensor>> rank_args,
    const DataParallelOptions& options) {
  RETURN_IF_ERROR(CheckRankArguments(step, layout, rank_args));
  ASSIGN_OR_RETURN(GradBucketPlan plan, PlanGradBuckets(step, layout, options.buckets));
  RETURN_IF_ERROR(CheckGradientsReadAfterAllReduce(step, plan));

  const int world_size = static_cast<int>(rank_args.size());
  BucketRendezvous rendezvous(world_size, options.reference.f32_as_f64);
  std::vector<std::vector<HostTensor>> outputs(world_size);
  auto run_rank = [&](int rank) {
    RankAllReduce all_reduce(rank, plan, rendezvous);
    ReferenceOptions reference = options.reference;
    reference.after_node = [&, user_hook = options.reference.after_node](const Node& node,
                                                                         absl::Span<HostTensor> results) {
      if (user_hook) RETURN_IF_ERROR(user_hook(node, results));
      return all_reduce.AfterNode(node, results);
    };
    absl::StatusOr<std::vector<HostTensor>> result;
    try {
      result = EvaluateFunction(step, rank_args[rank], reference);
    } catch (const std::exception& e) {  // an allocation failure: report it, do not end the process
      result = absl::ResourceExhaustedError(absl::StrCat("evaluation threw: ", e.what()));
    }
    if (!result.ok()) {
      rendezvous.Abort(rank, result.status());
      return;
    }
    if (all_reduce.buckets_done() != static_cast<int64_t>(plan.buckets.size())) {
      // The others would wait at that bucket forever.
      const GradBucket& missed = plan.buckets[all_reduce.buckets_done()];
      rendezvous.Abort(rank, absl::InternalError(absl::StrCat(
                                 "the step finished without reaching gradient bucket ", all_reduce.buckets_done(),
                                 "'s node %", missed.ready_after->name(), " (no output depends on it)")));
      return;
    }
    outputs[rank] = *std::move(result);
  };
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) threads.emplace_back(run_rank, r);
  for (std::thread& t : threads) t.join();
  if (rendezvous.failed_rank().has_value()) return rendezvous.failure();

  // The loss: each rank's is its shard's mean, so their mean is the global batch's.
  std::vector<std::vector<HostTensor*>> losses(world_size);
  for (int r = 0; r < world_size; ++r) losses[r].push_back(&outputs[r][0]);
  AverageInPlace(losses, options.reference.f32_as_f64);
  RETURN_IF_ERROR(CheckRanksAgree(step, outputs));
  return outputs;
}

}  // namespace kiln
