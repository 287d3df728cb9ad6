// splitmix64's finalizer: 64 bits in, 64 well-mixed bits out. The counter-based random draws
// of sampling (ir/token_sampling.h) and the prefix cache's block keys
// (runtime/inference/prefix_cache.h) are built from it; kernels/sampling.cuh repeats it in
// device code, bit for bit (tests/gpu_ops_test.cc compares the draws).
#pragma once

#include <cstdint>

namespace kiln {

inline uint64_t MixBits(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace kiln
