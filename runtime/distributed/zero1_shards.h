// ZeRO-1's layout (issue 17's option): AdamW's state sharded over the ranks, so that each rank
// keeps m and v for 1/N of the parameters' elements. Per gradient bucket
// (runtime/distributed/grad_buckets.h), the bucket's gradients lie end to end in one flat
// buffer in the bucket's order, padded to a multiple of the world size; a reduce-scatter of it
// hands rank r the summed slice [r S, (r + 1) S) (S = padded / N), rank r updates the
// parameters' elements in its slice alone, and an all-gather of the bucket's updated
// parameters gives every rank all of them (DeepSpeed's and FSDP's flat partition: equal
// slices, so NCCL's ReduceScatter and AllGather take the buffer as it is). A tensor may
// straddle two slices; its segments say which of its elements each rank owns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/distributed/grad_buckets.h"

namespace kiln {

// `count` elements of parameter `param_index`, from `tensor_offset` in the tensor, at
// `flat_offset` in the bucket's flat buffer.
struct ShardSegment {
  int64_t param_index = 0;
  int64_t tensor_offset = 0;
  int64_t flat_offset = 0;
  int64_t count = 0;
};

struct BucketShards {
  int64_t elements = 0;  // the bucket's gradients' elements
  int64_t padded = 0;    // rounded up to a multiple of the world size
  int64_t shard = 0;     // padded / world: every rank's slice
  std::vector<std::vector<ShardSegment>> by_rank;  // [rank]: its slice's segments, in flat order
};

struct Zero1Plan {
  int world_size = 1;
  std::vector<BucketShards> buckets;  // as the GradBucketPlan's
  // The elements of AdamW state (each of m and v) rank `rank` keeps: its slices' segments.
  int64_t StateElements(int rank) const;
  // "2 ranks: 1,234,567 state elements a rank of 2,469,134 (50.0%), 3 buckets", for logs.
  std::string Summary() const;
};

// InvalidArgument for a world size below 1 or a bucket plan with a gradient of unknown size.
absl::StatusOr<Zero1Plan> PlanZero1Shards(const GradBucketPlan& plan, int world_size);

}  // namespace kiln
