#include "frontends/cli/backend_flag.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace kiln::cli {

absl::StatusOr<Backend> ResolveBackend(absl::string_view name) {
  if (name == "cpu") return Backend::kCpu;
  if (name == "auto") {
    std::fprintf(stderr, "kiln: --backend auto: using the CPU reference backend (this build has no CUDA backend)\n");
    return Backend::kCpu;
  }
  if (name == "cuda") {
    return absl::UnimplementedError(
        "--backend cuda: this build of kiln has no CUDA backend yet; use --backend cpu");
  }
  return absl::InvalidArgumentError(absl::StrCat("--backend must be cpu, cuda or auto, got '", name, "'"));
}

}  // namespace kiln::cli
