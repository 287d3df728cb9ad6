#include "passes/pass.h"

#include "absl/strings/str_cat.h"

namespace kiln {

absl::StatusOr<bool> FunctionPass::Run(Module& module) {
  StartRun();
  bool changed = false;
  for (const auto& function : module.functions()) {
    absl::StatusOr<bool> function_changed = RunOnFunction(*function);
    if (!function_changed.ok()) {
      return absl::Status(function_changed.status().code(),
                          absl::StrCat("@", function->name(), ": ", function_changed.status().message()));
    }
    changed |= *function_changed;
  }
  return changed;
}

}  // namespace kiln
