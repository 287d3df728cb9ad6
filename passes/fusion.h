// Loop fusion: chains of elementwise ops (with the broadcasts, transposes, iotas, splat
// constants and reshapes between them) become kernel groups, each computed by ONE generated kernel that
// reads the group's inputs once and writes only its root (codegen/kernel_group.h).
//
// The pass changes no value: it marks every member of a group with the attribute
// `kernel_group="<root's name>"` (names, unlike ids, survive the text form), so the reference backend, the verifier and the text form see
// the same graph, and `kiln check` proves the pipeline exact as before. Codegen and the
// memory plan read the marks: a member that is not its group's root gets no buffer.
//
// A producer joins its consumer's group when every use of it is inside the group (so it
// never needs to be stored). A producer that reads no memory (iota, a splat constant, and
// elementwise ops or broadcasts of those, e.g. a causal mask) is duplicated into each group
// that uses it instead. Every other edge into a group is a decision with a reason, kept as
// a value (FusionDecision) and printed by `kiln compile --report` / `kiln train --report`.
//
// Before:
//   %a = parameter() {index=0} : f32[4,8]
//   %b = parameter() {index=1} : f32[8]
//   %bb = broadcast(%b) {dims=[1]} : f32[4,8]
//   %s = add(%a, %bb) : f32[4,8]
//   %y = convert(%s) : bf16[4,8]
//   return %y
// After: %bb, %s and %y carry {kernel_group="y"}; one kernel reads %a and %b and writes %y.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "passes/pass.h"

namespace kiln {

inline constexpr absl::string_view kKernelGroupAttr = "kernel_group";

// Whether `node` can be computed element by element inside a loop kernel.
bool IsLoopFusible(const Node& node);
// A reduction that can root a kernel group: its operand is then computed inside the
// reduction's kernel instead of being stored (reduce_sum(mul(g, g)) reads g once).
bool IsFusibleReduction(const Node& node);

// The group a node belongs to (its root's name), or "" for none.
std::string KernelGroupOf(const Node& node);

struct FusionDecision {
  const Node* producer = nullptr;
  const Node* consumer = nullptr;  // a member of a kernel group
  bool fused = false;
  std::string why;  // for a fused edge: "single use", "duplicated: reads no memory"
};

// Every operand edge into a group member of `f`, after FusionPass: fused, or why not.
std::vector<FusionDecision> ExplainFusion(const Function& f);
// "412 kernel groups of 1290 nodes; edges into groups: 900 fused, 410 not: 200 a GEMM's
// result (...), ..." and, when `list_all`, one line per decision that was not to fuse.
std::string FormatFusionReport(const Function& f, bool list_all);

class FusionPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-loops";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
