// The GPU a compile is for (DESIGN.md, "Backend ops for a Target"): its NVRTC architecture,
// how many SMs it has, how much shared memory a block may take, and which of Hopper's
// features it offers. Read from the device (runtime/cuda/device.h) or named with `--target`;
// passes choose implementations by it and codegen sizes grids by it, so nothing hard-codes a
// particular GPU. Plain data: passes/ knows nothing of CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

struct Target {
  std::string arch = "sm_90a";  // the NVRTC architecture: "sm_90a", "sm_89", "sm_80"
  int compute_capability = 90;  // major * 10 + minor
  int sm_count = 132;
  int64_t shared_memory_per_block = 227 * 1024;  // the opt-in maximum, bytes
  bool has_wgmma = true;  // warpgroup MMA (sm_90a only: the 'a' features)
  bool has_tma = true;    // the tensor memory accelerator (bulk tensor copies)
  bool has_fp8 = true;    // FP8 (E4M3, E5M2) tensor-core GEMMs
  // Where these values came from: "device 0 (NVIDIA H200)" or "--target sm_90a (nominal)".
  std::string source = "default (sm_90a, nominal)";

  // "sm_90a: 132 SMs, 227 KiB shared memory per block, wgmma, tma, fp8 (device 0 ...)".
  std::string ToString() const;
};

// The nominal target of an architecture, as `--target ARCH` gives it: the SM count of the
// family's data-centre part (sm_90a: H100 SXM / H200, 132; sm_80: A100, 108; sm_89: L40S,
// 142), its shared memory and features. An unknown name is an error listing the known ones.
absl::StatusOr<Target> TargetForArch(absl::string_view arch);
std::vector<std::string> KnownTargetArchs();

// The target of a device of compute capability `major`.`minor` with `sm_count` SMs and
// `shared_memory_per_block` opt-in bytes (what the CUDA runtime reports).
Target TargetForDevice(int major, int minor, int sm_count, int64_t shared_memory_per_block, std::string source);

}  // namespace kiln
