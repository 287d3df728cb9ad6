#include "frontends/cli/backend_flag.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln::cli {
namespace {

// OK, or why the CUDA backend cannot run here.
absl::Status CudaUsable() { return CudaBackendAvailable(); }

absl::StatusOr<ResolvedBackend> OpenCuda() {
  ResolvedBackend r;
  r.backend = Backend::kCuda;
#ifdef KILN_WITH_CUDA
  ASSIGN_OR_RETURN(r.device, CudaDevice::Open(0));
  std::fprintf(stderr, "kiln: backend cuda: %s (%s)\n", r.device->name().c_str(), r.device->arch().c_str());
#endif
  return r;
}

}  // namespace

absl::StatusOr<ResolvedBackend> ResolveBackend(absl::string_view name) {
  if (name == "cpu") return ResolvedBackend{};
  if (name == "cuda") {
    absl::Status usable = CudaUsable();
    if (!usable.ok()) return absl::FailedPreconditionError(absl::StrCat("--backend cuda: ", usable.message()));
    return OpenCuda();
  }
  if (name == "auto") {
    absl::Status usable = CudaUsable();
    if (usable.ok()) return OpenCuda();
    std::fprintf(stderr, "kiln: --backend auto: using the CPU reference backend (%s)\n",
                 std::string(usable.message()).c_str());
    return ResolvedBackend{};
  }
  return absl::InvalidArgumentError(absl::StrCat("--backend must be cpu, cuda or auto, got '", name, "'"));
}

}  // namespace kiln::cli
