// --backend: where a model runs. cpu is the reference backend; cuda needs a GPU (and a
// build with the CUDA toolkit); auto takes cuda when it can and says so when it cannot.
// Asking for cuda where it cannot run is an error that says why, never a silent fallback.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "frontends/compile.h"  // Backend, CudaBackendAvailable

#ifdef KILN_WITH_CUDA
#include "runtime/cuda/device.h"
#endif

namespace kiln::cli {

using ::kiln::Backend;  // the library's (frontends/compile.h): one enum for the CLI and the API

struct ResolvedBackend {
  Backend backend = Backend::kCpu;
#ifdef KILN_WITH_CUDA
  std::unique_ptr<CudaDevice> device;  // set for kCuda
#endif
};

// "cpu", "cuda" or "auto" (cuda if a GPU is usable, else cpu with a note on stderr).
absl::StatusOr<ResolvedBackend> ResolveBackend(absl::string_view name);

}  // namespace kiln::cli
