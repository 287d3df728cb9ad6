// The paged KV cache on the device (DESIGN.md, "The inference lowering"): kv_cache_write
// stores token rows into pool slots, paged_attention reads K and V back through block
// tables. The pool is [L, NB, Hkv, BS, D] (layers, blocks, kv heads, block size, head dim);
// a flat slot s is offset s % BS of block s / BS. Semantics as in ir/op_table.h and
// ir/reference/paged_kv_ops.cc: P stays f32 (not rounded), so a split of the keys over
// blocks changes only the order of f32 sums (the tensor-core kernel's P is bf16 hi + lo, within
// 2^-16 of it).
//
// The split kernels (each split's partials added by the last split of each row and head, or
// by PagedAttentionCombine after them) are what codegen picks: blocks per (query row, kv head,
// key range), so that the group's query heads share every K and V row a block loads and a
// batch of one still spreads over the SMs (flash-decoding's split). PagedAttentionSplitMma, for
// bf16 pools, scores and sums a 16-key tile with mma.sync, each warp streaming its own KV
// blocks; PagedAttentionSplit, for the shapes it does not take, spreads 16-byte loads over the
// lanes of a row and the rows over the warps. PagedAttention (a warp per query head, one key
// at a time) stays for head dims whose rows are not whole 16-byte loads for a power of two of
// lanes.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// out = pool, element by element; nothing when out is pool (the result written in place).
// Launch: any grid of any block size (grid-stride).
template <typename TP, long long kN>
__device__ __forceinline__ void PoolCopy(TP* out, const TP* pool) {
  if (out == pool) return;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < kN; i += stride) {
    out[i] = pool[i];
  }
}

// out[layer, s / BS, h, s % BS, :] = x[i, h, :] for each row i with s = slots[i] in [0,
// NB * BS) (-1, padding, and anything out of range write nothing). Launch: one thread per
// element of x: grid = ceil(kRows * kHkv * kD / blockDim.x).
template <typename TX, typename TP, long long kRows, int kLayer, long long kBlocks, int kHkv, int kBs, int kD>
__device__ __forceinline__ void KvCacheWrite(TP* out, const TX* x, const int* slots) {
  const long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= kRows * kHkv * kD) return;
  const long long row = item / (kHkv * kD);
  const int h = static_cast<int>(item / kD % kHkv);
  const int d = static_cast<int>(item % kD);
  const long long slot = slots[row];
  if (slot < 0 || slot >= kBlocks * kBs) return;
  const long long block = slot / kBs;
  const int offset = static_cast<int>(slot % kBs);
  const long long at = (((static_cast<long long>(kLayer) * kBlocks + block) * kHkv + h) * kBs + offset) * kD + d;
  out[at] = FromFloat<TP>(ToFloat(x[item]));
}

// Attention of each query q[b, t, h, :] over keys 0..positions[b, t] read through
// block_tables[b, :]; out [B, T, H, D] of TO (the f32 result rounded once: f32, or the
// op's out_dtype); a negative position writes zeros. Launch: one
// warp per (b, t, h): grid = kB * kT * kH blocks of 32 threads. Lane l holds dims l, l + 32,
// ... of the query and of the output accumulator.
template <typename TP, typename TO, long long kB, long long kT, int kH, int kD, int kLayer, long long kBlocks, int kHkv,
          int kBs, int kMaxBlocks>
__device__ __forceinline__ void PagedAttention(TO* out, const TP* q, const TP* k_pool, const TP* v_pool,
                                               const int* block_tables, const int* positions, float scale) {
  constexpr int kPerLane = (kD + kWarpSize - 1) / kWarpSize;
  constexpr int kGroup = kH / kHkv;
  const long long item = blockIdx.x;  // (b * kT + t) * kH + h
  if (item >= kB * kT * kH) return;
  const int lane = threadIdx.x % kWarpSize;
  const int h = static_cast<int>(item % kH);
  const long long bt = item / kH;
  const long long b = bt / kT;
  const int position = positions[bt];
  TO* o = out + item * kD;
  if (position < 0) {
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < kD) o[d] = FromFloat<TO>(0.0f);
    }
    return;
  }
  float qv[kPerLane];
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    qv[i] = d < kD ? ToFloat(q[item * kD + d]) : 0.0f;
  }
  const int* table = block_tables + b * kMaxBlocks;
  const int head = h / kGroup;
  const int keys = min(position + 1, kMaxBlocks * kBs);
  auto key_row = [&](int j) -> long long {
    const long long block = table[j / kBs];
    return (((static_cast<long long>(kLayer) * kBlocks + block) * kHkv + head) * kBs + j % kBs) * kD;
  };
  auto score = [&](long long row) -> float {
    float partial = 0.0f;
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < kD) partial += qv[i] * ToFloat(k_pool[row + d]);
    }
    return WarpReduce(partial, SumOp{}) * scale;
  };
  // Pass 1: the row's max and sum of exp, online.
  MaxExpSum state{-CUDART_INF_F, 0.0f};
  for (int j = 0; j < keys; ++j) state = MaxExpSumOp{}(state, MaxExpSum{score(key_row(j)), 1.0f});
  // Pass 2: P times V, accumulated in f32.
  float acc[kPerLane];
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  for (int j = 0; j < keys; ++j) {
    const long long row = key_row(j);
    const float p = expf(score(row) - state.max) / state.sum;
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < kD) acc[i] += p * ToFloat(v_pool[row + d]);
    }
  }
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < kD) o[d] = FromFloat<TO>(acc[i]);
  }
}

// PagedAttentionSplit keeps its scores, and so its running maxima, in base-2 units (S times
// log2(e)): exp(S - max) is then exp2f of the difference, one MUFU.EX2 where expf is a
// sequence of about eight instructions, and the kernel's issue slots are half its time at
// batch 32 (ncu, bench/RESULTS.md session 25).
constexpr float kLog2E = 1.4426950408889634f;

// 2^(m - m_new), the factor that moves a running sum from max m to max m_new >= m (base-2
// units); 0 for a sum that has seen no key yet (m = -inf), where the difference would be NaN.
__device__ __forceinline__ float RescaleFactor(float m, float m_new) {
  return m == -CUDART_INF_F ? 0.0f : exp2f(m - m_new);
}

// An item of the split kernels is kQRows consecutive query rows of one sequence and one kv
// head: kQRows x kGroup rows r = (query row qt) * kGroup + (head of the group g). Element (r, d)
// of an item is at this offset in O from the item's first row's first head ([B, T, H, D]).
template <int kH, int kD, int kGroup>
__device__ __forceinline__ long long ItemOffset(int r, int d) {
  return (static_cast<long long>(r / kGroup) * kH + r % kGroup) * kD + d;
}

// Element (r, d) of one item (kItemRows rows of one kv head) from its kSplits partials `p`
// (PagedAttentionSplit's layout, maxima in base-2 units): the splits' sums rescaled to the
// largest max and added in split order, over the rescaled sum of exp, rounded once to TO; zero
// when no split saw a key (a padding row). `Load` reads a float of the partials (through L2
// where other blocks wrote them).
template <typename TO, int kItemRows, int kD, int kSplits, typename Load>
__device__ __forceinline__ TO CombinedElement(const float* p, int r, int d, Load load) {
  float m = -CUDART_INF_F;
  for (int split = 0; split < kSplits; ++split) m = fmaxf(m, load(p + split * kItemRows * (kD + 2) + 2 * r));
  if (m == -CUDART_INF_F) return FromFloat<TO>(0.0f);
  float total = 0.0f, sum = 0.0f;
  for (int split = 0; split < kSplits; ++split) {
    const float* s = p + split * kItemRows * (kD + 2);
    const float scale = exp2f(load(s + 2 * r) - m);  // 0 for a split without keys (max -inf)
    sum += scale * load(s + 2 * r + 1);
    total += scale * load(s + 2 * kItemRows + r * kD + d);
  }
  return FromFloat<TO>(total / sum);
}

// The combine folded into the split kernel: each block of `item` counts itself done in
// splits_done[item] once its partials are visible device-wide (the fence before the count);
// the block that counts last writes the item's kQRows x kGroup x kD outputs from `o` on
// (ItemOffset) from every split's partials and sets the count back to zero for the next
// launch. (The counts live in the kernel's module, zero when it loads:
// codegen/lower_paged_kv.cc.)
template <typename TO, int kH, int kD, int kHkv, int kSplits, int kThreads, int kQRows = 1>
__device__ __forceinline__ void CombineIfLastSplit(TO* o, const float* partials, long long item,
                                                   unsigned int* splits_done) {
  constexpr int kGroup = kH / kHkv;
  constexpr int kItemRows = kQRows * kGroup;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(splits_done + item, 1u) == kSplits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* p = partials + item * kSplits * kItemRows * (kD + 2);
  for (int i = threadIdx.x; i < kItemRows * kD; i += kThreads) {
    o[ItemOffset<kH, kD, kGroup>(i / kD, i % kD)] =
        CombinedElement<TO, kItemRows, kD, kSplits>(p, i / kD, i % kD, [](const float* a) { return __ldcg(a); });
  }
  if (threadIdx.x == 0) splits_done[item] = 0;
}

// What a split kernel's block computes: split `split` of item (query rows bt .. bt + kQRows - 1
// of sequence b, bt = b * kT + t, kv head `head`), item (bt / kQRows) * kHkv + head (kT a
// multiple of kQRows: an item's rows are one sequence's).
struct SplitBlock {
  int split, head;
  long long item, bt, b;
};
template <long long kT, int kHkv, int kSplits, int kQRows = 1>
__device__ __forceinline__ SplitBlock SplitBlockOf() {
  static_assert(kT % kQRows == 0, "an item's query rows are one sequence's");
  const long long item = blockIdx.x / kSplits;
  const long long bt = item / kHkv * kQRows;
  return {static_cast<int>(blockIdx.x % kSplits), static_cast<int>(item % kHkv), item, bt, bt / kT};
}

// The keys of a query row at `position` (none for a negative one: a padding row) and split
// `split`'s share of its KV blocks, [first_block, first_block + count) of ceil(keys / kBs),
// divided as evenly as whole blocks allow (count <= 0: the split has none).
struct RowSplit {
  int keys, first_block, count;
};
template <int kBs, int kSplits, int kMaxKeys>
__device__ __forceinline__ RowSplit SplitOfRow(int position, int split) {
  const int keys = position < 0 ? 0 : min(position + 1, kMaxKeys);
  const int row_blocks = (keys + kBs - 1) / kBs;
  const int per_split = (row_blocks + kSplits - 1) / kSplits;
  const int first_block = min(row_blocks, split * per_split);
  return {keys, first_block, min(row_blocks, first_block + per_split) - first_block};
}

// The end of a split block of either kernel below: the warps' partial sums (`partial`
// [kWarps][kItemRows][kD], their (max, sum) pairs in `warp_stats`, maxima in base-2 units,
// -inf for a warp that saw no key) moved to the block's max and added in warp order; O itself
// (from `o` on, ItemOffset) with kSplits == 1, else the split's partials at `stats` (then, with
// splits_done, the combine of the item's last split). A row no warp saw a key of (a padding
// row among an item's query rows) is zeros.
template <typename TO, int kH, int kD, int kHkv, int kWarps, int kSplits, int kQRows = 1>
__device__ __forceinline__ void MergeWarpsAndStore(TO* o, float* stats, const float* partial, const float* warp_stats,
                                                   const float* partials, long long item, unsigned int* splits_done) {
  constexpr int kGroup = kH / kHkv;
  constexpr int kItemRows = kQRows * kGroup;
  __syncthreads();
  for (int i = threadIdx.x; i < kItemRows * kD; i += blockDim.x) {
    const int r = i / kD;
    float block_max = -CUDART_INF_F;
    for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, warp_stats[2 * (w * kItemRows + r)]);
    float total = 0.0f, sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float c = RescaleFactor(warp_stats[2 * (w * kItemRows + r)], block_max);
      total += c * partial[w * kItemRows * kD + i];
      sum += c * warp_stats[2 * (w * kItemRows + r) + 1];
    }
    if constexpr (kSplits == 1) {
      o[ItemOffset<kH, kD, kGroup>(r, i % kD)] = FromFloat<TO>(sum > 0.0f ? total / sum : 0.0f);
    } else {
      stats[2 * kItemRows + i] = total;
      if (i % kD == 0) stats[2 * r] = block_max, stats[2 * r + 1] = sum;
    }
  }
  if constexpr (kSplits > 1) {
    if (splits_done != nullptr) {
      CombineIfLastSplit<TO, kH, kD, kHkv, kSplits, kWarps * kWarpSize, kQRows>(o, partials, item, splits_done);
    }
  }
}

// What a split block without keys (a padding row, or a split past the row's keys) writes:
// zeros for O, or an empty partial (max -inf, sum 0) and then the combine as above.
template <typename TO, int kH, int kD, int kHkv, int kWarps, int kSplits, int kQRows = 1>
__device__ __forceinline__ void StoreEmptySplit(TO* o, float* stats, const float* partials, long long item,
                                                unsigned int* splits_done) {
  constexpr int kGroup = kH / kHkv;
  constexpr int kItemRows = kQRows * kGroup;
  for (int i = threadIdx.x; i < kItemRows * kD; i += blockDim.x) {
    if constexpr (kSplits == 1) {
      o[ItemOffset<kH, kD, kGroup>(i / kD, i % kD)] = FromFloat<TO>(0.0f);
    } else {
      stats[2 * kItemRows + i] = 0.0f;
    }
  }
  if constexpr (kSplits > 1) {
    if (threadIdx.x < kItemRows) stats[2 * threadIdx.x] = -CUDART_INF_F, stats[2 * threadIdx.x + 1] = 0.0f;
    if (splits_done != nullptr) {
      CombineIfLastSplit<TO, kH, kD, kHkv, kSplits, kWarps * kWarpSize, kQRows>(o, partials, item, splits_done);
    }
  }
}

// Attention as PagedAttention computes it, split over the keys (flash-decoding): a block of
// kWarps warps per (b, t, kv head, split), the group's kGroup query heads sharing every K and
// V row the block loads. The splits divide the row's actual KV blocks (ceil((position + 1) /
// kBs)) as evenly as whole blocks allow, at run time: a split count fixed for the longest
// context would leave the last splits of a shorter row idle and its first ones long.
//
// The kernel is a stream of K/V bytes (a batch of 32 at llama-M's shape reads 84 MB a layer),
// so what matters is how many of those bytes are in flight. K and V come through shared memory
// a KV block at a time (kBs rows of K and of V, 2 x kBs x kD contiguous elements each in the
// pool), kStages blocks deep with cp.async: kStages - 1 blocks are on their way while the
// block's threads score one. (The previous form loaded rows into registers, kUnroll at a time,
// and issued nothing while it computed: 122 registers, two blocks an SM, 1.7 TB/s.)
//
// Scoring a stage: a row of K (or V) is kD / kVec lanes of one 16-byte shared-memory read each;
// a warp takes 32 / that rows at once and the warps interleave over the stage's kBs rows. Each
// thread keeps an online softmax per head of the group over the keys it saw: max, sum of
// exp(S - max), and the sum of exp(S - max) V over its kVec dims. Threads of the same dims
// then merge their running sums (a shuffle within the warp, shared memory across warps), in a
// fixed order. With kSplits == 1 the block writes O (as TO, the f32 value rounded once);
// otherwise (max in base-2 units, sum, unnormalized sum of V) per head, f32, to `partials`,
// which PagedAttentionCombine merges in split order. A table entry outside [0, kBlocks) reads as
// zeros (memory-safe; the block manager never writes one inside a row's keys).
// Launch: grid = kB * kT * kHkv * kSplits blocks of kWarps * 32 threads; dynamic shared memory
// of kStages * 2 * kBs * kD elements of TP (the stages), kMaxBlocks ints (rounded up to 16
// bytes) and kWarps * kGroup * (kD + 2) floats (codegen/lower_paged_kv.cc sizes it).
// kTablesBeforeWait (codegen, where the block tables and positions are step-invariant:
// KernelSpec::waits_itself): those are read before the kernel waits for the kernels ahead
// (GridDependencyWait, here), q after it through ordered loads, so the K/V copies can start
// one memory round trip sooner after the wait.
template <typename TP, typename TO, long long kB, long long kT, int kH, int kD, int kLayer, long long kBlocks, int kHkv,
          int kBs, int kMaxBlocks, int kWarps, int kSplits, int kStages, bool kTablesBeforeWait = false>
__device__ __forceinline__ void PagedAttentionSplit(TO* out, const TP* q, const TP* k_pool, const TP* v_pool,
                                                    const int* block_tables, const int* positions, float scale,
                                                    float* partials, unsigned int* splits_done = nullptr) {
  const float scale2 = scale * kLog2E;  // scores in base-2 units (RescaleFactor)
  constexpr int kGroup = kH / kHkv;
  constexpr int kMaxKeys = kMaxBlocks * kBs;
  constexpr int kVec = Packed128<TP>::kSize;
  constexpr int kLanesPerRow = kD / kVec;
  constexpr int kRowsPerWarp = kWarpSize / kLanesPerRow;
  constexpr int kRowsPerPass = kRowsPerWarp * kWarps;
  constexpr int kPasses = static_cast<int>(CeilDiv(kBs, kRowsPerPass));  // rows of a stage a thread scores
  constexpr int kThreads = kWarps * kWarpSize;
  constexpr int kTile = kBs * kD;  // elements of one KV block's K (and of its V)
  static_assert(kD % kVec == 0 && kLanesPerRow <= kWarpSize && kWarpSize % kLanesPerRow == 0,
                "a row is a power of two of lanes, each one 16-byte access");
  static_assert(kStages >= 2, "one stage scored while the next is in flight");
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  TP* tiles = reinterpret_cast<TP*>(shared_bytes);                                 // [kStages][2][kTile]: K, V
  int* table = reinterpret_cast<int*>(tiles + kStages * 2 * kTile);                // [kMaxBlocks]
  float* partial = reinterpret_cast<float*>(table + ((kMaxBlocks + 3) / 4) * 4);  // [kWarps][kGroup][kD]
  float* warp_stats = partial + kWarps * kGroup * kD;                             // [kWarps][kGroup] (max, sum)

  const SplitBlock block = SplitBlockOf<kT, kHkv, kSplits>();
  const int split = block.split, head = block.head;
  const long long item = block.item, bt = block.bt, b = block.b;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row_in_warp = lane / kLanesPerRow, sub = lane % kLanesPerRow;
  // The row's whole block table and q's rows load beside the position (one wait on memory for
  // the three, not three in a row; a padding row's are valid memory, loaded and left unused).
  for (int i = threadIdx.x; i < kMaxBlocks; i += kThreads) table[i] = block_tables[b * kMaxBlocks + i];
  const int position = positions[bt];
  if constexpr (kTablesBeforeWait) GridDependencyWait();
  float qv[kGroup][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    LoadFloats<kTablesBeforeWait ? LoadHint::kAfterWait : LoadHint::kDefault>(
        q + (bt * kH + static_cast<long long>(head) * kGroup + g) * kD + sub * kVec, qv[g]);
  }
  const RowSplit range = SplitOfRow<kBs, kSplits, kMaxKeys>(position, split);
  const int keys = range.keys, first_block = range.first_block, count = range.count;
  // Partials: [item][split] of kGroup (max, sum) pairs, then kGroup x kD sums.
  float* stats = partials + (item * kSplits + split) * kGroup * (kD + 2);
  // Where the block's kGroup x kD values go: O itself, or the partial sums after the stats.
  TO* o = out + (bt * kH + static_cast<long long>(head) * kGroup) * kD;
  if (count <= 0) {  // a padding row, or a split past the row's keys: it adds nothing
    StoreEmptySplit<TO, kH, kD, kHkv, kWarps, kSplits>(o, stats, partials, item, splits_done);
    return;
  }
  __syncthreads();
  // Block i of the split into stage i % kStages; a commit either way, so that the count of
  // groups in flight stays kStages - 1 to the end.
  auto issue = [&](int i) {
    if (i < count) {
      const int id = table[first_block + i];
      const bool valid = id >= 0 && id < kBlocks;
      const long long at = ((static_cast<long long>(kLayer) * kBlocks + (valid ? id : 0)) * kHkv + head) * kTile;
      TP* k_tile = tiles + (i % kStages) * 2 * kTile;
#pragma unroll
      for (int j = 0; j < static_cast<int>(CeilDiv(kTile, kThreads * kVec)); ++j) {
        const int c = (j * kThreads + static_cast<int>(threadIdx.x)) * kVec;
        if (c < kTile) {
          CpAsync16OrZero(k_tile + c, k_pool + at + c, valid);
          CpAsync16OrZero(k_tile + kTile + c, v_pool + at + c, valid);
        }
      }
    }
    CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);

  // This thread's running softmax over its keys, per head of the group: max, sum of
  // exp(S - max), and the sum of exp(S - max) V over its kVec dims.
  float m[kGroup], l[kGroup], acc[kGroup][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = -CUDART_INF_F;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[g][i] = 0.0f;
  }
  for (int i = 0; i < count; ++i) {
    CpAsyncWait<kStages - 2>();  // this thread's copies of block i have landed
    __syncthreads();             // everyone's have; and stage (i - 1) % kStages is scored
    issue(i + kStages - 1);
    const TP* k_tile = tiles + (i % kStages) * 2 * kTile;
    const int key0 = (first_block + i) * kBs;
    Packed128<TP> k[kPasses], v[kPasses];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int r = p * kRowsPerPass + warp * kRowsPerWarp + row_in_warp;
      if (r < kBs) {
        k[p] = *reinterpret_cast<const Packed128<TP>*>(k_tile + r * kD + sub * kVec);
        v[p] = *reinterpret_cast<const Packed128<TP>*>(k_tile + kTile + r * kD + sub * kVec);
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float s[kPasses];
      float m_new = m[g];
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int r = p * kRowsPerPass + warp * kRowsPerWarp + row_in_warp;
        const bool live = r < kBs && key0 + r < keys;
        float dot = 0.0f;
        if (live) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) dot += qv[g][e] * ToFloat(k[p][e]);
        }
#pragma unroll
        for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        s[p] = live ? dot * scale2 : -CUDART_INF_F;
        m_new = fmaxf(m_new, s[p]);
      }
      if (m_new == -CUDART_INF_F) continue;  // none of these keys is this thread's
      // Rescaled only when the max grew (most stages after the first few keep it): a factor
      // of 2^0 = 1 would leave every bit as it is.
      if (m_new > m[g]) {
        const float c = RescaleFactor(m[g], m_new);
        l[g] *= c;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][e] *= c;
      }
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        if (s[p] == -CUDART_INF_F) continue;
        const float weight = exp2f(s[p] - m_new);
        l[g] += weight;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][e] += weight * ToFloat(v[p][e]);
      }
      m[g] = m_new;
    }
  }
  // Merge the running sums of the warp's rows that hold the same dims (lanes sub, sub +
  // kLanesPerRow, ...), then write the warp's to shared memory.
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset >= kLanesPerRow; offset /= 2) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m[g], offset);
      const float l_other = __shfl_xor_sync(0xffffffffu, l[g], offset);
      const float m_new = fmaxf(m[g], m_other);
      const float c = RescaleFactor(m[g], m_new), c_other = RescaleFactor(m_other, m_new);
      l[g] = l[g] * c + l_other * c_other;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float other = __shfl_xor_sync(0xffffffffu, acc[g][i], offset);
        acc[g][i] = acc[g][i] * c + other * c_other;
      }
      m[g] = m_new;
    }
    if (row_in_warp == 0) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) partial[(warp * kGroup + g) * kD + sub * kVec + i] = acc[g][i];
      if (sub == 0) warp_stats[2 * (warp * kGroup + g)] = m[g], warp_stats[2 * (warp * kGroup + g) + 1] = l[g];
    }
  }
  MergeWarpsAndStore<TO, kH, kD, kHkv, kWarps, kSplits>(o, stats, partial, warp_stats, partials, item, splits_done);
}

// PagedAttentionSplit on bf16 tensor cores, for a bf16 pool and q whose head dim is a multiple
// of 16 (at most 256), KV blocks of a multiple of 16 keys and groups of at most 8 query heads:
// the same splits, partials and combine, with a KV block's scores and its P V as mma.sync
// m16n8k16 products instead of a thread's dot products and shuffles. ncu put the CUDA-core
// kernel's issue slots at 63% of its cycles at batch 32 (bench/RESULTS.md, session 25): its
// lanes split each K row, so every score took a dot product of kVec and a shuffle tree of
// four steps; here a warp scores 16 keys for the whole group with kD / 8 instructions.
//
// Each warp streams its own KV blocks of the split (warp w takes blocks w, w + kWarps, ...)
// through kStages stages of its own shared memory (cp.async, 16-byte chunks XOR-swizzled for
// ldmatrix), so no block-wide barrier paces the loop. Per 16-key tile:
//   S (16 x 16: the group's query heads in rows 0..kGroup-1, the rest zero) = Q K^T, with Q's
//     A fragments in registers for the whole kernel and K's B fragments by ldmatrix;
//   the online softmax in base-2 units on S's accumulator fragments (a row's 16 keys are in
//     the 4 lanes of a quad: two shuffles for its max);
//   O += P V, with S's accumulators reused as P's A fragments (flash attention's register
//     layout) and V's B fragments by ldmatrix.trans. P stays f32 in meaning: it goes in as
//     two bf16 products, hi = bf16(P) and lo = bf16(P - hi), which leave P within 2^-16 of
//     itself (relative), where one bf16 P would be 2^-9.
// Q is rounded to bf16 for the products: q is bf16 here, so that changes nothing.
// kCompleteBlocksBeforeWait (with kTablesBeforeWait; codegen's CodegenOptions::paged_attention
// complete_blocks_step_invariant at kT == 1): the first stages of KV blocks that end before the
// block of the row's position are issued before the grid-dependency wait.
// kBulkCopies: a warp's stages are filled by cp.async.bulk, a copy per K or V row (one
// instruction a lane where cp.async takes 16), completing on the stage's mbarrier; rows are
// padded to kD + 8 elements instead of swizzled.
// kQRows > 1 (prefill: kT query rows a sequence, kT a multiple of kQRows): an item is kQRows
// consecutive query rows of one sequence and a kv head, the m16 tile's rows r = qt * kGroup + g
// (kQRows * kGroup <= 16), so that every K and V row a block loads serves kQRows queries where
// it served one, and the tile's rows are used. Each row keeps its own keys (its position's
// causal mask) and its own running max and sum; the item's keys, and so its splits, are its
// longest row's.
// Launch and partials as PagedAttentionSplit, with kB * kT / kQRows * kHkv * kSplits blocks;
// dynamic shared memory of kWarps * kStages * 2 * kBs * kD bf16 (each warp's stages; kD + 8 a
// row with kBulkCopies), kMaxBlocks ints (rounded up to 16 bytes), kWarps * kQRows * kGroup *
// (kD + 2) floats (rounded up to 8 bytes) and, with kBulkCopies, kWarps * kStages 8-byte
// barriers (codegen/lower_paged_kv.cc sizes it).
template <typename TO, long long kB, long long kT, int kH, int kD, int kLayer, long long kBlocks, int kHkv, int kBs,
          int kMaxBlocks, int kWarps, int kSplits, int kStages, bool kTablesBeforeWait = false,
          bool kCompleteBlocksBeforeWait = false, bool kBulkCopies = false, int kQRows = 1>
__device__ __forceinline__ void PagedAttentionSplitMma(TO* out, const __nv_bfloat16* q, const __nv_bfloat16* k_pool,
                                                       const __nv_bfloat16* v_pool, const int* block_tables,
                                                       const int* positions, float scale, float* partials,
                                                       unsigned int* splits_done = nullptr) {
  using TP = __nv_bfloat16;
  constexpr int kGroup = kH / kHkv;
  constexpr int kItemRows = kQRows * kGroup;  // rows of the m16 tile in use
  constexpr bool kHighRows = kItemRows > 8;   // rows 8-15 in use too
  static_assert(kGroup >= 1 && kGroup <= 8, "the group's heads are rows 0..7 of the m16 tile");
  static_assert(kQRows >= 1 && kItemRows <= 16, "an item's rows are the m16 tile's");
  static_assert(!kCompleteBlocksBeforeWait || kQRows == 1, "the early copies are a decode row's");
  static_assert(kD % 16 == 0 && kD <= 256, "head dim: whole k16 steps, at most 256");
  static_assert(kBs % 16 == 0, "KV blocks of whole 16-key tiles");
  static_assert(kStages >= 2, "one KV block scored while the next is in flight");
  constexpr int kMaxKeys = kMaxBlocks * kBs;
  constexpr int kDSteps = kD / 16;  // k16 steps of Q K^T
  constexpr int kDTiles = kD / 8;   // n8 tiles of O
  // A staged row is kD elements, swizzled (cp.async), or kD + 8 (bulk copies: a row lands as
  // it is, and the 16 bytes of padding put the 8 rows of an ldmatrix phase in distinct banks).
  constexpr int kRowStride = kBulkCopies ? kD + 8 : kD;
  constexpr int kTile = kBs * kRowStride;  // staged elements of one KV block's K (and of its V)
  constexpr int kChunksPerLane = kBs * kD / 8 / kWarpSize;
  static_assert(kBs * kD % (8 * kWarpSize) == 0, "a KV block is whole rounds of a warp's 16-byte copies");
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  TP* tiles = reinterpret_cast<TP*>(shared_bytes);                                 // [kWarps][kStages][2][kTile]
  int* table = reinterpret_cast<int*>(tiles + kWarps * kStages * 2 * kTile);       // [kMaxBlocks]
  float* partial = reinterpret_cast<float*>(table + ((kMaxBlocks + 3) / 4) * 4);  // [kWarps][kItemRows][kD]
  float* warp_stats = partial + kWarps * kItemRows * kD;  // [kWarps][kItemRows] (max, sum)
  // Bulk copies: each warp's stages complete on barriers of their own, [kWarps][kStages] (8-byte
  // aligned: everything before is a whole number of 8 bytes, kD being even).
  unsigned long long* barriers = reinterpret_cast<unsigned long long*>(warp_stats + 2 * kWarps * kItemRows);
  auto staged = [](int row, int col) { return kBulkCopies ? row * kRowStride + col : Swizzle<kD>(row, col); };

  const SplitBlock block = SplitBlockOf<kT, kHkv, kSplits, kQRows>();
  const int split = block.split, head = block.head;
  const long long item = block.item, bt = block.bt, b = block.b;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int i = threadIdx.x; i < kMaxBlocks; i += kWarps * kWarpSize) table[i] = block_tables[b * kMaxBlocks + i];
  if constexpr (kBulkCopies) {
    if (lane == 0) {
      for (int stage = 0; stage < kStages; ++stage) BarrierInit(SharedAddress(barriers + warp * kStages + stage), 1);
      FenceBarrierInit();
    }
  }
  // Keys of the tile's rows quad_row and quad_row + 8 (0 for a row past the item's), and the
  // item's: its longest row's.
  const int quad_row = lane / 4, quad_lane = lane % 4;  // a fragment's row, and pair of columns
  auto row_keys = [&](int r) {
    if (r >= kItemRows) return 0;
    const int p = positions[bt + r / kGroup];
    return p < 0 ? 0 : min(p + 1, kMaxKeys);
  };
  const int keys_low = row_keys(quad_row), keys_high = kHighRows ? row_keys(quad_row + 8) : 0;
  int position = positions[bt];
#pragma unroll
  for (int qt = 1; qt < kQRows; ++qt) position = max(position, positions[bt + qt]);
  const RowSplit range = SplitOfRow<kBs, kSplits, kMaxKeys>(position, split);
  const int keys = range.keys, first_block = range.first_block, count = range.count;
  float* stats = partials + (item * kSplits + split) * kItemRows * (kD + 2);
  TO* o = out + (bt * kH + static_cast<long long>(head) * kGroup) * kD;
  if (count <= 0) {
    if constexpr (kTablesBeforeWait) GridDependencyWait();  // what the kernels ahead read is written after it
    StoreEmptySplit<TO, kH, kD, kHkv, kWarps, kSplits, kQRows>(o, stats, partials, item, splits_done);
    return;
  }
  __syncthreads();  // the table
  // This warp's KV blocks of the split: first_block + warp + j * kWarps for j < mine.
  const int mine = count > warp ? (count - warp + kWarps - 1) / kWarps : 0;
  TP* my_tiles = tiles + warp * kStages * 2 * kTile;
  auto issue = [&](int j) {
    if (j < mine) {
      const int id = table[first_block + warp + j * kWarps];
      const bool valid = id >= 0 && id < kBlocks;
      const long long at = ((static_cast<long long>(kLayer) * kBlocks + (valid ? id : 0)) * kHkv + head) * kBs * kD;
      TP* k_tile = my_tiles + (j % kStages) * 2 * kTile;
      if constexpr (kBulkCopies) {
        // Lane 0 arms the stage's barrier for the block's bytes, then the lanes copy its 2 kBs
        // rows (K's, then V's) a row a copy; a block outside the pool is zeros, stored by hand.
        const unsigned bar = SharedAddress(barriers + warp * kStages + j % kStages);
        if (lane == 0) BarrierArriveExpectTx(bar, valid ? 2 * kBs * kD * 2 : 0);
        __syncwarp();  // armed before any copy completes on it; block j - 1's stage is read
        for (int r = lane; r < 2 * kBs; r += kWarpSize) {
          const TP* src = (r < kBs ? k_pool : v_pool) + at + (r % kBs) * kD;
          TP* dst = k_tile + (r / kBs) * kTile + (r % kBs) * kRowStride;
          if (valid) {
            BulkCopyToShared(SharedAddress(dst), src, kD * 2, bar);
          } else {
            for (int c = 0; c < kD; c += 8) *reinterpret_cast<uint4*>(dst + c) = make_uint4(0, 0, 0, 0);
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c) {
          const int e = (c * kWarpSize + lane) * 8;  // element of the block's K (and V) rows
          const int swizzled = Swizzle<kD>(e / kD, e % kD);
          CpAsync16OrZero(k_tile + swizzled, k_pool + at + e, valid);
          CpAsync16OrZero(k_tile + kTile + swizzled, v_pool + at + e, valid);
        }
      }
    }
    if constexpr (!kBulkCopies) CpAsyncCommit();
  };
  int issued = 0;
  if constexpr (kTablesBeforeWait) {
    if constexpr (kCompleteBlocksBeforeWait) {
      // Blocks [0, position / kBs) hold only keys before the row's newest, which earlier steps
      // wrote (the codegen caller's promise): their copies start while the kernels ahead run.
      const int complete = position / kBs;
      while (issued < kStages - 1 && issued < mine && first_block + warp + issued * kWarps < complete) issue(issued++);
    }
    GridDependencyWait();
  }
  for (; issued < kStages - 1; ++issued) issue(issued);

  // Q's A fragments: [0] row quad_row, columns 16s + 2 quad_lane (+1); [1] row quad_row + 8,
  // the same columns; [2], [3] those rows' columns 8 more. Row r is head r % kGroup of query row
  // r / kGroup; rows from kItemRows on are zero.
  unsigned qa[kDSteps][4];
  {
    auto q_row = [&](int r) {
      return q + ((bt + min(r, kItemRows - 1) / kGroup) * kH + static_cast<long long>(head) * kGroup +
                  min(r, kItemRows - 1) % kGroup) * kD;
    };
    const TP* rows[2] = {q_row(quad_row), q_row(quad_row + 8)};
#pragma unroll
    for (int s = 0; s < kDSteps; ++s) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int high = 0; high < 2; ++high) {
          const int r = quad_row + 8 * high;
          unsigned pair = 0u;
          if ((high == 0 || kHighRows) && r < kItemRows) {
            const TP* p = rows[high] + 16 * s + 8 * half + 2 * quad_lane;
            if constexpr (kTablesBeforeWait) {  // ordered after the wait (Load128AfterWait's reason)
              asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(pair) : "l"(p) : "memory");
            } else {
              pair = *reinterpret_cast<const unsigned*>(p);
            }
          }
          qa[s][2 * half + high] = pair;
        }
      }
    }
  }
  // Rows quad_row ([0]) and quad_row + 8 ([1]): running max (base-2 units; the same in the
  // quad's four lanes), this lane's part of the sum of exp; O's accumulators: tile n holds row
  // quad_row's columns 8n + 2 quad_lane (+1) in [0], [1] and row quad_row + 8's in [2], [3].
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.0f, 0.0f};
  float acc[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  const float scale2 = scale * kLog2E;
  for (int j = 0; j < mine; ++j) {
    if constexpr (kBulkCopies) {
      BarrierWait(SharedAddress(barriers + warp * kStages + j % kStages), (j / kStages) & 1);
      __syncwarp();  // a zero block's stores, by every lane, are visible to every lane
    } else {
      CpAsyncWait<kStages - 2>();  // this lane's copies of block j have landed
      __syncwarp();                // the warp's have; and block j - 1's stage is read
    }
    issue(j + kStages - 1);
    const TP* k_tile = my_tiles + (j % kStages) * 2 * kTile;
    const TP* v_tile = k_tile + kTile;
    const int block_key0 = (first_block + warp + j * kWarps) * kBs;
#pragma unroll
    for (int tile = 0; tile < kBs / 16; ++tile) {
      const int key0 = block_key0 + tile * 16;
      if (key0 >= keys) break;  // warp-uniform
      // S: [0] keys 0-7 of the tile, [1] keys 8-15; this lane's are keys 2 quad_lane (+1) of
      // each, row quad_row in [0], [1] and row quad_row + 8 in [2], [3].
      float s[2][4] = {};
#pragma unroll
      for (int step = 0; step < kDSteps; ++step) {
        // Matrices 0-3: keys 0-7 then 8-15 (rows), head dims 16 step + 0-7 then 8-15.
        const int matrix = lane / 8;
        const int key = tile * 16 + (matrix / 2) * 8 + lane % 8;
        unsigned kb[4];
        LdMatrixX4(kb, k_tile + staged(key, 16 * step + 8 * (matrix % 2)));
        const unsigned a[4] = {qa[step][0], kHighRows ? qa[step][1] : 0u, qa[step][2], kHighRows ? qa[step][3] : 0u};
        Mma(s[0], a, kb[0], kb[1]);
        Mma(s[1], a, kb[2], kb[3]);
      }
      constexpr int kHalves = kHighRows ? 2 : 1;
      float p[2][4];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const int row_keys_h = kQRows == 1 ? keys : (h == 0 ? keys_low : keys_high);
        float tile_max = -CUDART_INF_F;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            const bool live = key0 + 8 * n + 2 * quad_lane + e % 2 < row_keys_h;
            s[n][e] = live ? s[n][e] * scale2 : -CUDART_INF_F;
            tile_max = fmaxf(tile_max, s[n][e]);
          }
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        if (tile_max > m[h]) {  // rescaled only when the max grew: a factor of 2^0 changes no bit
          const float c = RescaleFactor(m[h], tile_max);
          l[h] *= c;
#pragma unroll
          for (int n = 0; n < kDTiles; ++n) acc[n][2 * h] *= c, acc[n][2 * h + 1] *= c;
          m[h] = tile_max;
        }
        // A row of one query row keeps a key in every tile it enters (the tile's first); a row of
        // a query tile may have none here and no max yet, and its exp2f(-inf - 0) is then 0.
        const float m_h = kQRows == 1 || m[h] != -CUDART_INF_F ? m[h] : 0.0f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            p[n][e] = exp2f(s[n][e] - m_h);  // 0 for a key past the row's
            l[h] += p[n][e];
          }
        }
      }
      // P's A fragments (the S accumulators' layout): [0] row quad_row keys 0-7, [1] row
      // quad_row + 8 keys 0-7, [2], [3] keys 8-15; as hi + lo bf16 products.
      unsigned hi[4] = {PackBf16(p[0][0], p[0][1]), 0u, PackBf16(p[1][0], p[1][1]), 0u};
      if constexpr (kHighRows) hi[1] = PackBf16(p[0][2], p[0][3]), hi[3] = PackBf16(p[1][2], p[1][3]);
      unsigned lo[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          const __nv_bfloat162 rounded = *reinterpret_cast<const __nv_bfloat162*>(&hi[2 * n + h]);
          lo[2 * n + h] = PackBf16(p[n][2 * h] - __low2float(rounded), p[n][2 * h + 1] - __high2float(rounded));
        }
      }
#pragma unroll
      for (int pair = 0; pair < kDTiles / 2; ++pair) {
        // Matrices 0-3: keys 0-7, 8-15 of head dims 16 pair + 0-7, then of 16 pair + 8-15.
        const int matrix = lane / 8;
        const int key = tile * 16 + (matrix % 2) * 8 + lane % 8;
        unsigned vb[4];
        LdMatrixX4Trans(vb, v_tile + staged(key, 16 * pair + 8 * (matrix / 2)));
        Mma(acc[2 * pair], hi, vb[0], vb[1]);
        Mma(acc[2 * pair], lo, vb[0], vb[1]);
        Mma(acc[2 * pair + 1], hi, vb[2], vb[3]);
        Mma(acc[2 * pair + 1], lo, vb[2], vb[3]);
      }
    }
  }
  if constexpr (!kBulkCopies) CpAsyncWait<0>();  // no copy outlives the block (the last issues were empty commits)
#pragma unroll
  for (int h = 0; h < (kHighRows ? 2 : 1); ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int r = quad_row + 8 * h;
    if (r < kItemRows) {
      float* row = partial + (warp * kItemRows + r) * kD + 2 * quad_lane;
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) row[8 * n] = acc[n][2 * h], row[8 * n + 1] = acc[n][2 * h + 1];
      if (quad_lane == 0) warp_stats[2 * (warp * kItemRows + r)] = m[h], warp_stats[2 * (warp * kItemRows + r) + 1] = l[h];
    }
  }
  MergeWarpsAndStore<TO, kH, kD, kHkv, kWarps, kSplits, kQRows>(o, stats, partial, warp_stats, partials, item,
                                                                splits_done);
}

// out[b, t, h, :] from PagedAttentionSplit's partials: the splits' sums rescaled to the
// row's max and added in split order, over the rescaled sum of exp, rounded once to TO.
// Launch: one thread per output element.
template <typename TO, long long kRows, int kH, int kD, int kHkv, int kSplits, int kQRows = 1>
__device__ __forceinline__ void PagedAttentionCombine(TO* out, const float* partials) {
  constexpr int kGroup = kH / kHkv;
  constexpr int kItemRows = kQRows * kGroup;
  const long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= kRows * kH * kD) return;
  const long long bt = e / (kH * kD);
  const int h = static_cast<int>(e / kD % kH), d = static_cast<int>(e % kD);
  const long long item = bt / kQRows * kHkv + h / kGroup;
  const int r = static_cast<int>(bt % kQRows) * kGroup + h % kGroup;
  out[e] = CombinedElement<TO, kItemRows, kD, kSplits>(partials + item * kSplits * kItemRows * (kD + 2), r, d,
                                                        [](const float* a) { return *a; });
}

}  // namespace kiln::kernels
