// How many blocks of a kernel an SM holds at once, and what limits it: threads, registers,
// shared memory or the SM's block slots, as the CUDA occupancy calculator reckons them for the
// target's compute capability (registers allocated a warp at a time in units of 256, shared
// memory with the 1 KB the driver reserves a block on sm_80 and later). For reading a
// kernel's resources (kiln compile --kernels-dir): a GEMV that streams its weight is bound by
// the loads it keeps in flight, so one block fewer an SM is bandwidth lost.
#pragma once

#include <cstdint>
#include <string>

#include "passes/target.h"

namespace kiln {

struct Occupancy {
  int blocks_per_sm = 0;  // 0: the block does not fit (too many threads, registers or bytes)
  std::string limit;      // "threads", "registers", "shared memory" or "blocks"
};

// `threads` a block, `registers` a thread, `shared_bytes` a block (static and dynamic).
Occupancy BlocksPerSm(const Target& target, int64_t threads, int registers, int64_t shared_bytes);

}  // namespace kiln
