// The gradient buckets of data-parallel training: which gradients are all-reduced together,
// in which order, and from which point of the step each all-reduce may start.
//
// As in PyTorch DDP (torch.nn.parallel.DistributedDataParallel, bucket_cap_mb=25), gradients
// are grouped in the order the backward produces them, last layer first, into buckets of at
// most `cap_bytes`, so that one all-reduce per bucket runs on a communication stream while
// the backward computes the rest. A tensor is never split: one larger than the cap gets a
// bucket of its own. A bucket is ready after the last of its gradients is computed.
//
// The plan reads the training step as the default pipeline leaves it (passes/training_step.h):
// each parameter's adamw_update group takes its gradient as operand 4i + 1 (group i of a
// grouped node; operand 1 of a one-parameter node); with clipping on, that
// operand is the clipped gradient (grad_clip scope), and the gradient to all-reduce is the
// raw one the clip reads: ranks must sum gradients before the global norm is taken, or each
// rank would clip by its own norm. "Produced" means the position in the step's node order,
// which is the order the step runs in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "passes/training_step.h"

namespace kiln {

struct GradBucketOptions {
  int64_t cap_bytes = int64_t{25} << 20;  // PyTorch DDP's default bucket_cap_mb=25
};

// One trainable parameter's gradient in the step.
struct GradientSlot {
  int64_t param_index = 0;      // the parameter's index among the step's parameters (its position in params...)
  std::string param_name;
  const Node* gradient = nullptr;  // the node computing the gradient to all-reduce
  int64_t position = 0;          // the gradient node's index in the step's node order
  int64_t bytes = 0;
};

struct GradBucket {
  std::vector<GradientSlot> gradients;  // in production order
  int64_t bytes = 0;
  // The node after which every gradient of the bucket exists: its all-reduce may start
  // there. It is the bucket's last-produced gradient.
  const Node* ready_after = nullptr;
  int64_t ready_position = 0;
};

struct GradBucketPlan {
  std::vector<GradBucket> buckets;  // in the order their all-reduces start
  int64_t total_bytes = 0;
  // "3 buckets (25.0 + 25.0 + 12.1 MiB) for 58 gradients", for logs.
  std::string Summary() const;
};

// Fails if the step has not one adamw_update per trainable parameter of `layout`, or a
// gradient cannot be told apart from the clipping around it, or cap_bytes < 1.
absl::StatusOr<GradBucketPlan> PlanGradBuckets(const Function& step, const TrainingStepLayout& layout,
                                               const GradBucketOptions& options = {});

}  // namespace kiln
