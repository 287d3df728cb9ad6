// Common-subexpression elimination: nodes with the same op, the same operands, the same
// attributes and the same type compute the same value, so all but the first are replaced by
// the first (its name and scope survive). Parameters are never merged: two inputs of one
// type are still two inputs. add, mul, max and min and compare eq/ne are commutative, so
// add(%a, %b) and add(%b, %a) merge too. Deterministic: one sweep in definition order.
//
// Before:
//   %x = parameter() {index=0} : f32[4]
//   %a = exp(%x) : f32[4]
//   %b = exp(%x) : f32[4]
//   %c = add(%a, %b) : f32[4]
//   return %c
// After:
//   %x = parameter() {index=0} : f32[4]
//   %a = exp(%x) : f32[4]
//   %c = add(%a, %a) : f32[4]
//   return %c
#pragma once

#include "passes/pass.h"

namespace kiln {

class CsePass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "cse";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

// The same on one function; returns whether anything was merged.
bool EliminateCommonSubexpressions(Function& function);

}  // namespace kiln
