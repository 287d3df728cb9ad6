#include "runtime/distributed/zero1_shards.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {

int64_t Zero1Plan::StateElements(int rank) const {
  int64_t n = 0;
  for (const BucketShards& b : buckets) {
    if (rank < 0 || rank >= static_cast<int>(b.by_rank.size())) continue;
    for (const ShardSegment& s : b.by_rank[rank]) n += s.count;
  }
  return n;
}

std::string Zero1Plan::Summary() const {
  int64_t total = 0;
  for (const BucketShards& b : buckets) total += b.elements;
  const int64_t most = [&] {
    int64_t m = 0;
    for (int r = 0; r < world_size; ++r) m = std::max(m, StateElements(r));
    return m;
  }();
  return absl::StrFormat("%d ranks: at most %d state elements a rank of %d (%.1f%%), %d buckets", world_size, most,
                         total, total > 0 ? 100.0 * static_cast<double>(most) / static_cast<double>(total) : 0.0,
                         buckets.size());
}

absl::StatusOr<Zero1Plan> PlanZero1Shards(const GradBucketPlan& plan, int world_size) {
  if (world_size < 1) return absl::InvalidArgumentError(absl::StrCat("ZeRO-1 over ", world_size, " ranks"));
  Zero1Plan out{.world_size = world_size};
  for (size_t bi = 0; bi < plan.buckets.size(); ++bi) {
    const GradBucket& bucket = plan.buckets[bi];
    BucketShards shards;
    shards.by_rank.resize(world_size);
    for (const GradientSlot& g : bucket.gradients) {
      if (g.gradient == nullptr || g.gradient->type().num_elements() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("bucket ", bi, ": the gradient of %", g.param_name, " has no known size"));
      }
      shards.elements += g.gradient->type().num_elements();
    }
    shards.padded = (shards.elements + world_size - 1) / world_size * world_size;
    shards.shard = shards.padded / world_size;
    // Walk the tensors in the bucket's order, cutting each at the slices' boundaries.
    int64_t flat = 0;
    for (const GradientSlot& g : bucket.gradients) {
      const int64_t n = g.gradient->type().num_elements();
      for (int64_t done = 0; done < n;) {
        const int rank = static_cast<int>(flat / std::max<int64_t>(1, shards.shard));
        const int64_t slice_end = (rank + 1) * shards.shard;
        const int64_t count = std::min(n - done, slice_end - flat);
        shards.by_rank[rank].push_back(
            {.param_index = g.param_index, .tensor_offset = done, .flat_offset = flat, .count = count});
        done += count;
        flat += count;
      }
    }
    out.buckets.push_back(std::move(shards));
  }
  return out;
}

}  // namespace kiln
