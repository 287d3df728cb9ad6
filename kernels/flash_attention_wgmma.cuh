// Causal flash attention for Hopper (sm_90a), forward and backward. This comment describes the
// forward; the backward kernels (FlashAttentionWgmmaBackwardDq, FlashAttentionWgmmaBackwardDkDv
// and, at head dim 128, FlashAttentionWgmmaBackward, the two in one: below) use the same block,
// pipeline and tile layout and say what they compute.
//
// The forward: the `attention` op (ir/op_table.h) on warpgroup MMA (wgmma.mma_async m64nNk16, bf16 operands, fp32 accumulation), single pass
// over the keys with an online softmax. Same layouts, GQA rule, O and LSE as
// FlashAttentionForward in kernels/flash_attention.cuh, and the same definition of O (that
// header's top comment): P rounded to bf16 before normalization, with the running row max
// kept at whole powers of two so that rescaling is exact and the result does not depend on
// the order the key tiles arrive in.
//
// Block: three warpgroups (384 threads), warp specialized as in FlashAttention-3:
//   - warpgroup 0, the producer, gives most of its registers away (setmaxnreg) and copies
//     the query tile once and then the key and value tiles, kStages deep, into shared
//     memory, completing each stage on an mbarrier;
//   - warpgroups 1 and 2, the consumers, own 64 query rows each (a block covers 128
//     queries): S = q kᵀ with both operands in shared memory, the online softmax in
//     registers, P rounded to bf16 straight into wgmma's A-operand registers (the
//     accumulator layout of m64nNk16 is its A layout), O += P v with v read N-major
//     (transposed by the descriptor, never in memory). Each consumer frees a stage with one
//     arrive per warp.
//   - the forward's consumers overlap softmax with the tensor cores twice over, as
//     FlashAttention-3 does: each software-pipelines its loop (tile j's softmax while tile
//     j - 1's P v runs), and the two take turns to issue their products (named barriers),
//     so one's softmax runs under the other's matrix products. On the H200 the two together
//     took llama-M's forward (B4 H16 KV8 T2048 D128) from 0.229 to 0.199 ms, the pipelining
//     alone to 0.224 (bench/RESULTS.md, session 18).
//   - every kernel is persistent (a block an SM, walking the tiles ZigzagTile gives it), so
//     the producer loads a tile's kept operands and first stages while the consumers finish
//     the tile before, and one consumer's epilogue runs under the other's products. On the
//     H200 that took llama-M's forward from 0.186 to 0.161 ms (bench/RESULTS.md, session 19).
// Tiles are stored in shared memory in wgmma's 128-byte swizzle: a tile of R rows and D
// columns is D / 64 column blocks of R x 64 elements, row r of a block 128 bytes at r * 128,
// its 16-byte chunk c at chunk c ^ (r % 8); every block starts 1024-byte aligned.
//
// Why cp.async and not TMA: a tensor map (CUtensorMap) embeds the global address of the
// tensor it describes and is encoded on the host by cuTensorMapEncodeTiled, which the static
// CUDA runtime reaches through cudaGetDriverEntryPoint without linking libcuda. It may be a
// by-value __grid_constant__ kernel parameter or live in global memory, but either way it
// has to be made from the buffer's address, which kiln knows only once an executable's arena
// is allocated, and kiln's launches (runtime/cuda/kernel_launch.h) pass device pointers only:
// the runtime would have to build the maps at load and hand them to the kernel, plumbing not
// in this kernel's change. The 1-D bulk copy (cp.async.bulk) needs no tensor map but writes
// contiguous bytes, and the swizzle above moves every 16-byte chunk of a row. So the producer
// warpgroup issues 16-byte cp.async (each of its 128 threads a share of every tile), waits
// for its own copies, fences them into the async proxy that wgmma reads shared memory
// through, and arrives on the stage's mbarrier. A stage's barrier completes one tile behind
// its issue, so one tile is always in flight while the consumers compute another.
//
// Causal: a block walks only the key tiles at or before its last query; the diagonal tile is
// masked element by element. Tiles (a block's 128 queries) are numbered heaviest first, as
// the mma.sync kernels' blocks are, and a persistent block takes them in ZigzagTile's order.
// T must be a multiple of 128 (the block's queries and the key tile); codegen falls back to
// the mma.sync kernel otherwise (FlashAttentionWgmmaUnsupportedReason).
//
// Launch: FlashAttentionWgmmaForwardLaunch (grid, 384 threads, shared bytes); the wrapper
// declares __launch_bounds__(384), so ptxas gives every thread 168 registers at launch (65536 /
// 384, one block an SM) and setmaxnreg moves them: the producer keeps 72, the consumers get 216
// (128 * 72 + 256 * 216 = 384 * 168). tests/flash_attention_kernel_test.cc checks that ptxas
// spills nothing in any of the kernels at D 64 and 128.
#pragma once

#include "kernels/flash_attention.cuh"

namespace kiln::kernels {

namespace flash_attention_wgmma {
constexpr int kRowsPerConsumer = 64;  // the M of wgmma m64nNk16
constexpr int kConsumers = 2;
constexpr int kBlockM = kRowsPerConsumer * kConsumers;
constexpr int kBlockN = 128;
constexpr unsigned kBlockThreads = 128 * (1 + kConsumers);
// Shared memory: the q tile, kStages (k, v) tile pairs, the mbarriers, and 1024 bytes of
// slack to align the tiles (dynamic shared memory is only 16-byte aligned).
// Three (k, v) stages at either head dim: the forward's consumers keep one while they wait
// for the next (FlashAttentionWgmmaForward), and at D 128 the q tile and three stages take
// 224 KiB of the 227 an H200 block may have.
KILN_FLASH_ATTENTION_HD constexpr int Stages(long long /*head_dim*/) { return 3; }
constexpr unsigned kBarrierBytes = 128;
constexpr unsigned kAlignSlack = 1024;
// The backward (FlashAttentionWgmmaBackwardDq, FlashAttentionWgmmaBackwardDkDv): dq blocks
// are the forward's 128 queries (64 per consumer) walking key tiles of 64; dk/dv blocks hold
// 128 keys (64 per consumer) and walk query tiles of 64.
constexpr int kDqKeyTile = 64;
constexpr int kDkDvQueryTile = 64;
KILN_FLASH_ATTENTION_HD constexpr int DqStages(long long head_dim) { return head_dim <= 64 ? 4 : 3; }
KILN_FLASH_ATTENTION_HD constexpr int DkDvStages(long long /*head_dim*/) { return 3; }
// The fused backward's dS tiles: two, so that one consumer stores the next tile's while the
// other still reads this one's. (Four stages fit beside one tile only, the consumers then
// meeting twice a tile: slower on the H200, bench/RESULTS.md session 20.)
constexpr int kFusedDsTiles = 2;
// The persistent kernels' schedule: a block of a grid of `blocks` takes the tiles (query
// or key blocks, numbered heaviest first) `block`, 2 * blocks - 1 - block,
// 2 * blocks + block, 4 * blocks - 1 - block, ...: a zigzag, so that each block's pair of
// tiles of a round of 2 * blocks weighs about the same (a causal tile's work falls linearly
// with its number), and the blocks finish together. Round robin (block + n * blocks) would
// give block 0 the heaviest tile of every round: at llama-M's shape its busiest block walks
// 9% more key tiles than the average, the zigzag's 3% (at llama-S's 7% and 1%, at B2 T4096's
// 12% and 0%). Returns the tile of the block's n-th turn, or -1 when it has no more.
KILN_FLASH_ATTENTION_HD constexpr int ZigzagTile(int n, int block, int blocks, int tiles) {
  const int tile = (n / 2) * 2 * blocks + (n % 2 == 0 ? block : 2 * blocks - 1 - block);
  return tile < tiles ? tile : -1;
}
// Every wgmma kernel is persistent: one block an SM (their shared memory allows no more) of
// the `sm_count` the target has, or one a tile (query or key block) where there are fewer. On
// a GPU with fewer SMs than sm_count the extra blocks wait for a free SM: correct, only
// unbalanced.
KILN_FLASH_ATTENTION_HD constexpr unsigned PersistentGrid(long long tiles, long long sm_count) {
  return static_cast<unsigned>(tiles < sm_count ? tiles : (sm_count > 0 ? sm_count : 1));
}
}  // namespace flash_attention_wgmma

// Why the wgmma kernel cannot take this shape, or nullptr (the mma.sync kernel may still).
KILN_FLASH_ATTENTION_HD constexpr const char* FlashAttentionWgmmaUnsupportedReason(long long batch, long long heads,
                                                                                   long long kv_heads,
                                                                                   long long seq_len,
                                                                                   long long head_dim) {
  if (const char* why = FlashAttentionUnsupportedReason(batch, heads, kv_heads, seq_len, head_dim)) return why;
  if (seq_len % flash_attention_wgmma::kBlockM != 0) return "T must be a multiple of 128 (the wgmma kernel's tiles)";
  return nullptr;
}

KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionWgmmaForwardLaunch(long long batch,
                                                                                       long long heads,
                                                                                       long long seq_len,
                                                                                       long long head_dim,
                                                                                       long long sm_count) {
  namespace fw = flash_attention_wgmma;
  FlashAttentionLaunch l;
  l.block_m = fw::kBlockM;
  l.block_n = fw::kBlockN;
  l.block_threads = fw::kBlockThreads;
  l.grid_x = fw::PersistentGrid(seq_len / l.block_m * batch * heads, sm_count);
  l.shared_bytes = static_cast<unsigned>((l.block_m + 2 * fw::Stages(head_dim) * l.block_n) * head_dim *
                                             flash_attention::kBf16Bytes +
                                         fw::kBarrierBytes + fw::kAlignSlack);
  return l;
}

// dq on wgmma: one block per (128 queries, batch * head); shared memory holds the q and dO
// tiles of the block and kStages (k, v) pairs of 64-key tiles.
KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionWgmmaBackwardDqLaunch(long long batch,
                                                                                          long long heads,
                                                                                          long long seq_len,
                                                                                          long long head_dim,
                                                                                          long long sm_count) {
  namespace fw = flash_attention_wgmma;
  FlashAttentionLaunch l;
  l.block_m = fw::kBlockM;
  l.block_n = fw::kDqKeyTile;
  l.block_threads = fw::kBlockThreads;
  l.grid_x = fw::PersistentGrid(seq_len / l.block_m * batch * heads, sm_count);
  l.shared_bytes = static_cast<unsigned>((2 * l.block_m + 2 * fw::DqStages(head_dim) * l.block_n) * head_dim *
                                             flash_attention::kBf16Bytes +
                                         fw::kBarrierBytes + fw::kAlignSlack);
  return l;
}

// dk and dv on wgmma: one block per (128 keys, batch * kv head); shared memory holds the k and
// v tiles of the block and kStages (q, dO) pairs of 64-query tiles with their LSE and Delta.
KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionWgmmaBackwardDkDvLaunch(long long batch,
                                                                                            long long kv_heads,
                                                                                            long long seq_len,
                                                                                            long long head_dim,
                                                                                            long long sm_count) {
  namespace fw = flash_attention_wgmma;
  FlashAttentionLaunch l;
  l.block_m = fw::kDkDvQueryTile;
  l.block_n = fw::kBlockM;  // keys: 64 per consumer
  l.block_threads = fw::kBlockThreads;
  l.grid_x = fw::PersistentGrid(seq_len / l.block_n * batch * kv_heads, sm_count);
  l.shared_bytes = static_cast<unsigned>(
      (2 * l.block_n + 2 * fw::DkDvStages(head_dim) * l.block_m) * head_dim * flash_attention::kBf16Bytes +
      2 * fw::DkDvStages(head_dim) * l.block_m * sizeof(float) + fw::kBarrierBytes + fw::kAlignSlack);
  return l;
}

// Whether attention_grad on wgmma is one kernel (FlashAttentionWgmmaBackward: dq added into
// from the key blocks' walk, after FlashAttentionZero) rather than the dq and dk/dv kernels:
// at head dim 128, where the two consumers split dq's columns into whole 64-column blocks.
KILN_FLASH_ATTENTION_HD constexpr bool FlashAttentionWgmmaFusesDq(long long head_dim) { return head_dim == 128; }

// The fused backward: the dk/dv kernel's grid and shared memory, and two dS tiles (64 queries
// x 128 keys, bf16) 1024-byte aligned after its barriers.
KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionWgmmaBackwardLaunch(long long batch,
                                                                                        long long kv_heads,
                                                                                        long long seq_len,
                                                                                        long long head_dim,
                                                                                        long long sm_count) {
  FlashAttentionLaunch l = FlashAttentionWgmmaBackwardDkDvLaunch(batch, kv_heads, seq_len, head_dim, sm_count);
  l.shared_bytes += static_cast<unsigned>(1024 + flash_attention_wgmma::kFusedDsTiles * l.block_m * l.block_n *
                                                     flash_attention::kBf16Bytes);
  return l;
}

// FlashAttentionZero over `count` floats: 256 threads a block, at most 4 blocks an SM, each
// thread a float4 a round.
KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionZeroLaunch(long long count, long long sm_count) {
  FlashAttentionLaunch l;
  l.block_threads = 256;
  const long long blocks = (count / 4 + l.block_threads - 1) / l.block_threads;
  const long long most = 4 * (sm_count > 0 ? sm_count : 1);
  l.grid_x = static_cast<unsigned>(blocks < most ? (blocks > 0 ? blocks : 1) : most);
  return l;
}

}  // namespace kiln::kernels

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

namespace kiln::kernels {
namespace flash_attention_wgmma {

// ------------------------------------------------------------------ mbarriers, copies

using kernels::BarrierArrive;
using kernels::BarrierInit;
using kernels::BarrierWait;
using kernels::FenceProxyAsync;

// Byte offset of element (row, col) in a swizzled tile of kRows rows (see the top comment).
template <int kRows>
__device__ __forceinline__ unsigned SwizzledOffset(int row, int col) {
  return static_cast<unsigned>((col >> 6) * kRows * 128 + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) +
                               (col & 7) * 2);
}

// kRows x kD bf16 rows (kD apart in global memory) into the swizzled tile at shared address
// `tile`, by the 128 threads of the producer warpgroup (`t` = 0..127); the caller commits.
// A round of 128 chunks covers 128 / (kD / 8) whole rows, a multiple of 8: a thread's
// column and its row's swizzle phase stay the same in every round, so each copy is the
// first one's addresses plus constants (the producer keeps few registers).
template <int kRows, int kD>
__device__ __forceinline__ void LoadTile(unsigned tile, const __nv_bfloat16* src, int t) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kRowsPerRound = 128 / kChunksPerRow;
  static_assert(kRowsPerRound % 8 == 0 && kRows % kRowsPerRound == 0, "whole swizzle phases per round");
  const int row = t / kChunksPerRow, col = (t % kChunksPerRow) * 8;
  const unsigned dst = tile + SwizzledOffset<kRows>(row, col);
  const __nv_bfloat16* from = src + row * kD + col;
#pragma unroll
  for (int round = 0; round < kRows / kRowsPerRound; ++round) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + round * kRowsPerRound * 128),
                 "l"(from + round * kRowsPerRound * kD));
  }
}

// --------------------------------------------------------------------- wgmma

// A shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading and stride byte offsets (all >> 4), 128-byte swizzle.
__device__ __forceinline__ unsigned long long Descriptor(unsigned address, unsigned leading_bytes,
                                                         unsigned stride_bytes) {
  return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) |
         (static_cast<unsigned long long>(leading_bytes >> 4) << 16) |
         (static_cast<unsigned long long>(stride_bytes >> 4) << 32) | (1ull << 62);
}

// The K-major operand of reduction step kk (columns 16kk..16kk+15) of rows [row0, row0 + 64
// or + kRows) of a swizzled tile of kRows rows: 8-row groups 1024 bytes apart; within a
// 128-byte row the hardware applies the swizzle to the advanced start address.
template <int kRows>
__device__ __forceinline__ unsigned long long KMajor(unsigned tile, int row0, int kk) {
  return Descriptor(tile + (kk >> 2) * kRows * 128 + row0 * 128 + (kk & 3) * 32, 16, 1024);
}

// The N-major operand of reduction step kk (rows 16kk..16kk+15) of a swizzled tile of kRows
// rows, its columns the N dimension: 64-column blocks kRows * 128 bytes apart (leading), 8-row
// groups 1024 bytes apart (stride).
template <int kRows>
__device__ __forceinline__ unsigned long long NMajor(unsigned tile, int kk) {
  return Descriptor(tile + kk * 16 * 128, kRows * 128, 1024);
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaWaitAll() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Waits until at most kPending of this warpgroup's committed groups are still running (they
// complete in commit order).
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads: Sync waits for them,
// Arrive counts this thread and goes on.
__device__ __forceinline__ void NamedBarrierSync(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(unsigned id, unsigned threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator across a wgmma wait.
template <int kN>
__device__ __forceinline__ void Pin(float (&d)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
  }
}

// d (64 x 64, fp32) (+)= a (64 x 16, bf16, K-major in shared memory) * b (16 x 64, bf16, in
// shared memory: K-major, or N-major with kNMajorB); `accumulate` 0 overwrites d.
template <int kNMajorB = 0>
__device__ __forceinline__ void WgmmaSS64(float (&d)[8][4], unsigned long long a_desc,
                                          unsigned long long b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(kNMajorB));
}

// d (64 x 64, fp32) += a (64 x 16, bf16: this thread's A fragment, as mma.sync's) * b
// (16 x 64, bf16, N-major in shared memory: the rows of b are contiguous).
__device__ __forceinline__ void WgmmaRS64(float (&d)[8][4], const unsigned (&a)[4],
                                          unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

// d (64 x 128, fp32) (+)= a (64 x 16, bf16, K-major in shared memory) * b (16 x 128, bf16,
// K-major in shared memory); `accumulate` 0 overwrites d.
__device__ __forceinline__ void WgmmaSS128(float (&d)[16][4], unsigned long long a_desc,
                                          unsigned long long b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

// d (64 x 128, fp32) += a (64 x 16, bf16: this thread's A fragment, as mma.sync's) * b
// (16 x 128, bf16, N-major in shared memory: the rows of b are contiguous).
__device__ __forceinline__ void WgmmaRS128(float (&d)[16][4], const unsigned (&a)[4],
                                          unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

// S (64 x 128) = q kᵀ over kD / 16 reduction steps; O (64 x kD) += P v over 128 / 16.
template <int kN>
__device__ __forceinline__ void WgmmaSS(float (&d)[kN / 8][4], unsigned long long a, unsigned long long b,
                                        int accumulate) {
  if constexpr (kN == 64) {
    WgmmaSS64(d, a, b, accumulate);
  } else {
    static_assert(kN == 128, "N of 64 or 128");
    WgmmaSS128(d, a, b, accumulate);
  }
}
template <int kN>
__device__ __forceinline__ void WgmmaRS(float (&d)[kN / 8][4], const unsigned (&a)[4], unsigned long long b) {
  if constexpr (kN == 64) {
    WgmmaRS64(d, a, b);
  } else {
    static_assert(kN == 128, "N of 64 or 128");
    WgmmaRS128(d, a, b);
  }
}

// ------------------------------------------------------------------ the pipeline

// A producer/consumer pipeline's mbarriers, 8 bytes each from `base`: `first` completes when
// the producer's first copies of a tile (the tiles a block keeps while it works on it: q, q
// and dO, or k and v) land, full[s] when stage s is filled, empty[s] when the consumers'
// arrivals have freed it, and `kept_empty` when they are done with the kept tiles (which the
// persistent kernels reload for their next tile). Stages are numbered over the block's whole
// life: stage n is in buffer n % kStages, and its barriers' phase is n / kStages; the kept
// tiles' phase is the tile's ordinal among the block's.
template <int kStages>
struct Pipeline {
  static_assert(8 * (2 + 2 * kStages) <= kBarrierBytes, "barriers fit their space");
  unsigned first, full, empty, kept_empty;
  __device__ __forceinline__ explicit Pipeline(unsigned base)
      : first(base), full(base + 8), empty(base + 8 + 8 * kStages), kept_empty(base + 8 + 16 * kStages) {}

  // Every thread of the block calls this; `empty_arrivals` arrivals free a stage (and the
  // kept tiles).
  __device__ __forceinline__ void Init(unsigned empty_arrivals) const {
    if (threadIdx.x == 0) {
      BarrierInit(first, 128);
      BarrierInit(kept_empty, empty_arrivals);
      for (int s = 0; s < kStages; ++s) {
        BarrierInit(full + 8 * s, 128);
        BarrierInit(empty + 8 * s, empty_arrivals);
      }
    }
    __syncthreads();
  }

  // The producer warpgroup's loop, after it issued and committed the copies of the tiles the
  // block keeps: for stages begin .. end - 1, waits until the stage's buffer s = stage % kStages
  // is free, calls load(stage - begin, s) to issue its copies, commits them, and publishes the
  // group before (the kept tiles, then stage - 1) once it has landed; at the end it waits for
  // all and publishes stage end - 1. A stage is published only once the next is issued, which
  // waits for a free buffer: so the consumers must free stage j - 1 before they wait for stage
  // j, or, with two stages, neither side moves (a consumer that keeps v of tile j - 1 while it
  // computes tile j's scores, as FlashAttention-3's software pipelining does, deadlocks here).
  template <typename Load>
  __device__ __forceinline__ void Produce(int begin, int end, Load load) const {
    for (int stage = begin; stage < end; ++stage) {
      const int s = stage % kStages;
      if (stage >= kStages) BarrierWait(empty + 8 * s, (stage / kStages - 1) & 1);
      load(stage - begin, s);
      flash_attention::CpAsyncCommit();
      CpAsyncWait<1>();
      FenceProxyAsync();
      BarrierArrive(stage == begin ? first : full + 8 * ((stage - 1) % kStages));
    }
    CpAsyncWait<0>();
    FenceProxyAsync();
    BarrierArrive(full + 8 * ((end - 1) % kStages));
  }
  // The producer, before it overwrites the kept tiles for the `ordinal`-th time (1, 2, ...):
  // waits until the consumers released them the time before.
  __device__ __forceinline__ void WaitKeptFree(int ordinal) const { BarrierWait(kept_empty, (ordinal - 1) & 1); }

  // The consumers' side: the kept tiles (of the block's `ordinal`-th tile), stage
  // `stage`'s tiles (in buffer stage % kStages), and freeing buffer s or the kept tiles (one
  // arrival of the Init count each).
  __device__ __forceinline__ void WaitFirst(int ordinal) const { BarrierWait(first, ordinal & 1); }
  __device__ __forceinline__ void WaitFull(int stage) const {
    BarrierWait(full + 8 * (stage % kStages), (stage / kStages) & 1);
  }
  __device__ __forceinline__ void Release(int s) const { BarrierArrive(empty + 8 * s); }
  __device__ __forceinline__ void ReleaseKept() const { BarrierArrive(kept_empty); }
};

// The backward's two score-shaped products of a consumer, both operands in shared memory:
// s = a1 b1ᵀ and p = a2 b2ᵀ (64 x kN each, over kD / 16 reduction steps), A the 64 rows from
// a_row0 of K-major tiles of kARows rows, B K-major tiles of kN rows; issued as one group,
// after_issue() called, and waited for (S and dP in dq, Sᵀ and dPᵀ in dk/dv).
template <int kN, int kD, int kARows, typename AfterIssue>
__device__ __forceinline__ void ScoresAndScoreGradients(float (&s)[kN / 8][4], float (&p)[kN / 8][4], unsigned a1,
                                                        unsigned b1, unsigned a2, unsigned b2, int a_row0,
                                                        AfterIssue after_issue) {
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) WgmmaSS<kN>(s, KMajor<kARows>(a1, a_row0, kk), KMajor<kN>(b1, 0, kk), kk > 0);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) WgmmaSS<kN>(p, KMajor<kARows>(a2, a_row0, kk), KMajor<kN>(b2, 0, kk), kk > 0);
  WgmmaCommit();
  after_issue();  // e.g. pass the issuing turn (Turns) while the products run
  WgmmaWaitAll();
  Pin(s);
  Pin(p);
}

// Where a forward or dq block works on query block `tile` of the grid's kSeqLen / 128 * kBatch
// * kHeads: 128 queries of one (batch, head), heaviest first (tile 0 is the last query block of
// the sequence), and the k and v rows of its kv head.
template <int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
struct QueryBlock {
  int query_block;      // which 128 queries of the sequence
  int q0;               // the block's first query
  long long row_base;   // of its (batch, head) in q, o, dO, dq, lse, delta
  const __nv_bfloat16* k_head;
  const __nv_bfloat16* v_head;
  __device__ __forceinline__ QueryBlock(const __nv_bfloat16* k, const __nv_bfloat16* v, int tile) {
    constexpr int kBH = kBatch * kHeads;
    const int bh = tile % kBH;
    query_block = kSeqLen / kBlockM - 1 - tile / kBH;
    const int kv_head = (bh / kHeads) * kKvHeads +
                        (bh % kHeads) / flash_attention::Shape<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>::kGroup;
    q0 = query_block * kBlockM;
    row_base = static_cast<long long>(bh) * kSeqLen;
    k_head = k + static_cast<long long>(kv_head) * kSeqLen * kHeadDim;
    v_head = v + static_cast<long long>(kv_head) * kSeqLen * kHeadDim;
  }
};

// The two consumers' turns to issue products (FlashAttention-3's "ping-pong"): named barriers 1
// and 2, one per consumer, of 256 threads (its own 128 waiting, the other's 128 arriving).
// Consumer 0 has the first turn; each turn of one follows the other's, so one consumer's
// elementwise work runs while the other's products use the tensor cores. Both must take the
// same number of turns (a consumer with nothing to issue in a turn still takes it): consumer 1
// passes once at the start, and consumer 0 takes one more turn at the end (Finish), so that
// no arrival is left pending.
// `taken` false makes every call a no-op (consumers that run in step instead).
struct Turns {
  int c;       // this consumer: 0 or 1
  bool taken;  // a compile-time constant where it is used
  __device__ __forceinline__ explicit Turns(int consumer, bool take = true) : c(consumer), taken(take) {
    if (taken && c == 1) NamedBarrierArrive(2 - c, 2 * 128);
  }
  __device__ __forceinline__ void Wait() const {
    if (taken) NamedBarrierSync(1 + c, 2 * 128);
  }
  __device__ __forceinline__ void Pass() const {
    if (taken) NamedBarrierArrive(2 - c, 2 * 128);
  }
  __device__ __forceinline__ void Finish() const {
    if (c == 0) Wait();
  }
};

// Named barrier 3: the two consumers (256 threads) in step, in the fused backward.
__device__ __forceinline__ void ConsumersSync() { NamedBarrierSync(3, 2 * 128); }

// Stores a warp's 16 x kM bf16 A fragments (rows r0 + 0..15 of some matrix X, columns
// 0..kM - 1: AccumulatorToA's layout) transposed, as Xᵀ's columns r0 .. r0 + 15 of rows
// 0..kM - 1, into a swizzled tile of kRows rows (stmatrix .trans: each 8 x 8 block of the
// fragment lands as 8 rows of 16 bytes, one chunk of the swizzle).
template <int kRows, int kM>
__device__ __forceinline__ void StoreTransposed(unsigned tile, const unsigned (&a)[kM / 16][4], int r0) {
  const int lane = threadIdx.x % kWarpSize;
  const int block = lane >> 3, row_in_block = lane & 7;
  // Fragment register `block` of step kk: X rows r0 + 8 (block & 1), columns 16kk + 8 (block >> 1).
  const int col = r0 + (block & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < kM / 16; ++kk) {
    const unsigned address = tile + SwizzledOffset<kRows>(kk * 16 + (block >> 1) * 8 + row_in_block, col);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address),
                 "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3])
                 : "memory");
  }
}

// Adds a warp's 16 x 8kN fp32 accumulator (StoreAccumulator's layout: rows [0, 16) of `dst`,
// `ld` floats apart) into global memory with vector reductions of two floats, done at L2 (in
// no fixed order between blocks).
template <int kN>
__device__ __forceinline__ void AddAccumulator(float* dst, const float (&acc)[kN][4], int ld) {
  const int lane = threadIdx.x % kWarpSize;
  float* p = dst + (lane >> 2) * ld + (lane & 3) * 2;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p + half * 8 * ld + n * 8),
                   "f"(acc[n][2 * half]), "f"(acc[n][2 * half + 1])
                   : "memory");
    }
  }
}

}  // namespace flash_attention_wgmma

// ------------------------------------------------------------------------------- kernel

// o = attention(q, k, v) and lse (fp32 [B, H, T], natural log) on wgmma, for `scale`.
// Persistent: each block walks the query blocks ZigzagTile gives it (gridDim.x blocks, at
// most one an SM), so that the producer loads the next query block's q, k and v while the
// consumers finish the last one's products and store its O, and one consumer's epilogue runs
// while the other's products use the tensor cores: a block of its own per query block would
// leave the SM's tensor cores idle through every prologue and epilogue.
// Launch: FlashAttentionWgmmaForwardLaunch; the wrapper declares __launch_bounds__(384).
template <typename TO, int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
__device__ __forceinline__ void FlashAttentionWgmmaForward(TO* __restrict__ o, float* __restrict__ lse,
                                                           const __nv_bfloat16* __restrict__ q,
                                                           const __nv_bfloat16* __restrict__ k,
                                                           const __nv_bfloat16* __restrict__ v, float scale) {
  namespace fa = flash_attention;
  namespace fw = flash_attention_wgmma;
  static_assert(kSeqLen % fw::kBlockM == 0, "T must be a multiple of 128 (the wgmma kernel's tiles)");
  constexpr int kM = fw::kBlockM, kN = fw::kBlockN, kD = kHeadDim;
  constexpr int kStages = fw::Stages(kD);
  constexpr unsigned kTileBytes = kN * kD * fa::kBf16Bytes;
  constexpr int kTiles = kSeqLen / kM * kBatch * kHeads;
  static_assert(kM == kN, "the last key tile of a block is its diagonal tile");
  using Block = fw::QueryBlock<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  const int grid = static_cast<int>(gridDim.x), me = static_cast<int>(blockIdx.x);

  // Shared memory (addresses in the shared window): q tile, k stages, v stages, barriers.
  const unsigned q_tile = (fa::SharedAddress(fa::SharedTiles()) + 1023u) & ~1023u;
  const unsigned k_tiles = q_tile + kM * kD * fa::kBf16Bytes;
  const unsigned v_tiles = k_tiles + kStages * kTileBytes;
  // first: the q tile landed; kept_empty: both consumers are done with it; full[s]: stage s's
  // k and v landed; empty[s]: every consumer warp is done with them. Stages count on across
  // query blocks, so the producer runs ahead into the next one.
  const fw::Pipeline<kStages> pipe(v_tiles + kStages * kTileBytes);

  const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  pipe.Init(fw::kConsumers * 4);

  if (warpgroup == 0) {
    // Producer: addresses and loop counters only.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 72;\n");
    int stage = 0;
    for (int visit = 0, tile; (tile = fw::ZigzagTile(visit, me, grid, kTiles)) >= 0; ++visit) {
      const Block block(k, v, tile);
      const int key_tiles = block.query_block + 1;
      if (visit > 0) pipe.WaitKeptFree(visit);
      fw::LoadTile<kM, kD>(q_tile, q + (block.row_base + block.q0) * kD, t);
      fa::CpAsyncCommit();
      pipe.Produce(stage, stage + key_tiles, [&](int j, int s) {
        fw::LoadTile<kN, kD>(k_tiles + s * kTileBytes, block.k_head + static_cast<long long>(j) * kN * kD, t);
        fw::LoadTile<kN, kD>(v_tiles + s * kTileBytes, block.v_head + static_cast<long long>(j) * kN * kD, t);
      });
      stage += key_tiles;
    }
    return;
  }

  // Consumer c: query rows q0 + 64c .. + 63 of each query block; this thread's rows `row` and
  // `row + 8`, and columns col, col + 1 of each 8-wide slice of a tile.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n");
  const int c = warpgroup - 1;
  const int warp = t / kWarpSize, lane = t % kWarpSize;
  const int col = (lane & 3) * 2;
  const float scale_log2 = scale * fa::kLog2e;

  float acc_o[kD / 8][4];
  float max2[2];  // running row max of S * scale_log2, rounded up to an integer
  float sum[2];   // this thread's part of sum(exp2(S * scale_log2 - max2))

  float acc_s[kN / 8][4];    // a key tile's scores, then their exp2
  unsigned pa[kN / 16][4];  // P rounded to bf16: wgmma's register A operand for P v

  // S of the key tile in stage `stage` into acc_s: issued (one group), not waited for.
  auto issue_scores = [&](int stage) {
    const unsigned k_tile = k_tiles + (stage % kStages) * kTileBytes;
    fw::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      fw::WgmmaSS<kN>(acc_s, fw::KMajor<kM>(q_tile, c * fw::kRowsPerConsumer, kk), fw::KMajor<kN>(k_tile, 0, kk),
                      kk > 0);
    }
    fw::WgmmaCommit();
  };
  // O += P v of the key tile in stage `stage`, P in pa: issued (one group), not waited for.
  auto issue_values = [&](int stage) {
    const unsigned v_tile = v_tiles + (stage % kStages) * kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) fw::WgmmaRS<kD>(acc_o, pa[kk], fw::NMajor<kN>(v_tile, kk));
    fw::WgmmaCommit();
  };
  // The online softmax of key tile j's scores in acc_s, in place (acc_s becomes exp2(S - max));
  // rescale[r] is what O's row r must be multiplied by before tile j's P v is added. The max is
  // taken of the unscaled scores (scale_log2 > 0, and rounding is monotone, so
  // round(max S * scale_log2) is the max of the rounded products: the same whole-power-of-two
  // max), and each element's exponent is then one FFMA, S * scale_log2 - max2, rounded once.
  auto softmax = [&](int j, int key_tiles, int row, float (&rescale)[2]) {
    if (j == key_tiles - 1) {  // the diagonal tile
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (j * kN + n * 8 + col + (e & 1) > row + (e >> 1) * 8) acc_s[n][e] = -CUDART_INF_F;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -CUDART_INF_F;
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) tile_max = fmaxf(tile_max, fmaxf(acc_s[n][2 * r], acc_s[n][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // Every row has a key in every tile it walks (key j * 128 <= its query), so the max is
      // finite after the first tile.
      const float new_max2 = fmaxf(max2[r], ceilf(tile_max * scale_log2));
      rescale[r] = fa::Pow2(max2[r] - new_max2);
      max2[r] = new_max2;
      float row_sum = sum[r] * rescale[r];
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) {
        acc_s[n][2 * r] = fa::Exp2(fmaf(acc_s[n][2 * r], scale_log2, -new_max2));
        acc_s[n][2 * r + 1] = fa::Exp2(fmaf(acc_s[n][2 * r + 1], scale_log2, -new_max2));
        row_sum += acc_s[n][2 * r] + acc_s[n][2 * r + 1];
      }
      sum[r] = row_sum;
    }
  };
  auto rescale_o = [&](const float (&rescale)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        acc_o[n][2 * r] *= rescale[r];
        acc_o[n][2 * r + 1] *= rescale[r];
      }
    }
  };
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) pipe.Release(stage % kStages);
  };
  // The q tile, once this warp's last S of a query block is done (the P v still in flight
  // reads v and registers only).
  auto release_q = [&] {
    __syncwarp();
    if (lane == 0) pipe.ReleaseKept();
  };
  // The two consumers take turns to issue their products (fw::Turns), so that one's softmax
  // runs while the other's products use the tensor cores; both walk the same key tiles, so
  // each has key_tiles + 1 turns a query block.
  const fw::Turns turns(c);
  auto wait_turn = [&] { turns.Wait(); };
  auto pass_turn = [&] { turns.Pass(); };

  // Software pipelined as in FlashAttention-3: while the tensor cores compute tile j - 1's
  // P v, this warpgroup runs tile j's softmax. Per tile j >= 1: issue S_j = q k_jᵀ, issue
  // O += P_{j-1} v_{j-1}, wait for S_j alone, softmax it in place, wait for P v, free stage
  // j - 1, rescale O, round P_j into pa. The arithmetic is the unpipelined loop's, in the same
  // order: O is rescaled by tile j's factor after tile j - 1's P v is in it and before tile j's.
  // The consumer holds stage j - 1 while it waits for stage j, which Pipeline::Produce allows
  // with three stages or more (its comment says why two deadlock).
  static_assert(kStages >= 3, "the pipelined consumer keeps one stage while it waits for the next");
  int stage = 0;  // of the query block's key tile 0
  for (int visit = 0, tile; (tile = fw::ZigzagTile(visit, me, grid, kTiles)) >= 0; ++visit) {
    const Block block(k, v, tile);
    const int key_tiles = block.query_block + 1;
    const long long row_base = block.row_base;
    const int row = block.q0 + c * fw::kRowsPerConsumer + warp * 16 + (lane >> 2);
    fa::Zero(acc_o);
    max2[0] = max2[1] = -CUDART_INF_F;
    sum[0] = sum[1] = 0.f;

    float rescale[2];
    pipe.WaitFirst(visit);
    pipe.WaitFull(stage);
    wait_turn();
    issue_scores(stage);
    pass_turn();
    fw::WgmmaWaitAll();
    fw::Pin(acc_s);
    if (key_tiles == 1) release_q();
    softmax(0, key_tiles, row, rescale);  // O is still zero: nothing to rescale
    fa::AccumulatorToA<kN>(pa, acc_s);
    for (int j = 1; j < key_tiles; ++j) {
      pipe.WaitFull(stage + j);
      wait_turn();
      issue_scores(stage + j);
      issue_values(stage + j - 1);
      pass_turn();
      fw::WgmmaWait<1>();
      fw::Pin(acc_s);
      if (j == key_tiles - 1) release_q();
      softmax(j, key_tiles, row, rescale);
      fw::WgmmaWaitAll();
      fw::Pin(acc_o);
      release(stage + j - 1);
      rescale_o(rescale);
      fa::AccumulatorToA<kN>(pa, acc_s);
    }
    wait_turn();
    fw::WgmmaFence();
    issue_values(stage + key_tiles - 1);
    pass_turn();
    fw::WgmmaWaitAll();
    fw::Pin(acc_o);
    release(stage + key_tiles - 1);
    stage += key_tiles;

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float total = sum[r];
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      if ((lane & 3) == 0 && lse != nullptr) lse[row_base + row + r * 8] = (max2[r] + log2f(total)) * fa::kLn2;
      // One division a row, then products (64 IEEE divisions a thread would cost the epilogue
      // as much as a tile's softmax); within the 1-ulp fp32 slack of the op's O / l.
      const float inverse = 1.f / total;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        acc_o[n][2 * r] *= inverse;
        acc_o[n][2 * r + 1] *= inverse;
      }
    }
    if (o != nullptr) {
      fa::StoreAccumulator<kD>(o + (row_base + block.q0 + c * fw::kRowsPerConsumer + warp * 16) * kD, acc_o);
    }
  }
  turns.Finish();
}


// dq of attention(q, k, v) on wgmma, given dout (bf16), lse (forward) and delta: the same
// products and roundings as FlashAttentionBackwardDq (kernels/flash_attention.cuh's top
// comment), on the forward's block (a producer and two consumer warpgroups of 64 query rows).
// Per 64-key tile, a consumer computes S = q kᵀ and dP = dO vᵀ with both operands in shared
// memory, dS = P (dP - Delta) scale in registers, and dq += bf16(dS) k with dS as wgmma's
// register A operand and k read N-major. Consumer 0's rows end 64 keys before consumer 1's,
// so it frees the block's last key tile without computing on it. Persistent, as the forward:
// a block walks the query blocks ZigzagTile gives it, reloading its q and dO tiles once both
// consumers are done with them. Launch: FlashAttentionWgmmaBackwardDqLaunch; the wrapper
// declares __launch_bounds__(384).
template <typename TDQ, int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
__device__ __forceinline__ void FlashAttentionWgmmaBackwardDq(TDQ* __restrict__ dq, const __nv_bfloat16* __restrict__ q,
                                                              const __nv_bfloat16* __restrict__ k,
                                                              const __nv_bfloat16* __restrict__ v,
                                                              const __nv_bfloat16* __restrict__ dout,
                                                              const float* __restrict__ lse,
                                                              const float* __restrict__ delta, float scale) {
  namespace fa = flash_attention;
  namespace fw = flash_attention_wgmma;
  static_assert(kSeqLen % fw::kBlockM == 0, "T must be a multiple of 128 (the wgmma kernel's tiles)");
  constexpr int kM = fw::kBlockM, kN = fw::kDqKeyTile, kD = kHeadDim;
  constexpr int kStages = fw::DqStages(kD);
  constexpr unsigned kTileBytes = kN * kD * fa::kBf16Bytes;
  constexpr int kTiles = kSeqLen / kM * kBatch * kHeads;
  using Block = fw::QueryBlock<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  const int grid = static_cast<int>(gridDim.x), me = static_cast<int>(blockIdx.x);

  const unsigned q_tile = (fa::SharedAddress(fa::SharedTiles()) + 1023u) & ~1023u;
  const unsigned do_tile = q_tile + kM * kD * fa::kBf16Bytes;
  const unsigned k_tiles = do_tile + kM * kD * fa::kBf16Bytes;
  const unsigned v_tiles = k_tiles + kStages * kTileBytes;
  // first: the q and dO tiles landed; kept_empty: both consumers are done with them.
  const fw::Pipeline<kStages> pipe(v_tiles + kStages * kTileBytes);

  const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  pipe.Init(fw::kConsumers * 4);

  // At D 64 the launch's registers suffice every warp (ptxas, unable to tell the count at entry
  // there, would drop setmaxnreg anyway: its C7508); at D 128 the consumers take 216.
  constexpr bool kMoveRegisters = kD > 64;
  if (warpgroup == 0) {
    if constexpr (kMoveRegisters) asm volatile("setmaxnreg.dec.sync.aligned.u32 72;\n");
    int stage = 0;
    for (int visit = 0, tile; (tile = fw::ZigzagTile(visit, me, grid, kTiles)) >= 0; ++visit) {
      const Block block(k, v, tile);
      const int key_tiles = (block.q0 + kM) / kN;  // the tiles at or before the block's last query
      if (visit > 0) pipe.WaitKeptFree(visit);
      fw::LoadTile<kM, kD>(q_tile, q + (block.row_base + block.q0) * kD, t);
      fw::LoadTile<kM, kD>(do_tile, dout + (block.row_base + block.q0) * kD, t);
      fa::CpAsyncCommit();
      pipe.Produce(stage, stage + key_tiles, [&](int j, int s) {
        fw::LoadTile<kN, kD>(k_tiles + s * kTileBytes, block.k_head + static_cast<long long>(j) * kN * kD, t);
        fw::LoadTile<kN, kD>(v_tiles + s * kTileBytes, block.v_head + static_cast<long long>(j) * kN * kD, t);
      });
      stage += key_tiles;
    }
    return;
  }

  if constexpr (kMoveRegisters) asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n");
  const int c = warpgroup - 1;
  const int warp = t / kWarpSize, lane = t % kWarpSize;
  const int col = (lane & 3) * 2;
  const float scale_log2 = scale * fa::kLog2e;

  // Two turns a key tile (fw::Turns): one for S and dP, one for dq's product; consumer 0 takes
  // each query block's last tile's turns without issuing.
  const fw::Turns turns(c);
  int stage = 0;  // of the query block's key tile 0
  for (int visit = 0, tile; (tile = fw::ZigzagTile(visit, me, grid, kTiles)) >= 0; ++visit) {
    const Block block(k, v, tile);
    const int q0 = block.q0;
    const int key_tiles = (q0 + kM) / kN;
    const long long row_base = block.row_base;
    const int row = q0 + c * fw::kRowsPerConsumer + warp * 16 + (lane >> 2);  // and row + 8
    const int my_tiles = (q0 + (c + 1) * fw::kRowsPerConsumer) / kN;  // the last one is this consumer's diagonal
    float lse2[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lse2[r] = lse[row_base + row + r * 8] * fa::kLog2e;
      row_delta[r] = delta[row_base + row + r * 8];
    }
    float acc_dq[kD / 8][4];
    fa::Zero(acc_dq);

    pipe.WaitFirst(visit);
    for (int j = 0; j < key_tiles; ++j) {
      const int s = (stage + j) % kStages;
      pipe.WaitFull(stage + j);
      const bool computes = j < my_tiles;
      turns.Wait();
      if (!computes) {
        turns.Pass();
        turns.Wait();
        turns.Pass();
      } else {
        const unsigned k_tile = k_tiles + s * kTileBytes, v_tile = v_tiles + s * kTileBytes;
        float acc_s[kN / 8][4], acc_dp[kN / 8][4];  // S = q kᵀ, dP = dO vᵀ
        fw::ScoresAndScoreGradients<kN, kD, kM>(acc_s, acc_dp, q_tile, k_tile, do_tile, v_tile,
                                                c * fw::kRowsPerConsumer, [&] { turns.Pass(); });
        const bool diagonal = j == my_tiles - 1;
        if (diagonal) {  // this warp's last read of the q and dO tiles is done
          __syncwarp();
          if (lane == 0) pipe.ReleaseKept();
        }
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            float p = fa::Probability(acc_s[n][e], scale_log2, lse2[r]);
            if (diagonal && j * kN + n * 8 + col + (e & 1) > row + r * 8) p = 0.f;
            acc_s[n][e] = p * (acc_dp[n][e] - row_delta[r]) * scale;  // dS
          }
        }
        unsigned dsa[kN / 16][4];
        fa::AccumulatorToA<kN>(dsa, acc_s);
        turns.Wait();
        fw::WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kN / 16; ++kk) fw::WgmmaRS<kD>(acc_dq, dsa[kk], fw::NMajor<kN>(k_tile, kk));
        fw::WgmmaCommit();
        turns.Pass();
        fw::WgmmaWaitAll();
        fw::Pin(acc_dq);
      }
      __syncwarp();
      if (lane == 0) pipe.Release(s);
    }
    stage += key_tiles;
    fa::StoreAccumulator<kD>(dq + (row_base + q0 + c * fw::kRowsPerConsumer + warp * 16) * kD, acc_dq);
  }
  turns.Finish();
}

// dk and dv of attention(q, k, v) on wgmma, each summed over the query heads that share the kv
// head: the same products and roundings as FlashAttentionBackwardDkDv. A block holds 128 keys
// (consumer c the 64 from k0 + 64c, its k and v rows the A operands of Sᵀ = k qᵀ and dPᵀ = v dOᵀ
// in shared memory) and walks, in order, each query head of the group and each 64-query tile at
// or after k0; the producer streams the q and dO tiles with their rows' LSE and Delta. Pᵀ and
// dSᵀ = Pᵀ (dPᵀ - Delta) scale become the register A operands of dv += bf16(Pᵀ) dO and
// dk += bf16(dSᵀ) q, with dO and q read N-major. Launch: FlashAttentionWgmmaBackwardDkDvLaunch;
// the wrapper declares __launch_bounds__(384). Persistent, as the forward: a block walks the
// key blocks ZigzagTile gives it (key block 0, with the most queries after it, first),
// reloading its k and v tiles once both consumers are done with them. A consumer holds dk, dv, Sᵀ and dPᵀ at once
// (224 registers at D 128), so there the producer keeps 56 (at 40 its walk over the key blocks
// spills) and the consumers get 224 (128 * 56 + 256 * 224 <= 65536).
//
// With kAccumulateDq (FlashAttentionWgmmaBackward, head dim 128) the same blocks also add each
// query tile's share of dq = Σ bf16(dS) k over their 128 keys into `dq` (fp32, zeroed before):
// both consumers store their dSᵀ transposed into a shared dS tile (stmatrix; zeros where all
// of a consumer's keys come after the tile's queries), meet, and each
// computes dq's 64 columns from 64c with dS and k both in shared memory, then adds them into
// global memory (red.global.add). That is 5 products a key block and query tile where the dq
// kernel's separate walk costs 7 (it recomputes S and dP). The consumers run in step (the dS
// tile joins them every tile), not in turns; two dS buffers let one consumer store the next
// tile's while the other still reads this one's.
namespace flash_attention_wgmma {
template <bool kAccumulateDq, typename TDKV, int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
__device__ __forceinline__ void BackwardKeyBlocks(float* __restrict__ dq, TDKV* __restrict__ dk,
                                                  TDKV* __restrict__ dv, const __nv_bfloat16* __restrict__ q,
                                                  const __nv_bfloat16* __restrict__ k,
                                                  const __nv_bfloat16* __restrict__ v,
                                                  const __nv_bfloat16* __restrict__ dout,
                                                  const float* __restrict__ lse, const float* __restrict__ delta,
                                                  float scale) {
  namespace fa = flash_attention;
  namespace fw = flash_attention_wgmma;
  static_assert(!kAccumulateDq || kHeadDim == 128, "the fused dq splits head dim 128 between the consumers");
  using Shape = fa::Shape<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  static_assert(kSeqLen % fw::kBlockM == 0, "T must be a multiple of 128 (the wgmma kernel's tiles)");
  constexpr int kN = fw::kBlockM, kM = fw::kDkDvQueryTile, kD = kHeadDim;
  constexpr int kStages = fw::DkDvStages(kD);
  constexpr int kBKv = kBatch * kKvHeads;
  constexpr int kGroup = Shape::kGroup;
  constexpr unsigned kTileBytes = kM * kD * fa::kBf16Bytes;
  constexpr int kTiles = kSeqLen / kN * kBKv;
  const int grid = static_cast<int>(gridDim.x), me = static_cast<int>(blockIdx.x);
  // Key block `tile` (of kTiles, heaviest first: the most queries after it).
  struct KeyBlock {
    int batch, kv_head, k0, first_tile, tiles_per_head, stages;
    long long kv_base;
    __device__ __forceinline__ explicit KeyBlock(int tile) {
      const int bkv = tile % kBKv;
      batch = bkv / kKvHeads;
      kv_head = bkv % kKvHeads;
      k0 = tile / kBKv * kN;
      kv_base = static_cast<long long>(bkv) * kSeqLen;
      first_tile = k0 / kM;
      tiles_per_head = kSeqLen / kM - first_tile;
      stages = kGroup * tiles_per_head;
    }
  };

  const unsigned k_tile = (fa::SharedAddress(fa::SharedTiles()) + 1023u) & ~1023u;
  const unsigned v_tile = k_tile + kN * kD * fa::kBf16Bytes;
  const unsigned q_tiles = v_tile + kN * kD * fa::kBf16Bytes;  // [kStages]
  const unsigned do_tiles = q_tiles + kStages * kTileBytes;      // [kStages]
  const unsigned lse_tiles = do_tiles + kStages * kTileBytes;    // [kStages][kM] floats
  const unsigned delta_tiles = lse_tiles + kStages * kM * 4;     // [kStages][kM] floats
  // first: the k and v tiles landed; kept_empty: both consumers are done with them.
  const fw::Pipeline<kStages> pipe(delta_tiles + kStages * kM * 4);
  // The fused dq's two dS tiles (kM queries x kN keys, bf16), after the barriers.
  constexpr unsigned kDsTileBytes = kM * kN * fa::kBf16Bytes;
  const unsigned ds_tiles = (delta_tiles + kStages * kM * 4 + fw::kBarrierBytes + 1023u) & ~1023u;

  const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  // Every consumer thread arrives on empty (see the end of the consumers' loop).
  pipe.Init(fw::kConsumers * 128);

  // As in dq: at D 64 the launch's registers suffice and ptxas would drop setmaxnreg.
  constexpr bool kMoveRegisters = kD > 64;
  if (warpgroup == 0) {
    if constexpr (kMoveRegisters) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
    int begin = 0;
    for (int visit = 0, tile; (tile = fw::ZigzagTile(visit, me, grid, kTiles)) >= 0; ++visit) {
      const KeyBlock kb(tile);
      if (visit > 0) pipe.WaitKeptFree(visit);
      fw::LoadTile<kN, kD>(k_tile, k + (kb.kv_base + kb.k0) * kD, t);
      fw::LoadTile<kN, kD>(v_tile, v + (kb.kv_base + kb.k0) * kD, t);
      fa::CpAsyncCommit();
      // The stage's first row of q, dO, LSE and Delta, walked on (not divided out of the stage
      // number: the producer has few registers): the query tiles from k0 to the end of each head
      // of the group in turn.
      long long row = (static_cast<long long>(kb.batch) * kHeads + kb.kv_head * kGroup) * kSeqLen + kb.k0;
      int left = kb.tiles_per_head;  // in this head
      pipe.Produce(begin, begin + kb.stages, [&](int, int s) {
        fw::LoadTile<kM, kD>(q_tiles + s * kTileBytes, q + row * kD, t);
        fw::LoadTile<kM, kD>(do_tiles + s * kTileBytes, dout + row * kD, t);
        // The rows' LSE and Delta: 16-byte chunks by the first 2 * kM / 4 threads.
        if (t < kM / 4) {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(lse_tiles + s * kM * 4 + t * 16),
                       "l"(lse + row + t * 4));
        } else if (t < kM / 2) {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(delta_tiles + s * kM * 4 + (t - kM / 4) * 16),
                       "l"(delta + row + (t - kM / 4) * 4));
        }
        row += kM;
        if (--left == 0) {  // the next head's tile at k0
          left = kb.tiles_per_head;
          row += kb.k0;
        }
      });
      begin += kb.stages;
    }
    return;
  }

  if constexpr (kMoveRegisters) asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
  const int c = warpgroup - 1;
  const int warp = t / kWarpSize, lane = t % kWarpSize;
  const int col = (lane & 3) * 2;                        // its queries: q0 + 8n + col (+1)
  const float scale_log2 = scale * fa::kLog2e;
  const float* lse_shared = reinterpret_cast<const float*>(fa::SharedTiles()) +
                            (lse_tiles - fa::SharedAddress(fa::SharedTiles())) / 4;
  const float* delta_shared = lse_shared + kStages * kM;

  // Two turns a query tile (fw::Turns): one for Sᵀ and dPᵀ, one for dv's and dk's products;
  // consumer 1 takes the turns of each head's first tile (all of its queries before its keys)
  // without issuing. With kAccumulateDq the consumers run in step instead.
  const fw::Turns turns(c, !kAccumulateDq);
  int begin = 0;  // the stage of the key block's first query tile
  for (int visit = 0, tile; (tile = fw::ZigzagTile(visit, me, grid, kTiles)) >= 0; ++visit) {
    const KeyBlock kb(tile);
    const int key_c0 = kb.k0 + c * fw::kRowsPerConsumer;  // this consumer's first key
    const int key = key_c0 + warp * 16 + (lane >> 2);     // this thread's keys: key and key + 8
    float acc_dk[kD / 8][4], acc_dv[kD / 8][4];
    fa::Zero(acc_dk);
    fa::Zero(acc_dv);

    pipe.WaitFirst(visit);
    int q0 = kb.k0;  // the stage's first query: from k0 to the end of each head of the group in turn
    // The stage's query head's first row in q, dO and dq.
    long long head_row = (static_cast<long long>(kb.batch) * kHeads + kb.kv_head * kGroup) * kSeqLen;
    for (int i = 0; i < kb.stages; ++i) {
      const int stage = begin + i;
      const int s = stage % kStages;
      [[maybe_unused]] const unsigned ds_tile = ds_tiles + (stage % fw::kFusedDsTiles) * kDsTileBytes;  // fused dq
      pipe.WaitFull(stage);
      const bool last_stage = i == kb.stages - 1;
      turns.Wait();
      if (q0 + kM - 1 < key_c0) {  // every query of the tile before every key of this consumer
        turns.Pass();
        turns.Wait();
        turns.Pass();
        if constexpr (kAccumulateDq) {  // its half of dS is 0
          const unsigned zero[kM / 16][4] = {};
          fw::StoreTransposed<kM, kM>(ds_tile, zero, c * fw::kRowsPerConsumer + warp * 16);
        }
      } else {
        const unsigned q_tile = q_tiles + s * kTileBytes, do_tile = do_tiles + s * kTileBytes;
        float acc_s[kM / 8][4], acc_dp[kM / 8][4];  // Sᵀ = k qᵀ, dPᵀ = v dOᵀ
        fw::ScoresAndScoreGradients<kM, kD, kN>(acc_s, acc_dp, k_tile, q_tile, v_tile, do_tile,
                                                c * fw::kRowsPerConsumer, [&] { turns.Pass(); });
        // The last query tile is after every key (k0 <= T - 128), so both consumers compute it:
        // their last reads of the k and v tiles are done (every thread arrives, as on empty);
        // the fused dq reads k once more, below.
        if (!kAccumulateDq && last_stage) pipe.ReleaseKept();
        const bool masked = key_c0 + fw::kRowsPerConsumer - 1 > q0;  // some key after some query
        const float* lse_row = lse_shared + s * kM;
        const float* delta_row = delta_shared + s * kM;
#pragma unroll
        for (int n = 0; n < kM / 8; ++n) {
          const float2 lse_pair = *reinterpret_cast<const float2*>(lse_row + n * 8 + col);
          const float2 delta_pair = *reinterpret_cast<const float2*>(delta_row + n * 8 + col);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float lse2 = ((e & 1) ? lse_pair.y : lse_pair.x) * fa::kLog2e;
            float p = fa::Probability(acc_s[n][e], scale_log2, lse2);
            if (masked && key + (e >> 1) * 8 > q0 + n * 8 + col + (e & 1)) p = 0.f;
            acc_s[n][e] = p;
            acc_dp[n][e] = p * (acc_dp[n][e] - ((e & 1) ? delta_pair.y : delta_pair.x)) * scale;  // dSᵀ
          }
        }
        unsigned pa[kM / 16][4], dsa[kM / 16][4];
        fa::AccumulatorToA<kM>(pa, acc_s);
        fa::AccumulatorToA<kM>(dsa, acc_dp);
        if constexpr (kAccumulateDq) {
          fw::StoreTransposed<kM, kM>(ds_tile, dsa, c * fw::kRowsPerConsumer + warp * 16);
        }
        turns.Wait();
        fw::WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kM / 16; ++kk) fw::WgmmaRS<kD>(acc_dv, pa[kk], fw::NMajor<kM>(do_tile, kk));
#pragma unroll
        for (int kk = 0; kk < kM / 16; ++kk) fw::WgmmaRS<kD>(acc_dk, dsa[kk], fw::NMajor<kM>(q_tile, kk));
        fw::WgmmaCommit();
        turns.Pass();
        if constexpr (!kAccumulateDq) {
          fw::WgmmaWaitAll();
          fw::Pin(acc_dv);
          fw::Pin(acc_dk);
        }
      }
      if constexpr (kAccumulateDq) {
        // dq's columns 64c.. of the tile's 64 queries = dS (kM x kN) k (kN x 64), once both
        // consumers' halves of dS are stored.
        static_assert(kD == 2 * 64, "each consumer's dq columns are one 64-column block of k");
        const unsigned k_columns = k_tile + c * kN * 128;  // k's 64-column block c
        fw::FenceProxyAsync();
        fw::ConsumersSync();
        float acc_dq[8][4];
        fw::WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kN / 16; ++kk) {
          fw::WgmmaSS64<1>(acc_dq, fw::KMajor<kM>(ds_tile, 0, kk), fw::NMajor<kN>(k_columns, kk), kk > 0);
        }
        fw::WgmmaCommit();
        fw::WgmmaWaitAll();
        fw::Pin(acc_dq);
        fw::Pin(acc_dv);
        fw::Pin(acc_dk);
        if (last_stage) pipe.ReleaseKept();
        fw::AddAccumulator<8>(dq + (head_row + q0 + warp * 16) * kD + c * 64, acc_dq, kD);
      }
      // Every consumer thread arrives (not one per warp): its own reads of the stage's LSE and
      // Delta (generic loads, unlike wgmma's) are then ordered before the producer refills it.
      pipe.Release(s);
      q0 += kM;
      if (q0 == kSeqLen) {  // the group's next head, from k0
        q0 = kb.k0;
        head_row += kSeqLen;
      }
    }
    begin += kb.stages;
    // attention_grad computes dk and dv as separate nodes: each passes null for the other.
    if (dk != nullptr) fa::StoreAccumulator<kD>(dk + (kb.kv_base + key_c0 + warp * 16) * kD, acc_dk);
    if (dv != nullptr) fa::StoreAccumulator<kD>(dv + (kb.kv_base + key_c0 + warp * 16) * kD, acc_dv);
  }
  turns.Finish();
}
}  // namespace flash_attention_wgmma

template <typename TDKV, int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
__device__ __forceinline__ void FlashAttentionWgmmaBackwardDkDv(TDKV* __restrict__ dk, TDKV* __restrict__ dv,
                                                                const __nv_bfloat16* __restrict__ q,
                                                                const __nv_bfloat16* __restrict__ k,
                                                                const __nv_bfloat16* __restrict__ v,
                                                                const __nv_bfloat16* __restrict__ dout,
                                                                const float* __restrict__ lse,
                                                                const float* __restrict__ delta, float scale) {
  flash_attention_wgmma::BackwardKeyBlocks<false, TDKV, kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>(
      nullptr, dk, dv, q, k, v, dout, lse, delta, scale);
}

// dq, dk and dv of attention(q, k, v) in one walk over the key blocks (head dim 128): dq is
// added into (fp32, zeroed before: FlashAttentionZero), dk and dv stored as in
// FlashAttentionWgmmaBackwardDkDv. Launch: FlashAttentionWgmmaBackwardLaunch.
template <int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
__device__ __forceinline__ void FlashAttentionWgmmaBackward(float* __restrict__ dq, float* __restrict__ dk,
                                                            float* __restrict__ dv, const __nv_bfloat16* __restrict__ q,
                                                            const __nv_bfloat16* __restrict__ k,
                                                            const __nv_bfloat16* __restrict__ v,
                                                            const __nv_bfloat16* __restrict__ dout,
                                                            const float* __restrict__ lse,
                                                            const float* __restrict__ delta, float scale) {
  flash_attention_wgmma::BackwardKeyBlocks<true, float, kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>(
      dq, dk, dv, q, k, v, dout, lse, delta, scale);
}

// p[0 .. kCount) = 0, a grid-stride loop of 16-byte stores (FlashAttentionZeroLaunch).
template <long long kCount>
__device__ __forceinline__ void FlashAttentionZero(float* __restrict__ p) {
  static_assert(kCount % 4 == 0, "whole float4s");
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < kCount / 4; i += stride) {
    reinterpret_cast<float4*>(p)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

}  // namespace kiln::kernels

#endif  // __CUDACC__ || __CUDACC_RTC__
