// A gemm of few rows, the decode step's: D[m, n] = alpha sum_k A[m, k] B[n, k] (+ beta C[m, n])
// for M <= 8, A [M, K] and B [N, K] both K-inner (a_layout=mk, b_layout=nk: the activations,
// one row per sequence, against a linear layer's weight; C the residual stream a projection
// adds into), as ir/op_table.h's gemm defines it without an epilogue (codegen/lower_gemv.cc
// says when a gemm takes this kernel instead of cuBLASLt).
//
// Why: at M <= 8 a GEMM reads its weight once and does next to no arithmetic, so its time is
// the weight's bytes over the bandwidth it reaches; cuBLASLt's kernels reach about 1.8 TB/s
// of the H200's 4.8 there (bench/RESULTS.md, session 15: 13 us for llama-M's 23 MB MLP
// weights). This kernel streams B once with 16-byte loads that bypass L1 (evict-first: a
// weight is not read again this step), many in flight per warp, and keeps A, which every warp
// reads, in L1.
//
// Geometry: a block is kGroups groups of kSplit warps; a group computes kRows consecutive rows
// of B (columns of D) for all M rows of A, its warps splitting K: warp p of the group takes the
// 16-byte chunks p * 32 + lane, (kSplit + p) * 32 + lane, ... of each row, kUnroll of them
// loaded before any is used (a long row is split so that one round of loads covers it). Each
// warp's partial sums meet in a butterfly reduction, the group's warps' in shared memory, in
// warp order (a fixed order: the same bits every run). Each A chunk loaded serves kRows rows of
// B. Accumulation is f32 with fmaf, one rounding to D's dtype at the store, alpha applied to
// the f32 sum and then beta C, each rounded to f32 as the reference does. K must be a
// multiple of the 16-byte vector (the lowering checks). C may not be D's buffer (the plan
// gives it none).
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// silu(g) * u of a gemm's gate and up sums, rounded where the ops it replaces round (ir/fusion.h,
// kGemvGlu): the gemm's D (TG), then sigmoid(g), g * sigmoid(g) and that times u, each to TG;
// sigmoid as codegen's elementwise kernels compute it (codegen/elementwise_lowering.cc).
template <typename TG>
struct SwiGlu {
  static __device__ __forceinline__ TG Apply(float gate_sum, float up_sum) {
    const float g = ToFloat(FromFloat<TG>(gate_sum)), u = ToFloat(FromFloat<TG>(up_sum));
    float s;
    if constexpr (sizeof(TG) < sizeof(float)) {
      s = __fdividef(1.0f, 1.0f + __expf(-g));
    } else {
      s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    }
    s = ToFloat(FromFloat<TG>(s));
    const float t = ToFloat(FromFloat<TG>(__fmul_rn(g, s)));
    return FromFloat<TG>(__fmul_rn(t, u));
  }
};

// The plain form's Glu: none.
struct NoGlu {};
template <typename G>
struct IsGlu {
  static constexpr bool kValue = true;
};
template <>
struct IsGlu<NoGlu> {
  static constexpr bool kValue = false;
};

// The sums of squares of kM rows that one GEMV adds up as it stores them and the next reads
// (fuse-norm-between-gemvs: the rms_norm between the two is applied by the second as it reads
// its A): the node's persistent bytes (codegen/kernel_spec.h), zero when the executable is
// made and left zero by every launch pair. Per row kSlots slots of two unsigned 64-bit
// integers, the whole part of the squares added and their fraction in units of 2^-32; then
// the count of the second GEMV's blocks that have read them. A group of the first GEMV adds
// the squares of its columns (an f32 sum, in column order) to slot group % kSlots with two
// fire-and-forget atomic adds: integer sums do not depend on the order the groups add in, so
// the bits are the same every run, and the slots spread the adds over 32 addresses. No fence
// and no count is needed there: the second GEMV's grid-dependency wait already waits for the
// whole first grid and its memory. Exact for sums below 2^64 in whole part, each group's
// fraction rounded to 2^-32 (at most 2^-33 an add: against eps = 1e-6 at K = 2048, a relative
// error below 1e-4 of r even for a row of zeros).
template <int kM>
struct SquareSums {
  static constexpr int kSlots = 32;
  static constexpr long long kWords = static_cast<long long>(kM) * kSlots * 2;
  // The persistent bytes a launch pair needs.
  static constexpr long long kBytes = kWords * 8 + 8;

  static __device__ __forceinline__ void Add(unsigned long long* sums, int m, long long group, float squares) {
    const float whole = floorf(squares);
    unsigned long long* slot = sums + (static_cast<long long>(m) * kSlots + group % kSlots) * 2;
    atomicAdd(slot, static_cast<unsigned long long>(whole));
    atomicAdd(slot + 1, __float2ull_rn(__fmul_rn(__fsub_rn(squares, whole), 4294967296.0f)));
  }

  // 1 / sqrtf(sum / k + eps) of row m, in every lane of the calling warp (after the wait).
  static __device__ __forceinline__ float InverseRms(const unsigned long long* sums, int m, float k, float eps) {
    const int lane = threadIdx.x % kWarpSize;
    unsigned long long whole, fraction;
    asm volatile("ld.global.cg.v2.u64 {%0, %1}, [%2];"
                 : "=l"(whole), "=l"(fraction)
                 : "l"(sums + (static_cast<long long>(m) * kSlots + lane) * 2)
                 : "memory");
#pragma unroll
    for (int mask = kWarpSize / 2; mask > 0; mask /= 2) {
      whole += __shfl_xor_sync(0xffffffffu, whole, mask);
      fraction += __shfl_xor_sync(0xffffffffu, fraction, mask);
    }
    const float sum = static_cast<float>(static_cast<double>(whole) + static_cast<double>(fraction) * 0x1p-32);
    return 1.f / sqrtf(sum / k + eps);
  }

  // Counts a block as having read the sums (after all its warps have: a barrier first);
  // returns the count before it. Release orders the block's reads before the count, acquire
  // the last block's clearing after every other block's count.
  static __device__ __forceinline__ unsigned int CountReader(unsigned long long* sums) {
    unsigned int before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(before)
                 : "l"(reinterpret_cast<unsigned int*>(sums + kWords))
                 : "memory");
    return before;
  }

  // By the last block to read them: zero for the next launch pair (which follows this grid).
  static __device__ __forceinline__ void Clear(unsigned long long* sums) {
    for (long long i = 0; i < kWords; ++i) sums[i] = 0;
    *reinterpret_cast<unsigned int*>(sums + kWords) = 0;
  }
};

// kWeightsBeforeWait (codegen, where B is step-invariant: a decode step's weight): the first
// round of B's loads is issued before the kernel waits for the kernels ahead
// (GridDependencyWait, here), and A and C are read after it through ordered loads
// (common.cuh: a `const __restrict__` read may become ld.global.nc, which the compiler may
// schedule ahead of the wait). Its blocks become resident while the kernel ahead runs (paged
// attention, a norm), so their first bytes of B stream then instead of after it.
// Glu (not NoGlu: SwiGlu<TD>): the GLU form (passes/fuse_gemv_glu.h). B holds 2 kN rows, the
// gate rows then the up rows; a group computes output column j from rows j and kN + j
// (kRows 2) and stores Glu::Apply of the two sums: D [M, kN].
template <typename T, typename TD, int kM, long long kN, long long kK, int kRows, int kSplit, int kUnroll, int kGroups,
          bool kHasC = false, bool kWeightsBeforeWait = false, typename Glu = NoGlu>
struct SmallMGemm {
  static constexpr int kVec = Packed128<T>::kSize;
  static constexpr bool kGlu = IsGlu<Glu>::kValue;
  static_assert(kK % kVec == 0, "K must be whole 16-byte chunks");
  static_assert(kM >= 1 && kRows >= 1 && kUnroll >= 1 && kSplit >= 1 && kGroups >= 1,
                "at least one row, one B row, one chunk in flight and one warp");
  static_assert(!kGlu || (kRows == 2 && !kHasC), "a GLU group sums a gate row and an up row, and adds no C");
  static constexpr long long kChunks = kK / kVec;
  // Columns of D a block computes (a GLU group computes one from its two rows).
  static constexpr long long kRowsPerBlock = static_cast<long long>(kGlu ? 1 : kRows) * kGroups;
  static constexpr long long kBlocks = CeilDiv(kN, kRowsPerBlock);
  static constexpr long long kRound = static_cast<long long>(kUnroll) * kSplit * kWarpSize;  // chunks a round

  // c: null unless kHasC.
  static __device__ __forceinline__ void Run(TD* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                                             const TD* __restrict__ c, float alpha, float beta) {
    PlainA source{a};
    Stream<false>(out, source, b, c, alpha, beta, nullptr);
  }

  // Run, and the sums of squares of D's rows added into `sums` (fuse-norm-between-gemvs'
  // first kernel: SquareSums below): each group adds those of its columns. D is f32 (the
  // residual stream the next GEMV normalizes).
  static __device__ __forceinline__ void RunAddingSquares(TD* __restrict__ out, const T* __restrict__ a,
                                                          const T* __restrict__ b, const TD* __restrict__ c,
                                                          float alpha, float beta, unsigned long long* sums) {
    static_assert(sizeof(TD) == sizeof(float) && !kGlu, "the squares of an f32 D (the residual stream)");
    PlainA source{a};
    Stream<true>(out, source, b, c, alpha, beta, sums);
  }

  // The GEMV of A = rms_norm(x, w) (fuse-norm-between-gemvs' second kernel), x [kM, kK] f32
  // and w [kK]: A's rows are formed chunk by chunk as they are read, x w, and never stored;
  // each row's sums are scaled by r, from the sums of squares of x's rows that the GEMV before
  // added into `sums` (NormedA).
  template <typename TW>
  static __device__ __forceinline__ void RunNormedA(TD* __restrict__ out, const float* x, const TW* __restrict__ w,
                                                    float eps, unsigned long long* sums, const T* __restrict__ b,
                                                    float alpha) {
    NormedA<TW> source{x, w, sums, eps};
    Stream<false>(out, source, b, nullptr, alpha, 0.0f, nullptr);
  }

 private:
  // Where A's chunks come from: A itself. Each sum is D's as it stands (no scale).
  struct PlainA {
    static constexpr bool kScaled = false;
    const T* __restrict__ a;
    __device__ __forceinline__ void ReadScales() {}
    __device__ __forceinline__ Packed128<T> Chunk(int m, long long chunk) const {
      return kWeightsBeforeWait ? Load128AfterWait<true>(a + m * kK + chunk * kVec) : LoadA(a, m * kK + chunk * kVec);
    }
    // Through a `__restrict__` parameter, which the compiler honours (a member's it does not):
    // A's loads take the read-only path, as when A was Run's own parameter.
    static __device__ __forceinline__ Packed128<T> LoadA(const T* __restrict__ a, long long at) {
      return Load128(a + at);
    }
    __device__ __forceinline__ void Finish() const {}
  };

  // A = rms_norm(x, w) = x r w, r = 1 / sqrtf(sum x^2 / K + eps) a row, with r applied to each
  // row's sums after the loop (Scale) instead of to each element of A: a chunk of A is x w in
  // f32, so the loop starts as soon as the wait is over instead of after reading the sums of
  // squares (an L2 round trip, a warp reduction and a barrier), and A is not rounded to T
  // (the unfused norm rounds it to bf16; the difference is within one bf16 ulp of each element
  // of A, tests/gpu_gemv_test.cc). After the loop every warp adds up the slots of its rows
  // (their bits do not depend on the order the GEMV before added them in); the block's first
  // thread then counts the block as having read them, and the last block to count clears them
  // and the count for the next launch.
  template <typename TW>
  struct NormedA {
    static constexpr bool kScaled = true;
    const float* x;
    const TW* __restrict__ w;
    unsigned long long* sums;
    float eps;
    float r[kM] = {};
    unsigned int readers_before = 0;
    // Warp-collective: every thread of the block calls it.
    __device__ __forceinline__ void ReadScales() {
#pragma unroll
      for (int m = 0; m < kM; ++m) r[m] = SquareSums<kM>::InverseRms(sums, m, static_cast<float>(kK), eps);
      __syncthreads();  // every warp has read the sums before the block is counted
      if (threadIdx.x == 0) readers_before = SquareSums<kM>::CountReader(sums);
    }
    __device__ __forceinline__ float Scale(int m) const { return r[m]; }
    static_assert(kVec % 4 == 0, "A's chunks are whole 16-byte accesses of f32 x");
    __device__ __forceinline__ void Chunk(int m, long long chunk, float (&a)[kVec]) const {
      const long long at = m * kK + chunk * kVec;
      float ws[kVec];
      LoadFloats(w + chunk * kVec, ws);  // a parameter: no kernel of the step writes it
#pragma unroll
      for (int q = 0; q < kVec; q += 4) {
        const Packed128<float> xs = Load128AfterWait<true>(x + at + q);  // x's rows: every warp reads them
#pragma unroll
        for (int j = 0; j < 4; ++j) a[q + j] = __fmul_rn(xs[j], ws[q + j]);
      }
    }
    __device__ __forceinline__ void Finish() const {
      if (threadIdx.x == 0 && readers_before == gridDim.x - 1) SquareSums<kM>::Clear(sums);
    }
  };

  // kSumSquares: RunAddingSquares's sums of squares of the columns stored.
  template <bool kSumSquares, typename ASource>
  static __device__ __forceinline__ void Stream(TD* __restrict__ out, ASource& source, const T* __restrict__ b,
                                                const TD* __restrict__ c, float alpha, float beta,
                                                unsigned long long* sums) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int group = warp / kSplit, part = warp % kSplit;
    const long long first =
        static_cast<long long>(blockIdx.x) * kRowsPerBlock + static_cast<long long>(group) * (kGlu ? 1 : kRows);
    float acc[kM][kRows];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;
    }
    // A B row past N (the last block's, when its rows do not divide N) reads row N - 1 again
    // and is not stored: every warp stays in the loop, the shuffles and the barrier.
    const T* rows[kRows];
    if constexpr (kGlu) {
      const long long column = first < kN ? first : kN - 1;
      rows[0] = b + column * kK;         // gate
      rows[1] = b + (kN + column) * kK;  // up
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) rows[r] = b + (first + r < kN ? first + r : kN - 1) * kK;
    }
    Packed128<T> bv[kUnroll][kRows];
    auto load_round = [&](long long base) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long chunk = base + (u * kSplit + part) * kWarpSize + lane;
        if (chunk < kChunks) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            *reinterpret_cast<int4*>(&bv[u][r]) = __ldcs(reinterpret_cast<const int4*>(rows[r] + chunk * kVec));
          }
        }
      }
    };
    load_round(0);
    if constexpr (kWeightsBeforeWait) GridDependencyWait();
    for (long long base = 0;;) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long chunk = base + (u * kSplit + part) * kWarpSize + lane;
        if (chunk >= kChunks) continue;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          if constexpr (ASource::kScaled) {
            float av[kVec];
            source.Chunk(m, chunk, av);
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
#pragma unroll
              for (int r = 0; r < kRows; ++r) acc[m][r] = fmaf(av[j], ToFloat(bv[u][r][j]), acc[m][r]);
            }
          } else {
            const Packed128<T> av = source.Chunk(m, chunk);
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              const float x = ToFloat(av[j]);
#pragma unroll
              for (int r = 0; r < kRows; ++r) acc[m][r] = fmaf(x, ToFloat(bv[u][r][j]), acc[m][r]);
            }
          }
        }
      }
      base += kRound;
      if (base >= kChunks) break;
      load_round(base);
    }
#if __CUDA_ARCH__ >= 900
    // The next kernel may launch now that the weight has streamed, not before: under
    // programmatic launch its blocks would become resident early and wait, and their shared
    // memory (paged attention's stages: 45 KB a block) takes L1's share of the SM, where A's
    // reads hit (codegen opens this kernel with griddepcontrol.wait alone:
    // KernelSpec::launches_dependents_itself). bench/RESULTS.md, session 21: batch 1 0.888 ms
    // a step with the trigger first, 0.845 with it here.
    asm volatile("griddepcontrol.launch_dependents;");
#endif
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = WarpReduce(acc[m][r], SumOp{});
    }
    source.ReadScales();
    // A row's sum times its scale (NormedA's r), then alpha.
    auto scaled = [&](int m, float sum) {
      if constexpr (ASource::kScaled) sum = __fmul_rn(sum, source.Scale(m));
      return __fmul_rn(alpha, sum);
    };
    // A GLU group's column from its two sums.
    auto store_glu = [&](int m, float gate, float up) {
      if (first >= kN) return;
      if constexpr (kGlu) out[m * kN + first] = Glu::Apply(scaled(m, gate), scaled(m, up));
    };
    // Stores D[m, first + r] and returns its square (0 past N) for kSumSquares.
    auto store = [&](int m, int r, float sum) {
      if (first + r >= kN) return 0.0f;
      const long long at = m * kN + first + r;
      float t = scaled(m, sum);
      if constexpr (kHasC) {
        t = __fadd_rn(t, __fmul_rn(beta, kWeightsBeforeWait ? ToFloatAfterWait(c + at) : ToFloat(c[at])));
      }
      out[at] = FromFloat<TD>(t);
      return __fmul_rn(t, t);
    };
    if constexpr (kSplit == 1) {
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          if constexpr (kGlu) {
            store_glu(m, acc[m][0], acc[m][1]);
          } else {
            float squares = 0.0f;
#pragma unroll
            for (int r = 0; r < kRows; ++r) squares = __fadd_rn(squares, store(m, r, acc[m][r]));
            if constexpr (kSumSquares) SquareSums<kM>::Add(sums, m, blockIdx.x * kGroups + group, squares);
          }
        }
      }
    } else {
      // The group's warps' sums, added in warp order by the group's first warp.
      __shared__ float partial_sums[kGroups][kSplit][kM * kRows];
      __shared__ float squares[kSumSquares ? kGroups : 1][kM * kRows];
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) partial_sums[group][part][m * kRows + r] = acc[m][r];
        }
      }
      __syncthreads();
      if (part == 0) {
        if constexpr (kGlu) {
          for (int m = lane; m < kM; m += kWarpSize) {
            float gate = partial_sums[group][0][m * kRows], up = partial_sums[group][0][m * kRows + 1];
#pragma unroll
            for (int p = 1; p < kSplit; ++p) {
              gate += partial_sums[group][p][m * kRows], up += partial_sums[group][p][m * kRows + 1];
            }
            store_glu(m, gate, up);
          }
        } else {
          for (int i = lane; i < kM * kRows; i += kWarpSize) {
            float sum = partial_sums[group][0][i];
#pragma unroll
            for (int p = 1; p < kSplit; ++p) sum += partial_sums[group][p][i];
            const float square = store(i / kRows, i % kRows, sum);
            if constexpr (kSumSquares) squares[group][i] = square;
          }
          if constexpr (kSumSquares) {
            __syncwarp();
            for (int m = lane; m < kM; m += kWarpSize) {
              float row_squares = 0.0f;
#pragma unroll
              for (int r = 0; r < kRows; ++r) row_squares = __fadd_rn(row_squares, squares[group][m * kRows + r]);
              SquareSums<kM>::Add(sums, m, blockIdx.x * kGroups + group, row_squares);
            }
          }
        }
      }
    }
    source.Finish();
  }
};

}  // namespace kiln::kernels
