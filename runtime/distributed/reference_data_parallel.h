// Data-parallel training on the CPU reference backend: the oracle for the NCCL runner (issue
// 17), which cannot be tested without several GPUs.
//
// N in-process ranks (one thread each) evaluate the same training step (passes/training_step.h)
// with their own arguments: the same parameters and optimizer state, each its shard of the
// global batch (runtime/training/dataset.h's SampleRankBatch). Gradients are all-reduced in
// the buckets of runtime/distributed/grad_buckets.h, as DDP and the GPU runner do: when a
// rank has computed a bucket's ready_after node, it waits for the other ranks to get there
// too, and every rank's copy of the bucket's gradients is replaced, in place, by their mean
// (summed in rank order 0..N-1 in double, divided by N, rounded once to the gradient's dtype:
// deterministic, and the same on every rank). The evaluator's after_node hook
// (ir/reference_backend.h) is where that happens, so clipping and AdamW read the means and
// every rank computes the same update. The loss output is averaged the same way after the
// step (it is a mean over each rank's tokens, so the mean over ranks is the global batch's
// loss when the shards are of one size).
//
// With the shards of SampleRankBatch the new parameters equal one rank's on the global batch
// up to rounding: only the sums over the batch (weight gradients, the loss) are taken in
// another order.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "ir/reference_backend.h"
#include "passes/training_step.h"
#include "runtime/distributed/grad_buckets.h"

namespace kiln {

struct DataParallelOptions {
  GradBucketOptions buckets;
  // Per rank's evaluation. An after_node hook of the caller's runs on every rank, before the
  // all-reduce's own.
  ReferenceOptions reference;
};

// Fails (FailedPrecondition) if some node of `step` reads a bucket's gradient at or before
// the bucket's ready_after node: that reader would run before the all-reduce can start, so it
// would see this rank's gradient rather than the mean. Also fails if one gradient node is in
// the plan twice (two parameters sharing it would be averaged twice). `plan` must be
// PlanGradBuckets(step, ...)'s. The GPU runner needs the same guarantee for its launches.
absl::Status CheckGradientsReadAfterAllReduce(const Function& step, const GradBucketPlan& plan);

// One data-parallel step: rank_args[r] are rank r's arguments of `step` (a BuildTrainingStep
// function of `layout`, as the default pipeline leaves it), and N = rank_args.size(). Returns
// every rank's outputs, identical across ranks (checked). Errors: N < 1, a rank's argument
// count, a rank whose parameters, optimizer state, t or lr differ from rank 0's, a plan that
// the check above rejects, a rank's evaluation failing (the error names the rank; the other
// ranks stop at their next all-reduce instead of waiting for it), and ranks whose outputs
// differ (naming the rank and the output).
absl::StatusOr<std::vector<std::vector<HostTensor>>> RunReferenceDataParallelStep(
    const Function& step, const TrainingStepLayout& layout, absl::Span<const std::vector<HostTensor>> rank_args,
    const DataParallelOptions& options = {});

}  // namespace kiln
