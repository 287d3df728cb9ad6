// Loop fusion: chains of elementwise ops (with the broadcasts, transposes, iotas, splat
// constants and reshapes between them), and such chains feeding a reduce_sum/reduce_max,
// become fusion nodes (ir/fusion.h), each computed by ONE generated kernel that reads the
// fusion's operands once and writes only its result.
//
// The pass changes no value: a fusion's body holds the very ops it replaced, so the
// reference backend computes the same bits and `kiln check` proves the pipeline exact as
// before. The fused values never get a buffer: they are not nodes of the function any more.
// A pass that runs afterwards sees each fusion as one node.
//
// A producer joins its consumer's fusion when every use of it is inside the fusion (so it
// never needs to be stored). A producer that reads no memory (iota, a splat constant, and
// elementwise ops or broadcasts of those, e.g. a causal mask) is copied into each fusion
// that uses it instead. Every edge into a fusion is decided by DecideFusion, whose value
// (fused, or not and why: XLA's FusionDecision) the pass keeps; `kiln compile --report` and
// `kiln train --report` print them.
//
// Before:
//   %a = parameter() {index=0} : f32[4,8]
//   %b = parameter() {index=1} : f32[8]
//   %bb = broadcast(%b) {dims=[1]} : f32[4,8]
//   %s = add(%a, %bb) : f32[4,8]
//   %y = convert(%s) : bf16[4,8]
//   return %y
// After:
//   %a = parameter() {index=0} : f32[4,8]
//   %b = parameter() {index=1} : f32[8]
//   %y = fusion(%b, %a) {kind=loop} : bf16[4,8] {
//     %b = parameter() {index=0} : f32[8]
//     %a = parameter() {index=1} : f32[4,8]
//     %bb = broadcast(%b) {dims=[1]} : f32[4,8]
//     %s = add(%a, %bb) : f32[4,8]
//     %y = convert(%s) : bf16[4,8]
//     return %y
//   }
//   return %y
// (The fusion's operands are the body's inputs in order of first use; the fusion keeps its
// root's name.)
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "passes/pass.h"

namespace kiln {

// Whether a producer is computed inside its consumer's kernel, and why (or why not): the
// value the decision function returns, kept with where it was made. Names, not pointers:
// the producer and consumer of a fused edge are gone from the function after the pass.
struct FusionDecision {
  static FusionDecision Fuse(std::string why) { return {true, std::move(why)}; }
  static FusionDecision Forbid(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return fused; }

  bool fused = false;
  std::string why;  // "every use is in the kernel", "a GEMM: cuBLASLt writes it ...", ...
  // Where: the function, the fusion (its root's name), and the edge.
  std::string function, fusion, producer, producer_op, consumer, consumer_op;
};

// The decision for the edge from `producer` into a fusion whose members so far are
// `members` (the consumer among them).
FusionDecision DecideFusion(const Node& producer, const absl::flat_hash_set<const Node*>& members);

class FusionPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-loops";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;

  // Every decision of the last Run, function by function, each fusion's in the order made.
  const std::vector<FusionDecision>& decisions() const { return decisions_; }

 protected:
  void StartRun() override { decisions_.clear(); }

 private:
  std::vector<FusionDecision> decisions_;
};

// "@train_step: 412 fusions of 1290 nodes; operand edges into fusions: 900 fused, 410 not"
// and a line per reason with its count; with `list_all`, one line per edge too. Over the
// fusion nodes of `f` and the decisions made for it.
std::string FormatFusionReport(const Function& f, absl::Span<const FusionDecision> decisions, bool list_all);

}  // namespace kiln
