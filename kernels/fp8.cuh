// Delayed scaling's three ops (ir/op_table.h), bit for bit as ir/reference/fp8_ops.cc and
// ir/fp8_scaling.cc define them:
//   fp8_quantize(x, state) -> (q, amax, scale_inv[, q_t][, next_state])   one launch:
//     Fp8Quantize            x read once in chunks of 16 elements (16 bytes of q), a
//                            grid-stride loop; q and the amax
//     Fp8QuantizeTransposed  with q_t: x as [R, C] in 128 x 128 tiles, one per block; q
//                            written from the loads, q_t from a shared-memory tile of the fp8
//                            bytes, both with coalesced 16-byte rows where R and C allow
//     both end in Fp8QuantizeFinishBlock: each block's max |x| joins an atomic max in
//     module-scope memory, and the last block to finish writes amax and scale_inv, and with
//     update_state the next state (fp8_scale_update's arithmetic, over the state in place:
//     every other block read its scale before it counted itself finished)
//   fp8_dequantize(q, scale_inv) -> out                     Fp8Dequantize, a grid-stride loop
//   fp8_scale_update(state, amax) -> next state             Fp8ScaleUpdate, one block
//
// Why the quantize is exact: with |e| <= 64, x 2^e is exact in f32 unless it overflows (inf,
// which saturates like the reference's value above the format's largest) or falls below
// f32's normal range (then its fp8 value is ±0 either way: fp8's smallest subnormal is
// 2^-16). So the one rounding is cvt.rn.satfinite's, to nearest even, as the reference's
// (NaN stays NaN). The amax is the max of |x|'s bits as unsigned ints: for non-negative
// floats their order is the values' order, and every NaN's bits lie above +inf's, so a NaN
// wins as in the reference; the max does not depend on the order, so atomics keep it
// deterministic.
//
// Buffers start 16-byte aligned (the arena aligns every buffer to 256).
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- helpers

template <typename TQ>
struct Fp8Format;
template <>
struct Fp8Format<__nv_fp8_e4m3> {
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E4M3;
};
template <>
struct Fp8Format<__nv_fp8_e5m2> {
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E5M2;
};

constexpr int kFp8MinExponent = -64;
constexpr int kFp8MaxExponent = 64;

// ir/fp8_scaling.h's Fp8ScaleExponent: floor(v) clamped to [-64, 64], NaN -> 0 (±inf clamp).
__device__ __forceinline__ int Fp8ScaleExponent(float v) {
  if (v != v) return 0;
  return static_cast<int>(
      fminf(fmaxf(floorf(v), static_cast<float>(kFp8MinExponent)), static_cast<float>(kFp8MaxExponent)));
}

// 2^e exactly, for e in f32's normal range (here |e| <= 64).
__device__ __forceinline__ float Pow2(int e) { return __int_as_float((127 + e) << 23); }

// Two values x 2^e rounded once to fp8 (saturating, NaN kept); a in the low byte.
template <typename TQ>
__device__ __forceinline__ unsigned int QuantizePair(float a, float b, float scale) {
  return __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(a, scale), __fmul_rn(b, scale)), __NV_SATFINITE,
                                  Fp8Format<TQ>::kKind);
}

template <typename TQ>
__device__ __forceinline__ unsigned char QuantizeOne(float a, float scale) {
  return __nv_cvt_float_to_fp8(__fmul_rn(a, scale), __NV_SATFINITE, Fp8Format<TQ>::kKind);
}

// N values (N a multiple of 4) quantized into N / 4 words, element 0 in word 0's low byte.
template <typename TQ, int N>
__device__ __forceinline__ void QuantizeWords(const float (&v)[N], float scale, unsigned int (&words)[N / 4]) {
#pragma unroll
  for (int w = 0; w < N / 4; ++w) {
    words[w] =
        QuantizePair<TQ>(v[4 * w], v[4 * w + 1], scale) | (QuantizePair<TQ>(v[4 * w + 2], v[4 * w + 3], scale) << 16);
  }
}

// N consecutive elements at p (N * sizeof(T) bytes, aligned to that) in one load, as floats.
template <int N, typename T>
__device__ __forceinline__ void LoadChunk(const T* p, float (&v)[N]) {
  struct alignas(N * sizeof(T)) Chunk {
    T values[N];
  };
  const Chunk chunk = *reinterpret_cast<const Chunk*>(p);
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = ToFloat(chunk.values[j]);
}

// Neither inf nor NaN (by the bits: NVRTC has no <cmath>).
__device__ __forceinline__ bool IsFinite(float v) { return (__float_as_uint(v) & 0x7fffffffu) < 0x7f800000u; }

// |v|'s bits: ordered as the values for every non-negative float, NaNs above +inf.
__device__ __forceinline__ unsigned int AbsBits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// ------------------------------------------------------------------------------- scale update

// ir/fp8_scaling.h's Fp8ExponentForAmax in f32, for a finite m > 0: frexpf's exponents are
// within one of the answer, and each step's m 2^e lies near max_finite, so ldexpf is exact.
__device__ __forceinline__ int Fp8ExponentForAmax(float m, float max_finite, int margin) {
  int m_exp = 0, max_exp = 0;
  frexpf(m, &m_exp);
  frexpf(max_finite, &max_exp);
  int e = max_exp - m_exp;
  while (ldexpf(m, e) > max_finite) --e;
  while (ldexpf(m, e + 1) <= max_finite) ++e;
  return min(max(e - margin, kFp8MinExponent), kFp8MaxExponent);
}

// fp8_scale_update: the next state (kN = L + 2 floats: e, overflows, the amax history newest
// first) from `state` and this step's amax, as ir/fp8_scaling.cc's Fp8ScaleUpdate:
//   amax not finite: history kept, overflows + 1, e - 1 (at least -64)
//   else: history shifted with amax first; m = its max (the reference's std::max from 0:
//         NaNs and values <= 0 never win); e = Fp8ExponentForAmax(m) when m > 0, else kept.
// Launch: one block of kThreads. Every thread reads its elements before the reduction's
// barriers and writes them after, so out may be state's own buffer. A history holding +inf
// (which this op never writes) gives e = -64, as the reference does. Fp8ScaleUpdateBlock
// takes this step's amax as a value `a` (the quantize kernel's last block calls it);
// Fp8ScaleUpdate, an unfused fp8_scale_update's kernel, reads it from amax.
template <long long kN, int kThreads>
__device__ __forceinline__ void Fp8ScaleUpdateBlock(float* out, const float* state, float a, float max_finite,
                                                    int margin) {
  static_assert(kN >= 3, "a state is [e, overflows, L >= 1 amaxes]");
  constexpr int kPer = static_cast<int>(CeilDiv(kN, kThreads));
  const float overflows = state[1];
  const int e = Fp8ScaleExponent(state[0]);
  const bool overflow = !IsFinite(a);
  float next[kPer];
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const long long i = threadIdx.x + static_cast<long long>(k) * kThreads;
    next[k] = 0.f;
    if (i < 2 || i >= kN) continue;
    if (overflow) {
      next[k] = state[i];
    } else {
      next[k] = i == 2 ? a : state[i - 1];
      m = m < next[k] ? next[k] : m;
    }
  }
  // The partial maxima are +0 or positive, never NaN: fmaxf is their max.
  m = BlockReduce<kThreads>(m, MaxOp(), 0.f);
  int e_next = e;
  if (overflow) {
    e_next = max(e - 1, kFp8MinExponent);
  } else if (m > 0.f) {
    e_next = IsFinite(m) ? Fp8ExponentForAmax(m, max_finite, margin) : kFp8MinExponent;
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const long long i = threadIdx.x + static_cast<long long>(k) * kThreads;
    if (i >= kN) continue;
    out[i] = i == 0   ? static_cast<float>(e_next)
             : i == 1 ? (overflow ? __fadd_rn(overflows, 1.f) : overflows)
                      : next[k];
  }
}

template <long long kN, int kThreads>
__device__ __forceinline__ void Fp8ScaleUpdate(float* out, const float* state, const float* amax, float max_finite,
                                               int margin) {
  Fp8ScaleUpdateBlock<kN, kThreads>(out, state, amax[0], max_finite, margin);
}

// ------------------------------------------------------------------------------- quantize

// Where a quantize kernel's blocks put what they found. amax_bits and blocks_done are the
// kernel's module-scope words: zero at load, and the last block leaves them zero, so every
// launch (each step's graph replay) starts from zero; a node's kernels run one at a time on
// one stream. amax, scale_inv and next_state may be null (not needed; no update_state).
struct Fp8QuantizeFinish {
  float* amax;
  float* scale_inv;
  float* next_state;
  unsigned int* amax_bits;
  unsigned int* blocks_done;
  float max_finite;  // of the quantize's format: the scale update's
  int margin;
};

// Called by every thread of every block with its max AbsBits (`bits`) and the scale's
// exponent e: the block's max joins the atomic max, and the last block to finish (the classic
// last-block reduction: publish, fence, count; the last block fences again before reading)
// writes the results. kStateN: the state's length (L + 2).
template <int kThreads, long long kStateN>
__device__ __forceinline__ void Fp8QuantizeFinishBlock(const Fp8QuantizeFinish& finish, const float* state,
                                                       unsigned int bits, int e) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block of whole warps");
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ unsigned int warp_max[kWarps];
  __shared__ bool is_last_block;
  __shared__ float amax;
  const int lane = threadIdx.x % kWarpSize;
  bits = __reduce_max_sync(0xffffffffu, bits);
  if (lane == 0) warp_max[threadIdx.x / kWarpSize] = bits;
  __syncthreads();  // also: every thread of the block has read the state
  if (threadIdx.x < kWarpSize) {
    bits = __reduce_max_sync(0xffffffffu, lane < kWarps ? warp_max[lane] : 0u);
    if (lane == 0) {
      if (bits != 0) atomicMax(finish.amax_bits, bits);
      __threadfence();
      is_last_block = atomicAdd(finish.blocks_done, 1u) == gridDim.x - 1;
    }
  }
  __syncthreads();
  if (!is_last_block) return;
  __threadfence();
  if (threadIdx.x == 0) {
    amax = __uint_as_float(atomicOr(finish.amax_bits, 0u));  // every block's max, read at L2
    if (finish.amax != nullptr) *finish.amax = amax;
    if (finish.scale_inv != nullptr) *finish.scale_inv = Pow2(-e);
    *finish.amax_bits = 0u;  // for the next launch
    *finish.blocks_done = 0u;
  }
  __syncthreads();
  if (finish.next_state != nullptr) {
    Fp8ScaleUpdateBlock<kStateN, kThreads>(finish.next_state, state, amax, finish.max_finite, finish.margin);
  }
}

// q = fp8(x 2^e) over kN elements and the amax. Launch: any grid of kThreads-thread blocks, a
// grid-stride loop over chunks of 16 elements (one 16-byte store of q, 16 bytes of x per
// load); the last kN % 16 elements by block 0. q may be null (not needed).
template <typename TX, typename TQ, long long kN, int kThreads, long long kStateN>
__device__ __forceinline__ void Fp8Quantize(TQ* q, const TX* x, const float* state, Fp8QuantizeFinish finish) {
  constexpr int kChunk = 16;
  constexpr long long kChunks = kN / kChunk;
  constexpr int kTail = static_cast<int>(kN % kChunk);
  const int e = Fp8ScaleExponent(state[0]);
  const float scale = Pow2(e);
  unsigned int bits = 0;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long c = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; c < kChunks; c += stride) {
    float v[kChunk];
    LoadFloats(x + c * kChunk, v);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) bits = max(bits, AbsBits(v[j]));
    unsigned int words[kChunk / 4];
    QuantizeWords<TQ>(v, scale, words);
    if (q != nullptr) *reinterpret_cast<uint4*>(q + c * kChunk) = make_uint4(words[0], words[1], words[2], words[3]);
  }
  if (kTail != 0 && blockIdx.x == 0 && threadIdx.x < kTail) {
    const long long i = kChunks * kChunk + threadIdx.x;
    const float v = ToFloat(x[i]);
    bits = max(bits, AbsBits(v));
    if (q != nullptr) reinterpret_cast<unsigned char*>(q)[i] = QuantizeOne<TQ>(v, scale);
  }
  Fp8QuantizeFinishBlock<kThreads, kStateN>(finish, state, bits, e);
}

// The transposing form: x as [kRows, kCols] (kCols its last dim), q as x is and q_t its
// transpose [kCols, kRows], and the amax. Launch: CeilDiv(kRows, 128) * CeilDiv(kCols, 128)
// blocks of kFp8TileThreads, one 128 x 128 tile each (tiles row-major over x).
//   Loads: chunks of kInVec elements along a row of x (kInVec divides kCols; 16 bytes at
//          most), a warp over whole 128-column rows of the tile; each chunk's fp8 bytes go to
//          q at once and into the shared tile.
//   Stores of q_t: thread (rg = t % 8, cg = t / 8) holds tile rows 16 rg .. 16 rg + 15 of
//          columns 4 cg .. 4 cg + 3 (one 4-byte word of each row), transposes those 4 x 16
//          bytes in registers and writes 16 bytes to each of q_t's rows 4 cg .. 4 cg + 3, in
//          pieces of kOutVec bytes (kOutVec divides kRows; 16 at most): a warp writes four
//          128-byte runs of q_t per store.
//   The tile's word w of row r sits at column word w ^ (4 (r / 16 % 8)): the stores' reads
//          (eight row groups of four words in a warp) hit 32 distinct banks, and since the
//          XOR keeps a word's two low bits, a chunk's words (two at most, from an even word)
//          stay adjacent and aligned for one shared-memory store.
// q or q_t may be null (not needed).
constexpr int kFp8Tile = 128;
constexpr int kFp8TileThreads = 256;

// The byte of the shared tile that holds element (r, c) of the 128 x 128 tile.
__device__ __forceinline__ int Fp8TileByte(int r, int c) {
  const int word = (c >> 2) ^ (((r >> 4) & 7) << 2);
  return r * kFp8Tile + 4 * word + (c & 3);
}

template <typename TX, typename TQ, long long kRows, long long kCols, int kInVec, int kOutVec, long long kStateN>
__device__ __forceinline__ void Fp8QuantizeTransposed(TQ* q, TQ* q_t, const TX* x, const float* state,
                                                      Fp8QuantizeFinish finish) {
  static_assert(kInVec == 1 || kInVec == 2 || kInVec == 4 || (kInVec == 8 && sizeof(TX) <= 2),
                "loads of 16 bytes at most");
  static_assert(kCols % kInVec == 0 && kRows % kOutVec == 0, "whole chunks in every row");
  static_assert(kOutVec == 1 || kOutVec == 2 || kOutVec == 4 || kOutVec == 8 || kOutVec == 16,
                "pieces of a 16-byte run");
  constexpr int kThreads = kFp8TileThreads;
  constexpr long long kTileCols = CeilDiv(kCols, kFp8Tile);
  __shared__ __align__(16) unsigned char tile[kFp8Tile * kFp8Tile];
  const long long r0 = static_cast<long long>(blockIdx.x / kTileCols) * kFp8Tile;
  const long long c0 = static_cast<long long>(blockIdx.x % kTileCols) * kFp8Tile;
  const int e = Fp8ScaleExponent(state[0]);
  const float scale = Pow2(e);
  unsigned char* q_bytes = reinterpret_cast<unsigned char*>(q);
  unsigned int bits = 0;

  // An f32 tensor (a master weight: one 128 x 128 tile per block makes a grid of about one
  // block per SM, 15-27% of the copy bandwidth measured with one load at a time) issues its
  // loads 8 at a time, each batch before any of it is used, to keep bytes in flight; other
  // inputs (the activations' and gradients' big grids) one at a time, unrolled by 4, at
  // their lower register count (40 against 80: twice the blocks per SM).
  constexpr int kChunksPerRow = kFp8Tile / kInVec;
  constexpr int kLoads = kFp8Tile * kChunksPerRow / kThreads;
  static_assert(kFp8Tile * kChunksPerRow % kThreads == 0, "whole loads per thread");
  constexpr int kBatch = sizeof(TX) == 4 && kInVec == 4 ? 8 : 1;
  static_assert(kLoads % kBatch == 0, "whole batches");
#pragma unroll(kBatch == 1 ? 4 : 1)
  for (int b = 0; b < kLoads; b += kBatch) {
    float v[kBatch][kInVec];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int k = threadIdx.x + (b + i) * kThreads;
      const int r = k / kChunksPerRow, c = (k % kChunksPerRow) * kInVec;
      const long long row = r0 + r, col = c0 + c;
      if (row < kRows && col < kCols) LoadChunk(x + row * kCols + col, v[i]);  // a chunk is all in or out
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int k = threadIdx.x + (b + i) * kThreads;
      const int r = k / kChunksPerRow, c = (k % kChunksPerRow) * kInVec;
      const long long row = r0 + r, col = c0 + c;
      if (row >= kRows || col >= kCols) continue;
      const long long at = row * kCols + col;
#pragma unroll
      for (int j = 0; j < kInVec; ++j) bits = max(bits, AbsBits(v[i][j]));
      if constexpr (kInVec >= 4) {
        unsigned int words[kInVec / 4];
        QuantizeWords<TQ>(v[i], scale, words);
        if constexpr (kInVec == 4) {
          *reinterpret_cast<unsigned int*>(tile + Fp8TileByte(r, c)) = words[0];
          if (q_bytes != nullptr) *reinterpret_cast<unsigned int*>(q_bytes + at) = words[0];
        } else {
          *reinterpret_cast<uint2*>(tile + Fp8TileByte(r, c)) = make_uint2(words[0], words[1]);
          if (q_bytes != nullptr) *reinterpret_cast<uint2*>(q_bytes + at) = make_uint2(words[0], words[1]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kInVec; ++j) {
          const unsigned char q8 = QuantizeOne<TQ>(v[i][j], scale);
          tile[Fp8TileByte(r, c + j)] = q8;
          if (q_bytes != nullptr) q_bytes[at + j] = q8;
        }
      }
    }
  }
  __syncthreads();

  if (q_t != nullptr) {
    const int rg = threadIdx.x % 8, cg = threadIdx.x / 8;
    unsigned int w[16];  // w[j]: tile row 16 rg + j, columns 4 cg .. 4 cg + 3
#pragma unroll
    for (int j = 0; j < 16; ++j) w[j] = *reinterpret_cast<const unsigned int*>(tile + Fp8TileByte(16 * rg + j, 4 * cg));
    unsigned int t[4][4];  // t[k][m]: column 4 cg + k, rows 16 rg + 4 m .. + 3
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const unsigned int lo01 = __byte_perm(w[4 * m], w[4 * m + 1], 0x5140),
                         hi01 = __byte_perm(w[4 * m], w[4 * m + 1], 0x7362);
      const unsigned int lo23 = __byte_perm(w[4 * m + 2], w[4 * m + 3], 0x5140),
                         hi23 = __byte_perm(w[4 * m + 2], w[4 * m + 3], 0x7362);
      t[0][m] = __byte_perm(lo01, lo23, 0x5410);
      t[1][m] = __byte_perm(lo01, lo23, 0x7632);
      t[2][m] = __byte_perm(hi01, hi23, 0x5410);
      t[3][m] = __byte_perm(hi01, hi23, 0x7632);
    }
    const long long row = r0 + 16 * rg;  // q_t's column
    unsigned char* q_t_bytes = reinterpret_cast<unsigned char*>(q_t);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const long long col = c0 + 4 * cg + k;  // q_t's row
      if (col >= kCols) break;
      unsigned char* dst = q_t_bytes + col * kRows + row;
      if constexpr (kOutVec == 16) {
        if (row < kRows) *reinterpret_cast<uint4*>(dst) = make_uint4(t[k][0], t[k][1], t[k][2], t[k][3]);
      } else if constexpr (kOutVec == 8) {
        if (row < kRows) *reinterpret_cast<uint2*>(dst) = make_uint2(t[k][0], t[k][1]);
        if (row + 8 < kRows) *reinterpret_cast<uint2*>(dst + 8) = make_uint2(t[k][2], t[k][3]);
      } else if constexpr (kOutVec == 4) {
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          if (row + 4 * m < kRows) *reinterpret_cast<unsigned int*>(dst + 4 * m) = t[k][m];
        }
      } else {
#pragma unroll
        for (int p = 0; p < 16; p += kOutVec) {
          if (row + p >= kRows) break;
          const unsigned int word = t[k][p / 4];
          if constexpr (kOutVec == 2) {
            *reinterpret_cast<unsigned short*>(dst + p) = static_cast<unsigned short>(word >> (8 * (p % 4)));
          } else {
            dst[p] = static_cast<unsigned char>(word >> (8 * (p % 4)));
          }
        }
      }
    }
  }
  Fp8QuantizeFinishBlock<kThreads, kStateN>(finish, state, bits, e);
}

// out = TO(q scale_inv) over kN elements: the product of an fp8 value (4 significant bits)
// and an f32 (24) is exact in double, then rounded once to TO (for any scale_inv, not only
// the powers of two fp8_quantize writes, as the reference does). Launch: any grid of
// kThreads-thread blocks, a grid-stride loop over chunks of 16 elements (one 16-byte load of
// q); the last kN % 16 elements by block 0.
template <typename TO>
__device__ __forceinline__ TO RoundFromDouble(double v);
template <>
__device__ __forceinline__ float RoundFromDouble<float>(double v) {
  return __double2float_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 RoundFromDouble<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);
}
template <>
__device__ __forceinline__ __half RoundFromDouble<__half>(double v) {
  return __double2half(v);
}

template <typename TQ, typename TO, long long kN, int kThreads>
__device__ __forceinline__ void Fp8Dequantize(TO* out, const TQ* q, const float* scale_inv) {
  constexpr int kChunk = 16;
  constexpr long long kChunks = kN / kChunk;
  constexpr int kTail = static_cast<int>(kN % kChunk);
  constexpr int kPer = Packed128<TO>::kSize;
  const double s = scale_inv[0];
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long c = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; c < kChunks; c += stride) {
    const uint4 packed = *reinterpret_cast<const uint4*>(q + c * kChunk);
    const unsigned int words[4] = {packed.x, packed.y, packed.z, packed.w};
    float v[kChunk];
#pragma unroll
    for (int p = 0; p < kChunk / 2; ++p) {
      const __half2 h(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[p / 2] >> (16 * (p % 2))),
                                                 Fp8Format<TQ>::kKind));
      const float2 f = __half22float2(h);  // fp8 -> f16 -> f32: exact
      v[2 * p] = f.x, v[2 * p + 1] = f.y;
    }
#pragma unroll
    for (int j = 0; j < kChunk; j += kPer) {
      Packed128<TO> o;
#pragma unroll
      for (int k = 0; k < kPer; ++k) o[k] = RoundFromDouble<TO>(__dmul_rn(static_cast<double>(v[j + k]), s));
      Store128(out + c * kChunk + j, o);
    }
  }
  if (kTail != 0 && blockIdx.x == 0 && threadIdx.x < kTail) {
    const long long i = kChunks * kChunk + threadIdx.x;
    out[i] = RoundFromDouble<TO>(__dmul_rn(static_cast<double>(ToFloat(q[i])), s));
  }
}

}  // namespace kiln::kernels
