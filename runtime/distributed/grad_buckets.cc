#include "runtime/distributed/grad_buckets.h"

#include <algorithm>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kiln {
namespace {

constexpr absl::string_view kClipScope = "grad_clip";  // BuildTrainingStep's clipping scope

// The gradient that `clipped` (adamw_update's operand 1) was computed from: walking up
// through the clipping nodes, the first values outside the clip scope that have the
// parameter's shape. Only same-shape operands are followed, so the walk never reaches the
// other gradients through the global norm (a scalar). Without clipping, `clipped` itself.
absl::StatusOr<const Node*> UnclippedGradient(const Node* clipped, const Node& param) {
  if (clipped->scope() != kClipScope) return clipped;
  const std::vector<int64_t>& dims = param.type().dims;
  std::vector<const Node*> found;
  absl::flat_hash_set<const Node*> seen = {clipped};
  std::deque<const Node*> work = {clipped};
  while (!work.empty()) {
    const Node* n = work.front();
    work.pop_front();
    for (const Node* op : n->operands()) {
      if (op->has_multiple_results() || op->type().dims != dims || !seen.insert(op).second) continue;
      if (op->scope() == kClipScope) {
        work.push_back(op);
      } else {
        found.push_back(op);
      }
    }
  }
  if (found.size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gradient buckets: %", param.name(), "'s adamw_update reads %", clipped->name(), " (", clipped->op_name(),
        ", clipping), which comes from ", found.size(), " values of shape ", param.type().ToString(),
        " outside the clip, not exactly one; cannot tell which is the gradient to all-reduce"));
  }
  return found[0];
}

}  // namespace

std::string GradBucketPlan::Summary() const {
  int64_t count = 0;
  std::vector<std::string> sizes;
  for (const GradBucket& b : buckets) {
    count += static_cast<int64_t>(b.gradients.size());
    sizes.push_back(absl::StrFormat("%.1f", static_cast<double>(b.bytes) / (1 << 20)));
  }
  return absl::StrCat(buckets.size(), buckets.size() == 1 ? " bucket (" : " buckets (", absl::StrJoin(sizes, " + "),
                      " MiB) for ", count, " gradients");
}

absl::StatusOr<GradBucketPlan> PlanGradBuckets(const Function& step, const TrainingStepLayout& layout,
                                               const GradBucketOptions& options) {
  if (options.cap_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("gradient buckets: cap_bytes must be >= 1, got ", options.cap_bytes));
  }
  absl::flat_hash_map<const Node*, int64_t> position;
  for (int64_t i = 0; i < step.num_nodes(); ++i) position[step.nodes()[i].get()] = i;

  std::vector<GradientSlot> slots;
  absl::flat_hash_set<int64_t> params_seen;
  for (const auto& node : step.nodes()) {
    if (node->opcode() != Opcode::kAdamWUpdate) continue;
    // One parameter per group (group-optimizer-updates' nodes have several): p is operand
    // 4i, its gradient 4i + 1.
    for (int group = 0; group < node->num_results() / 3; ++group) {
      const Node* param = node->operand(4 * group);
      absl::StatusOr<int64_t> index = param->attrs().GetInt("index");
      if (param->opcode() != Opcode::kParameter || !index.ok() || *index < layout.first_param() ||
          *index >= layout.first_param() + layout.num_params) {
        return absl::FailedPreconditionError(absl::StrCat("gradient buckets: @", step.name(), "'s adamw_update %",
                                                          node->name(), " does not update a trainable parameter"));
      }
      if (!params_seen.insert(*index).second) {
        return absl::FailedPreconditionError(
            absl::StrCat("gradient buckets: %", param->name(), " has more than one adamw_update in @", step.name()));
      }
      absl::StatusOr<const Node*> gradient = UnclippedGradient(node->operand(4 * group + 1), *param);
      if (!gradient.ok()) return gradient.status();
      slots.push_back({*index, param->name(), *gradient, position.at(*gradient), (*gradient)->type().num_bytes()});
    }
  }
  if (static_cast<int64_t>(slots.size()) != layout.num_params) {
    return absl::FailedPreconditionError(absl::StrCat("gradient buckets: @", step.name(), " has ", slots.size(),
                                                      " adamw_update parameter groups for ", layout.num_params,
                                                      " trainable parameters"));
  }
  // Production order; ties (one node computing two gradients cannot happen, but keep it
  // deterministic) by parameter index.
  std::sort(slots.begin(), slots.end(), [](const GradientSlot& a, const GradientSlot& b) {
    return a.position != b.position ? a.position < b.position : a.param_index < b.param_index;
  });

  GradBucketPlan plan;
  for (GradientSlot& slot : slots) {
    plan.total_bytes += slot.bytes;
    // A new bucket when the current one would overflow; an oversized tensor then sits alone
    // in the bucket it opens, and the next gradient opens another.
    if (plan.buckets.empty() || plan.buckets.back().bytes + slot.bytes > options.cap_bytes) {
      plan.buckets.emplace_back();
    }
    GradBucket& bucket = plan.buckets.back();
    bucket.bytes += slot.bytes;
    bucket.ready_after = slot.gradient;
    bucket.ready_position = slot.position;
    bucket.gradients.push_back(std::move(slot));
  }
  return plan;
}

}  // namespace kiln
