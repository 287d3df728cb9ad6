// --backend: where a model runs. This build has the CPU reference backend; the CUDA backend
// is not built yet, and asking for it is an error rather than a silent fallback.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::cli {

enum class Backend { kCpu };

// "cpu" -> cpu; "auto" -> cpu (noting it on stderr); "cuda" -> an error that says why.
absl::StatusOr<Backend> ResolveBackend(absl::string_view name);

}  // namespace kiln::cli
