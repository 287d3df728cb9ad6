// Dead-code elimination: removes every node that no output of its function depends on.
// Parameters always stay: they are the function's signature, used or not.
//
// Before:
//   %x = parameter() {index=0} : f32[4]
//   %unused = parameter() {index=1} : f32[4]
//   %a = exp(%x) : f32[4]
//   %b = neg(%x) : f32[4]
//   return %a
// After:
//   %x = parameter() {index=0} : f32[4]
//   %unused = parameter() {index=1} : f32[4]
//   %a = exp(%x) : f32[4]
//   return %a
#pragma once

#include "passes/pass.h"

namespace kiln {

class DcePass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "dce";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

// The same on one function; returns whether anything was removed.
bool RemoveDeadNodes(Function& function);

}  // namespace kiln
