// sample_tokens (ir/op_table.h) on the GPU: a block per row draws the row's token exactly as
// ir/token_sampling.h's SampleToken does on the host. The masses are integers, so every sum
// below is exact in any order: the block reduces and scans them in parallel and still cuts
// and draws where the host's sequential loops do (the host's expf and the device's may
// differ in the last bit of a weight; that moves a mass by a unit in 2^40, and a draw only
// if its target falls in that unit).
//
// The steps, each a pass over the row's logits (64 KB of bf16 for a 32000-token vocabulary,
// read from L2 after the first):
//   1. the largest logit and its first index (greedy's token), and whether any logit is NaN
//      or +inf;
//   2. top-k: the k-th of the ranked order by a radix select of the logits' order-preserving
//      keys (four passes of 8 bits, a histogram of counts each), then, among the logits equal
//      to it, the cut by id (a block scan of counts in id order);
//   3. top-p: the cut where the ranked mass reaches `need`, by a radix select whose
//      histograms hold masses instead of counts, then among equal logits the cut by id;
//   4. the draw: each thread's mass of kept tokens over a contiguous range of ids, a block
//      scan, and the thread whose range holds the target finds the token.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {
namespace sampling {

constexpr int kMassBits = 40;
constexpr int kChunkBits = 11;
constexpr int kMassChunks = 4;  // 44 bits
constexpr int kMaxVocab = 1 << 21;

__device__ __forceinline__ unsigned long long Mix(unsigned long long x) {  // ir/mix_bits.h, in device code
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

__device__ __forceinline__ unsigned long long UniformBits(unsigned long long seed, long long draw) {
  return Mix(Mix(seed) ^ Mix(static_cast<unsigned long long>(draw) + 0x9e3779b97f4a7c15ULL)) >> 11;
}

// A key whose unsigned order is the logits' order (-0 and +0 one key, as they compare equal).
__device__ __forceinline__ unsigned OrderKey(float v) {
  const unsigned bits = __float_as_uint(v == 0.f ? 0.f : v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float FromOrderKey(unsigned key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ unsigned long long Mass(float logit, float max, float scale) {
  if (logit == max) return 1ULL << kMassBits;
  const float w = expf((logit - max) * scale);
  return __float2ull_rn(w * 0x1p40f);
}

// Ranked at or before the cut (key, id): a larger key, or the same key and an id not above.
__device__ __forceinline__ bool AtOrBefore(unsigned key, int id, unsigned cut_key, int cut_id) {
  return key > cut_key || (key == cut_key && id <= cut_id);
}

template <int kThreads>
struct Shared {
  static constexpr int kWarps = kThreads / 32;
  unsigned long long warp_u64[kWarps];
  float warp_float[kWarps];
  int warp_int[kWarps];
  // A radix pass's bins: a count, or a mass (below 2^41) in kMassChunks chunks of
  // kChunkBits, each summed as a 32-bit integer (the natively atomic width: a 64-bit add on
  // shared memory is a compare-and-swap loop, which the thousands of logits of one bin
  // serialize), at most V * 2^11 < 2^32 per chunk for a vocabulary below kMaxVocab.
  unsigned histogram[kMassChunks][256];
  unsigned long long broadcast_u64[2];
  int broadcast_int[2];
};

// The block's sum of v (every thread gets it).
template <int kThreads>
__device__ unsigned long long BlockSum(unsigned long long v, Shared<kThreads>& s) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) s.warp_u64[warp] = v;
  __syncthreads();
  unsigned long long total = 0;
  for (int w = 0; w < Shared<kThreads>::kWarps; ++w) total += s.warp_u64[w];
  return total;
}

// The sum of v over the threads before this one (in threadIdx order), and the block's total.
template <int kThreads>
__device__ unsigned long long BlockExclusiveScan(unsigned long long v, unsigned long long& total,
                                                 Shared<kThreads>& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned long long inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  __syncthreads();
  if (lane == 31) s.warp_u64[warp] = inclusive;
  __syncthreads();
  unsigned long long before = 0;
  total = 0;
  for (int w = 0; w < Shared<kThreads>::kWarps; ++w) {
    if (w < warp) before += s.warp_u64[w];
    total += s.warp_u64[w];
  }
  return before + inclusive - v;
}

// Adds `value` (a count, or a mass below 2^44) to bin `digit` (256: none) of the histogram
// (every lane of the warp calls it, none exited). A count: once per group of lanes sharing a
// digit, by the group's lowest lane. A mass: summed over the warp first where every lane
// shares the digit (a radix select's first passes, where most logits share their high
// bits), else each lane adds its own: a reduction over a group of some lanes (redux.sync
// with a partial mask) runs once per group, as slow as the atomics it would save.
template <bool kMass, int kThreads>
__device__ __forceinline__ void AddToBin(unsigned digit, unsigned long long value, Shared<kThreads>& s) {
  const unsigned peers = __match_any_sync(0xffffffffu, digit);
  if (!kMass) {
    const bool leader = (threadIdx.x % 32) == static_cast<unsigned>(__ffs(peers) - 1);
    if (leader && digit < 256) atomicAdd(&s.histogram[0][digit], static_cast<unsigned>(__popc(peers)));
    return;
  }
  if (digit >= 256 && peers == 0xffffffffu) return;  // no lane adds
  for (int chunk = 0; chunk < kMassChunks; ++chunk) {
    const unsigned part = static_cast<unsigned>(value >> (kChunkBits * chunk)) & ((1u << kChunkBits) - 1);
    if (peers == 0xffffffffu) {
      const unsigned sum = __reduce_add_sync(0xffffffffu, part);
      if (threadIdx.x % 32 == 0 && sum != 0) atomicAdd(&s.histogram[chunk][digit], sum);
    } else if (digit < 256 && part != 0) {
      atomicAdd(&s.histogram[chunk][digit], part);
    }
  }
}

template <int kThreads>
__device__ __forceinline__ unsigned long long Bin(int d, const Shared<kThreads>& s) {
  unsigned long long bin = 0;
  for (int chunk = 0; chunk < kMassChunks; ++chunk) {
    bin += static_cast<unsigned long long>(s.histogram[chunk][d]) << (kChunkBits * chunk);
  }
  return bin;
}

// Of the radix select's 256 bins (histogram, largest digit last), the digit where the running
// sum from the top first reaches `want`; `want` becomes what remains of it within that digit.
// The first warp finds it: each lane sums 8 bins (lane 0 the top 8), a scan over the lanes,
// and the lane where the sum reaches `want` walks its bins. The answer is broadcast.
template <int kThreads>
__device__ unsigned PickDigit(unsigned long long& want, Shared<kThreads>& s) {
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    unsigned long long bins[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += bins[j] = Bin(255 - 8 * lane - j, s);
    unsigned long long inclusive = sum;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long up = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += up;
    }
    // Some lane reaches it: the bins hold every candidate of the prefix, which reach want.
    const unsigned reached = __ballot_sync(0xffffffffu, inclusive >= want);
    if (lane == __ffs(reached) - 1) {
      unsigned long long above = inclusive - sum;
      int digit = 255 - 8 * lane - 7;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (above + bins[j] >= want) {
          digit = 255 - 8 * lane - j;
          break;
        }
        above += bins[j];
      }
      s.broadcast_int[0] = digit;
      s.broadcast_u64[0] = want - above;
    }
  }
  __syncthreads();
  want = s.broadcast_u64[0];
  const unsigned digit = static_cast<unsigned>(s.broadcast_int[0]);
  __syncthreads();
  return digit;
}

template <int kThreads>
__device__ void ClearHistogram(Shared<kThreads>& s) {
  for (int d = threadIdx.x; d < kMassChunks * 256; d += kThreads) s.histogram[d / 256][d % 256] = 0;
  __syncthreads();
}

// The id of the `rank`-th (from 1) token in id order for which `match(id)` holds; each thread
// counts over its contiguous range [begin, end).
template <int kThreads, typename Match>
__device__ int NthMatching(unsigned long long rank, int begin, int end, Match match, Shared<kThreads>& s) {
  unsigned long long count = 0;
  for (int i = begin; i < end; ++i) count += match(i) ? 1 : 0;
  unsigned long long total;
  const unsigned long long before = BlockExclusiveScan(count, total, s);
  if (threadIdx.x == 0) s.broadcast_int[1] = -1;
  __syncthreads();
  if (before < rank && rank <= before + count) {
    unsigned long long seen = before;
    for (int i = begin; i < end; ++i) {
      if (match(i) && ++seen == rank) {
        s.broadcast_int[1] = i;
        break;
      }
    }
  }
  __syncthreads();
  const int id = s.broadcast_int[1];
  __syncthreads();
  return id;
}

}  // namespace sampling

// out[row] = the row's token; logits [rows, kVocab], sampling f32 [rows, 3] (temperature,
// top_k, top_p), draws i32 [rows, 3] (seed low, seed high, draw index). Grid: one block a row.
template <typename T, int kVocab, int kThreads>
__device__ void SampleTokens(int* __restrict__ out, const T* __restrict__ logits, const float* __restrict__ sampling,
                             const int* __restrict__ draws) {
  using namespace sampling;
  static_assert(kVocab < kMaxVocab, "a vocabulary's masses must fit the histogram's chunks");
  static_assert(kThreads % 32 == 0, "whole warps");
  __shared__ Shared<kThreads> s;
  const long long row = blockIdx.x;
  const T* x = logits + row * kVocab;
  const float temperature = sampling[row * 3], top_k_value = sampling[row * 3 + 1], top_p = sampling[row * 3 + 2];
  const unsigned long long seed = static_cast<unsigned>(draws[row * 3]) |
                                  static_cast<unsigned long long>(static_cast<unsigned>(draws[row * 3 + 1])) << 32;
  const int draw = draws[row * 3 + 2];
  // As ir/token_sampling.cc's FromOperands and ValidTokenSampling read them.
  const bool whole_top_k = top_k_value >= 0.f && top_k_value == floorf(top_k_value) && top_k_value <= 0x1p24f;
  const long long top_k = whole_top_k ? static_cast<long long>(top_k_value) : -1;
  const bool valid = temperature >= 0.f && isfinite(temperature) && top_k >= 0 && top_p > 0.f && top_p <= 1.f &&
                     draw >= 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // 1. The largest logit, its first index, and NaN or +inf anywhere.
  float best = -CUDART_INF_F;
  int best_id = kVocab;
  int bad = 0;
  for (int i = threadIdx.x; i < kVocab; i += kThreads) {
    const float v = ToFloat(x[i]);
    bad |= !(v < CUDART_INF_F);
    if (v > best || (v == best && i < best_id)) best = v, best_id = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int id = __shfl_xor_sync(0xffffffffu, best_id, o);
    if (v > best || (v == best && id < best_id)) best = v, best_id = id;
  }
  bad = __any_sync(0xffffffffu, bad);
  if (lane == 0) {
    s.warp_float[warp] = best;
    s.warp_int[warp] = best_id | (bad ? (1 << 31) : 0);
  }
  __syncthreads();
  float max = -CUDART_INF_F;
  int first_max = kVocab;
  bad = 0;
  for (int w = 0; w < Shared<kThreads>::kWarps; ++w) {
    const float v = s.warp_float[w];
    const int id = s.warp_int[w] & 0x7fffffff;
    bad |= s.warp_int[w] < 0;
    if (v > max || (v == max && id < first_max)) max = v, first_max = id;
  }
  if (!valid || bad || max == -CUDART_INF_F) {
    if (threadIdx.x == 0) out[row] = -1;
    return;
  }
  if (temperature == 0.f || top_k == 1) {
    if (threadIdx.x == 0) out[row] = first_max;
    return;
  }
  const float scale = 1.0f / temperature;
  constexpr int kChunk = (kVocab + kThreads - 1) / kThreads;
  const int begin = min(kVocab, static_cast<int>(threadIdx.x) * kChunk), end = min(kVocab, begin + kChunk);

  // 2. top-k: the cut (key, id) of the k-th token ranked; (0, kVocab) keeps every token.
  unsigned cut_key = 0;
  int cut_id = kVocab;
  if (top_k > 0 && top_k < kVocab) {
    unsigned long long want = static_cast<unsigned long long>(top_k);
    unsigned prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      ClearHistogram(s);
      for (int base = 0; base < kVocab; base += kThreads) {  // whole warps: AddToBin
        const int i = base + threadIdx.x;
        const unsigned key = i < kVocab ? OrderKey(ToFloat(x[i])) : 0u;
        AddToBin<false>(i < kVocab && (key & mask) == prefix ? (key >> shift) & 255u : 256u, 1, s);
      }
      prefix |= PickDigit(want, s) << shift;
      mask |= 255u << shift;
    }
    cut_key = prefix;
    cut_id = NthMatching(want, begin, end, [&](int i) { return OrderKey(ToFloat(x[i])) == cut_key; }, s);
  }

  // 3. top-p: the cut where the ranked mass of the kept tokens reaches need.
  if (top_p < 1.f) {
    unsigned long long kept_mass = 0;
    for (int i = threadIdx.x; i < kVocab; i += kThreads) {
      const float v = ToFloat(x[i]);
      if (AtOrBefore(OrderKey(v), i, cut_key, cut_id)) kept_mass += Mass(v, max, scale);
    }
    const unsigned long long total = BlockSum(kept_mass, s);
    unsigned long long want = static_cast<unsigned long long>(static_cast<double>(top_p) * static_cast<double>(total));
    want = want > 0 ? want : 1;
    unsigned prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      ClearHistogram(s);
      for (int base = 0; base < kVocab; base += kThreads) {  // whole warps: AddToBin
        const int i = base + threadIdx.x;
        const float v = i < kVocab ? ToFloat(x[i]) : 0.f;
        const unsigned key = OrderKey(v);
        const bool in = i < kVocab && (key & mask) == prefix && AtOrBefore(key, i, cut_key, cut_id);
        AddToBin<true>(in ? (key >> shift) & 255u : 256u, in ? Mass(v, max, scale) : 0, s);
      }
      prefix |= PickDigit(want, s) << shift;
      mask |= 255u << shift;
    }
    // Equal logits weigh the same: the first `ties` of them in id order are kept.
    const float tie_logit = FromOrderKey(prefix);
    const unsigned long long tie_mass = Mass(tie_logit, max, scale);
    const unsigned long long ties = (want + tie_mass - 1) / tie_mass;
    const unsigned top_k_key = cut_key;
    const int top_k_id = cut_id;
    cut_key = prefix;
    cut_id = NthMatching(ties, begin, end,
                         [&](int i) {
                           const unsigned key = OrderKey(ToFloat(x[i]));
                           return key == prefix && AtOrBefore(key, i, top_k_key, top_k_id);
                         },
                         s);
  }

  // 4. The draw: the first kept token in id order whose running mass passes the target.
  unsigned long long mine = 0;
  for (int i = begin; i < end; ++i) {
    const float v = ToFloat(x[i]);
    if (AtOrBefore(OrderKey(v), i, cut_key, cut_id)) mine += Mass(v, max, scale);
  }
  unsigned long long total;
  const unsigned long long before = BlockExclusiveScan(mine, total, s);
  const unsigned long long target = __umul64hi(UniformBits(seed, draw) << 11, total);
  if (before <= target && target < before + mine) {
    unsigned long long running = before;
    for (int i = begin; i < end; ++i) {
      const float v = ToFloat(x[i]);
      if (AtOrBefore(OrderKey(v), i, cut_key, cut_id)) running += Mass(v, max, scale);
      if (running > target) {
        out[row] = i;
        break;
      }
    }
  }
}

}  // namespace kiln::kernels
