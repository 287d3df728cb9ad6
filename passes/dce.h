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

class DcePass : public Pass {
 public:
  absl::string_view name() const override { return "dce"; }
  absl::StatusOr<bool> Run(Module& module) override;
};

// The same on one function; returns whether anything was removed.
bool RemoveDeadNodes(Function& function);

}  // namespace kiln
