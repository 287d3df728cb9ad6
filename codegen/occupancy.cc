#include "codegen/occupancy.h"

#include <algorithm>
#include <climits>

namespace kiln {
namespace {

// Per SM, by compute capability (the CUDA C++ Programming Guide's table of technical
// specifications): 64 K registers on all of these; threads, block slots and shared memory
// differ.
struct SmLimits {
  int64_t threads = 2048;
  int blocks = 32;
  int64_t shared_bytes = 228 * 1024;
};

SmLimits LimitsFor(int compute_capability) {
  switch (compute_capability) {
    case 80:
      return {.threads = 2048, .blocks = 32, .shared_bytes = 164 * 1024};
    case 86:
      return {.threads = 1536, .blocks = 16, .shared_bytes = 100 * 1024};
    case 89:
      return {.threads = 1536, .blocks = 24, .shared_bytes = 100 * 1024};
    default:  // 90 and what kiln does not know better than Hopper
      return {.threads = 2048, .blocks = 32, .shared_bytes = 228 * 1024};
  }
}

constexpr int64_t kRegistersPerSm = 64 * 1024;
constexpr int64_t kRegisterUnit = 256;  // registers are allocated a warp at a time, in these units
constexpr int64_t kReservedSharedPerBlock = 1024;
constexpr int64_t kSharedUnit = 128;
constexpr int64_t kWarpSize = 32;

int64_t RoundUp(int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; }

}  // namespace

Occupancy BlocksPerSm(const Target& target, int64_t threads, int registers, int64_t shared_bytes) {
  const SmLimits sm = LimitsFor(target.compute_capability);
  if (threads < 1 || threads > 1024 || registers < 0 || registers > 255 || shared_bytes < 0) return {};
  const int64_t warps = (threads + kWarpSize - 1) / kWarpSize;
  Occupancy o{.blocks_per_sm = sm.blocks, .limit = "blocks"};
  auto limit = [&](int64_t blocks, const char* why) {
    if (blocks < o.blocks_per_sm) o = {.blocks_per_sm = static_cast<int>(std::max<int64_t>(blocks, 0)), .limit = why};
  };
  limit(sm.threads / (warps * kWarpSize), "threads");
  const int64_t registers_per_warp = RoundUp(std::max(registers, 1) * kWarpSize, kRegisterUnit);
  limit(kRegistersPerSm / registers_per_warp / warps, "registers");
  const int64_t shared_per_block = RoundUp(shared_bytes + kReservedSharedPerBlock, kSharedUnit);
  limit(sm.shared_bytes / shared_per_block, "shared memory");
  return o;
}

}  // namespace kiln
