// kiln version: the commit the binary was built from, and what it was built with.
#include <cstdio>

#include "frontends/cli/commands.h"
#include "kiln_build_info.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln::cli {
namespace {

absl::Status RunVersion(const ParsedArgs&) {
  std::printf("kiln %s\n", KILN_GIT_COMMIT);
#ifdef KILN_WITH_CUDA
  std::printf("built with CUDA %d.%d\n",
              CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
#else
  std::printf("built without CUDA (the CPU reference backend only)\n");
#endif
  return absl::OkStatus();
}

}  // namespace

Command VersionCommand() {
  return {{.name = "version",
           .usage = "",
           .summary = "print the commit kiln was built from (\"-dirty\": with uncommitted changes)",
           .details = "The benchmark scripts record it beside their figures (bench/generate_h200.sh)."},
          RunVersion};
}

}  // namespace kiln::cli
