// What ptxas gave a compiled kernel, read back from its cubin (an ELF file): registers a
// thread, local-memory frame a thread (spills and local arrays) and static shared memory a
// block. These decide how many blocks an SM holds; `kiln compile --kernels-dir` lists them
// beside each generated kernel's source, for every kernel, cached or not (NVRTC's
// --ptxas-options=-v report is not kept in the kernel cache).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

struct KernelResources {
  int registers = 0;                 // a thread
  int64_t frame_bytes = 0;           // local memory a thread: 0 when nothing spills
  int64_t static_shared_bytes = 0;   // __shared__ arrays a block (dynamic shared memory not included)
};

// The resources of `kernel` (its symbol) in `cubin`. Errors name what is missing or malformed:
// not a 64-bit little-endian ELF, a section or record past the end, no such kernel, no
// register count for it.
absl::StatusOr<KernelResources> ReadKernelResources(absl::string_view cubin, absl::string_view kernel);

}  // namespace kiln
