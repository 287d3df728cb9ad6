// What a run will allocate, estimated before it allocates: every command compares its
// estimate with what the machine has and refuses, with both figures, when it cannot fit,
// rather than dying of std::bad_alloc or the OOM killer partway through.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace kiln {

// Bytes the CPU reference backend holds at its peak while evaluating `f` once: the
// arguments (the caller's copies), plus every value that an output depends on, from the
// node that computes it to its last reader (ir/reference_backend.cc frees values
// there), each element a double. Saturates at INT64_MAX instead of overflowing.
int64_t ReferencePeakBytes(const Function& f);

// The same liveness at each value's own element size: the least a device arena needs.
int64_t DevicePeakBytes(const Function& f);

// The sum of byte counts, saturating at INT64_MAX.
int64_t SaturatingSum(std::initializer_list<int64_t> bytes);

// Bytes of `elements` values held as HostTensor doubles, saturating.
int64_t HostTensorBytes(double elements);

// What the machine can give this process now: MemAvailable from /proc/meminfo, or, where
// that file is missing, free pages times the page size (sysconf).
struct HostMemory {
  int64_t available_bytes = 0;
  std::string source;  // "MemAvailable in /proc/meminfo"
};
absl::StatusOr<HostMemory> AvailableHostMemory();

// Ok when `needed_bytes` fit in the available host memory; else ResourceExhausted:
// "training llama-M (...) on the CPU needs about 106.6 GiB of host memory (...), but 22.5
// GiB are available (MemAvailable in /proc/meminfo)". `what` names the run and `detail` says
// what the figure is made of.
absl::Status CheckFitsHostMemory(int64_t needed_bytes, absl::string_view what, absl::string_view detail);

// "39.4 GiB", "512 MiB", "12 KiB", "100 bytes".
std::string FormatBytes(int64_t bytes);

}  // namespace kiln
