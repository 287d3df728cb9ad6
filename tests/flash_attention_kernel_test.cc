// The causal flash attention kernels of kernels/flash_attention.cuh, instantiated from
// extern "C" wrappers as codegen would write them:
//   - without a GPU (CI): every kernel compiles with NVRTC for sm_90a at the shapes of
//     llama-S and llama-M, with geometry that fits an H200, and unsupported shapes are
//     refused with the reason;
//   - on a GPU: at small shapes (GQA groups of 1, 2 and 4, D of 64 and 128, fp32 and bf16
//     inputs and outputs), O, LSE, dq, dk and dv match a CPU double-precision reference
//     (tests/testing/flash_attention_reference.h) within per-element tolerances derived
//     there: accumulation order, plus the neighbouring bf16 value wherever P or dS lies at a
//     rounding boundary within the GPU's fp32 error. The backward is also compared with the
//     unfused IR's own definition of the softmax gradient (Delta = sum dP * P), and runs
//     twice to the same bits (no atomics).
// The Hopper kernels (kernels/flash_attention_wgmma.cuh: forward, dq, dk/dv, and at D 128 the
// fused backward, whose dq is added into in no fixed order) likewise: in CI
// they compile for sm_90a with ptxas reporting no spills (registers and spills printed from
// NVRTC's log); on an sm_90a GPU the forward's O and LSE match the reference and the mma.sync
// forward's O (the same definition with other tiles), and the backward's dq, dk and dv the
// reference and the mma.sync backward, at T of 256 to 1024, D of 64 and 128.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codegen/kernel_spec.h"
#include "codegen/nvrtc_compiler.h"
#include "kernels/flash_attention.cuh"
#include "kernels/flash_attention_wgmma.cuh"
#include "runtime/cuda/kernel_launch.h"
#include "ir/numerics.h"
#include "tests/testing/flash_attention_reference.h"
#include "tests/testing/gpu.h"

namespace kiln {
namespace {

using testing::AttentionShape;
using testing::ToleratedValues;

enum class Float { kF32, kBF16 };
const char* CudaName(Float t) { return t == Float::kF32 ? "float" : "__nv_bfloat16"; }
size_t Bytes(Float t) { return t == Float::kF32 ? 4 : 2; }
DType ToDType(Float t) { return t == Float::kF32 ? DType::kF32 : DType::kBF16; }

struct KernelCase {
  std::string name;
  AttentionShape shape;
  Float o = Float::kF32;      // forward output
  Float dout = Float::kF32;   // the backward's dO
  Float grads = Float::kF32;  // dq, dk, dv
  // SMs the persistent wgmma kernels are launched for: few, so that each block walks several
  // tiles of different weights, exercises the reloads of its kept tiles.
  int sm_count = 132;
};

AttentionShape MakeShape(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_len, int64_t head_dim) {
  return {batch, heads, kv_heads, seq_len, head_dim, 1.0 / std::sqrt(static_cast<double>(head_dim))};
}

// ------------------------------------------------------------------ wrapper sources

// The scale as codegen writes attributes: an exact hexadecimal fp32 literal.
std::string ScaleLiteral(double scale) { return absl::StrFormat("%af", static_cast<float>(scale)); }

std::string ShapeArgs(const AttentionShape& s) {
  return absl::StrCat(s.batch, ", ", s.heads, ", ", s.kv_heads, ", ", s.seq_len, ", ", s.head_dim);
}

KernelSpec Spec(const std::string& name, const std::string& params, const std::string& call,
                const kernels::FlashAttentionLaunch& launch, const char* header = "flash_attention") {
  KernelSpec spec;
  spec.name = name;
  spec.source = absl::StrCat("#include \"kernels/", header, ".cuh\"\n\n",
                             "extern \"C\" __global__ void __launch_bounds__(", launch.block_threads, ") ", name,
                             "(", params, ") {\n  kiln::kernels::", call, ";\n}\n");
  spec.grid = {launch.grid_x, 1, 1};
  spec.block = {launch.block_threads, 1, 1};
  spec.shared_bytes = launch.shared_bytes;
  return spec;
}

constexpr const char* kQkv = "const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v";

KernelSpec ForwardKernel(const KernelCase& c) {
  const AttentionShape& s = c.shape;
  return Spec(absl::StrCat("k_", c.name, "_flash_attention"),
              absl::StrCat(CudaName(c.o), "* o, float* lse, ", kQkv),
              absl::StrCat("FlashAttentionForward<", CudaName(c.o), ", ", ShapeArgs(s), ">(o, lse, q, k, v, ",
                           ScaleLiteral(s.scale), ")"),
              kernels::FlashAttentionForwardLaunch(s.batch, s.heads, s.seq_len, s.head_dim));
}

// The Hopper forward (kernels/flash_attention_wgmma.cuh): same operands and results.
KernelSpec WgmmaForwardKernel(const KernelCase& c) {
  const AttentionShape& s = c.shape;
  return Spec(absl::StrCat("k_", c.name, "_flash_attention_wgmma"),
              absl::StrCat(CudaName(c.o), "* o, float* lse, ", kQkv),
              absl::StrCat("FlashAttentionWgmmaForward<", CudaName(c.o), ", ", ShapeArgs(s), ">(o, lse, q, k, v, ",
                           ScaleLiteral(s.scale), ")"),
              kernels::FlashAttentionWgmmaForwardLaunch(s.batch, s.heads, s.seq_len, s.head_dim, c.sm_count),
              "flash_attention_wgmma");
}

KernelSpec DeltaKernel(const KernelCase& c) {
  const AttentionShape& s = c.shape;
  return Spec(absl::StrCat("k_", c.name, "_flash_attention_delta"),
              absl::StrCat("float* delta, const ", CudaName(c.dout), "* dout, const ", CudaName(c.o), "* o"),
              absl::StrCat("FlashAttentionBackwardDelta<", CudaName(c.dout), ", ", CudaName(c.o), ", ", s.rows(),
                           "LL, ", s.head_dim, ">(delta, dout, o)"),
              kernels::FlashAttentionBackwardDeltaLaunch(s.rows(), s.head_dim));
}

std::string BackwardInputs(const KernelCase& c) {
  return absl::StrCat(kQkv, ", const ", CudaName(c.dout), "* dout, const float* lse, const float* delta");
}

KernelSpec DqKernel(const KernelCase& c) {
  const AttentionShape& s = c.shape;
  return Spec(absl::StrCat("k_", c.name, "_flash_attention_dq"),
              absl::StrCat(CudaName(c.grads), "* dq, ", BackwardInputs(c)),
              absl::StrCat("FlashAttentionBackwardDq<", CudaName(c.dout), ", ", CudaName(c.grads), ", ",
                           ShapeArgs(s), ">(dq, q, k, v, dout, lse, delta, ", ScaleLiteral(s.scale), ")"),
              kernels::FlashAttentionBackwardDqLaunch(s.batch, s.heads, s.seq_len, s.head_dim));
}

KernelSpec DkDvKernel(const KernelCase& c) {
  const AttentionShape& s = c.shape;
  return Spec(absl::StrCat("k_", c.name, "_flash_attention_dkdv"),
              absl::StrCat(CudaName(c.grads), "* dk, ", CudaName(c.grads), "* dv, ", BackwardInputs(c)),
              absl::StrCat("FlashAttentionBackwardDkDv<", CudaName(c.dout), ", ", CudaName(c.grads), ", ",
                           ShapeArgs(s), ">(dk, dv, q, k, v, dout, lse, delta, ", ScaleLiteral(s.scale), ")"),
              kernels::FlashAttentionBackwardDkDvLaunch(s.batch, s.kv_heads, s.seq_len, s.head_dim));
}

// The Hopper backward: dq and dk/dv with the mma.sync kernels' operands (dO bf16 only).
KernelSpec WgmmaDqKernel(const KernelCase& c) {
  const AttentionShape& s = c.shape;
  return Spec(absl::StrCat("k_", c.name, "_flash_attention_wgmma_dq"),
              absl::StrCat(CudaName(c.grads), "* dq, ", BackwardInputs(c)),
              absl::StrCat("FlashAttentionWgmmaBackwardDq<", CudaName(c.grads), ", ", ShapeArgs(s),
                           ">(dq, q, k, v, dout, lse, delta, ", ScaleLiteral(s.scale), ")"),
              kernels::FlashAttentionWgmmaBackwardDqLaunch(s.batch, s.heads, s.seq_len, s.head_dim, c.sm_count),
              "flash_attention_wgmma");
}

KernelSpec WgmmaDkDvKernel(const KernelCase& c) {
  const AttentionShape& s = c.shape;
  return Spec(absl::StrCat("k_", c.name, "_flash_attention_wgmma_dkdv"),
              absl::StrCat(CudaName(c.grads), "* dk, ", CudaName(c.grads), "* dv, ", BackwardInputs(c)),
              absl::StrCat("FlashAttentionWgmmaBackwardDkDv<", CudaName(c.grads), ", ", ShapeArgs(s),
                           ">(dk, dv, q, k, v, dout, lse, delta, ", ScaleLiteral(s.scale), ")"),
              kernels::FlashAttentionWgmmaBackwardDkDvLaunch(s.batch, s.kv_heads, s.seq_len, s.head_dim, c.sm_count),
              "flash_attention_wgmma");
}

// The fused Hopper backward (head dim 128, fp32 gradients: dq is added into) and the kernel
// that zeroes its dq first.
bool HasFusedBackward(const KernelCase& c) {
  return kernels::FlashAttentionWgmmaFusesDq(c.shape.head_dim) && c.grads == Float::kF32;
}
KernelSpec WgmmaFusedBackwardKernel(const KernelCase& c) {
  const AttentionShape& s = c.shape;
  return Spec(absl::StrCat("k_", c.name, "_flash_attention_wgmma_backward"),
              absl::StrCat("float* dq, float* dk, float* dv, ", BackwardInputs(c)),
              absl::StrCat("FlashAttentionWgmmaBackward<", ShapeArgs(s), ">(dq, dk, dv, q, k, v, dout, lse, delta, ",
                           ScaleLiteral(s.scale), ")"),
              kernels::FlashAttentionWgmmaBackwardLaunch(s.batch, s.kv_heads, s.seq_len, s.head_dim, c.sm_count),
              "flash_attention_wgmma");
}
KernelSpec ZeroKernel(const KernelCase& c) {
  const int64_t count = c.shape.q_elements();
  return Spec(absl::StrCat("k_", c.name, "_flash_attention_zero"), "float* p",
              absl::StrCat("FlashAttentionZero<", count, "LL>(p)"),
              kernels::FlashAttentionZeroLaunch(count, c.sm_count), "flash_attention_wgmma");
}

std::vector<KernelSpec> WgmmaKernels(const KernelCase& c) {
  std::vector<KernelSpec> kernels = {WgmmaForwardKernel(c), WgmmaDqKernel(c), WgmmaDkDvKernel(c)};
  if (HasFusedBackward(c)) kernels.push_back(WgmmaFusedBackwardKernel(c));
  return kernels;
}

std::vector<KernelSpec> AllKernels(const KernelCase& c) {
  return {ForwardKernel(c), DeltaKernel(c), DqKernel(c), DkDvKernel(c)};
}

// llama-S and llama-M attention (frontends/presets): bf16 dO as kiln's VJP rounds it.
const KernelCase kLlamaS{"llama_s", MakeShape(16, 12, 4, 1024, 64), Float::kF32, Float::kBF16, Float::kF32};
const KernelCase kLlamaM{"llama_m", MakeShape(4, 16, 8, 2048, 128), Float::kF32, Float::kBF16, Float::kF32};

// --------------------------------------------------------------- no GPU needed (CI)

constexpr uint32_t kH200SharedPerBlock = 227 * 1024;

TEST(FlashAttentionKernelTest, GeometryFitsAnH200) {
  for (const KernelCase& c : {kLlamaS, kLlamaM}) {
    for (const KernelSpec& k : AllKernels(c)) {
      SCOPED_TRACE(k.name);
      EXPECT_EQ(k.block[0] % 32, 0u);
      EXPECT_LE(k.block[0], 1024u);
      EXPECT_GE(k.grid[0], 1u);
      EXPECT_LE(k.shared_bytes, kH200SharedPerBlock);
    }
  }
  // One block per 64 rows of each head (queries) or kv head (keys).
  EXPECT_EQ(ForwardKernel(kLlamaS).grid[0], 16u * 12 * 1024 / 64);
  EXPECT_EQ(DqKernel(kLlamaM).grid[0], 4u * 16 * 2048 / 64);
  EXPECT_EQ(DkDvKernel(kLlamaS).grid[0], 16u * 4 * 1024 / 64);
  EXPECT_EQ(DeltaKernel(kLlamaS).grid[0] * (256 / 8), 16u * 12 * 1024);
}

TEST(FlashAttentionKernelTest, CompilesWithNvrtcAtLlamaShapes) {
  KernelCase fp32_dout = kLlamaM;  // the rounding load path of dO, and a bf16 output
  fp32_dout.name = "llama_m_f32_dout";
  fp32_dout.dout = Float::kF32;
  fp32_dout.o = Float::kBF16;
  for (const KernelCase& c : {kLlamaS, kLlamaM, fp32_dout}) {
    for (const KernelSpec& k : AllKernels(c)) {
      SCOPED_TRACE(k.name);
      absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{});
      ASSERT_TRUE(compiled.ok()) << compiled.status();
      EXPECT_EQ(compiled->name, k.name);
      EXPECT_FALSE(compiled->cubin.empty());
    }
  }
}

TEST(FlashAttentionKernelTest, RefusesUnsupportedShapes) {
  EXPECT_EQ(kernels::FlashAttentionUnsupportedReason(16, 12, 4, 1024, 64), nullptr);
  EXPECT_EQ(kernels::FlashAttentionUnsupportedReason(4, 16, 8, 2048, 128), nullptr);
  EXPECT_STREQ(kernels::FlashAttentionUnsupportedReason(1, 12, 5, 1024, 64),
               "query heads must be a multiple of kv heads (GQA)");
  EXPECT_STREQ(kernels::FlashAttentionUnsupportedReason(1, 4, 4, 100, 64),
               "T must be a positive multiple of 64 (the tile sizes)");
  EXPECT_STREQ(kernels::FlashAttentionUnsupportedReason(1, 4, 4, 128, 96), "D must be 64 or 128");
  // The kernels say the same at compile time.
  const KernelCase bad{"bad", MakeShape(1, 4, 4, 96, 64)};
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(ForwardKernel(bad), NvrtcOptions{});
  ASSERT_FALSE(compiled.ok());
  EXPECT_NE(compiled.status().message().find("T must be a positive multiple of 64"), std::string::npos)
      << compiled.status();
}

// ptxas's report for a kernel (NVRTC with --ptxas-options=-v): registers per thread, and
// bytes of spill stores and loads (local memory the register allocator had to use).
struct PtxasReport {
  int registers = -1, spill_stores = -1, spill_loads = -1;
};
PtxasReport ParsePtxasReport(const std::string& log) {
  PtxasReport r;
  auto number_before = [&](const std::string& what) {
    const size_t at = log.find(what);
    if (at == std::string::npos) return -1;
    size_t begin = at;
    while (begin > 0 && log[begin - 1] == ' ') --begin;
    size_t digits = begin;
    while (digits > 0 && std::isdigit(static_cast<unsigned char>(log[digits - 1]))) --digits;
    return digits == begin ? -1 : std::stoi(log.substr(digits, begin - digits));
  };
  r.spill_stores = number_before("bytes spill stores");
  r.spill_loads = number_before("bytes spill loads");
  const size_t used = log.find("Used ");
  if (used != std::string::npos) r.registers = std::atoi(log.c_str() + used + 5);
  return r;
}

// The persistent forward's zigzag schedule gives every query block to exactly one block, and
// at llama-M's shape (1024 query blocks, 16 weights of causal work, 132 blocks) the busiest
// block has at most 4% more key tiles to walk than the average (3.1%; round robin: 9.2%).
TEST(FlashAttentionKernelTest, WgmmaForwardScheduleCoversEveryQueryBlockOnceAndBalances) {
  namespace fw = kernels::flash_attention_wgmma;
  for (const auto& [tiles, blocks] : std::vector<std::pair<int, int>>{{1024, 132}, {16, 5}, {32, 3}, {200, 132}, {7, 7}}) {
    SCOPED_TRACE(absl::StrCat(tiles, " tiles on ", blocks, " blocks"));
    std::vector<int> owner(tiles, -1);
    for (int b = 0; b < blocks; ++b) {
      int previous = -1;
      for (int n = 0, tile; (tile = fw::ZigzagTile(n, b, blocks, tiles)) >= 0; ++n) {
        ASSERT_LT(tile, tiles);
        EXPECT_GT(tile, previous) << "a block's tiles come in order, so the first -1 ends its walk";
        previous = tile;
        EXPECT_EQ(owner[tile], -1) << "tile " << tile << " given to blocks " << owner[tile] << " and " << b;
        owner[tile] = b;
      }
    }
    for (int tile = 0; tile < tiles; ++tile) EXPECT_GE(owner[tile], 0) << "tile " << tile << " given to no block";
  }
  // llama-M: tile t (of kBH = 64 heads' tiles per query block) walks 16 - t / 64 key tiles.
  constexpr int kTiles = 1024, kBlocks = 132, kBH = 64, kQueryBlocks = 16;
  int busiest = 0, total = 0;
  for (int b = 0; b < kBlocks; ++b) {
    int work = 0;
    for (int n = 0, tile; (tile = fw::ZigzagTile(n, b, kBlocks, kTiles)) >= 0; ++n) work += kQueryBlocks - tile / kBH;
    busiest = std::max(busiest, work);
    total += work;
  }
  EXPECT_LE(busiest * kBlocks, total * 104 / 100) << busiest << " key tiles against an average of "
                                                  << static_cast<double>(total) / kBlocks;
}

TEST(FlashAttentionKernelTest, WgmmaKernelsGeometryFitsAnH200) {
  for (const KernelCase& c : {kLlamaS, kLlamaM}) {
    for (const KernelSpec& k : WgmmaKernels(c)) {
      SCOPED_TRACE(k.name);
      EXPECT_EQ(k.block[0], 384u);  // a producer and two consumer warpgroups
      EXPECT_LE(k.shared_bytes, kH200SharedPerBlock);
    }
  }
  // Persistent: a block an SM, or one a tile where there are fewer (forward and dq: 128 queries
  // of a head; dk/dv: 128 keys of a kv head).
  EXPECT_EQ(WgmmaForwardKernel(kLlamaS).grid[0], 132u);
  EXPECT_EQ(WgmmaForwardKernel(kLlamaM).grid[0], 132u);
  KernelCase few = kLlamaM;
  few.shape = MakeShape(1, 4, 2, 256, 128);
  EXPECT_EQ(WgmmaForwardKernel(few).grid[0], 4u * 256 / 128);
  EXPECT_EQ(WgmmaDqKernel(kLlamaM).grid[0], 132u);
  EXPECT_EQ(WgmmaDkDvKernel(kLlamaS).grid[0], 132u);
  EXPECT_EQ(WgmmaDqKernel(few).grid[0], 4u * 256 / 128);
  EXPECT_EQ(WgmmaDkDvKernel(few).grid[0], 2u * 256 / 128);
  EXPECT_EQ(WgmmaDkDvKernel(kLlamaM).grid[0], 132u);
  // dk/dv at D 128: k and v of 128 keys, three stages of q and dO of 64 queries with their LSE
  // and Delta, the barriers and the alignment slack; the fused backward adds two dS tiles (64
  // queries x 128 keys) and their alignment.
  const unsigned dkdv_bytes = (2 * 128 + 2 * 3 * 64) * 128 * 2 + 2 * 3 * 64 * 4 + 128 + 1024;
  EXPECT_EQ(WgmmaDkDvKernel(kLlamaM).shared_bytes, dkdv_bytes);
  EXPECT_EQ(WgmmaFusedBackwardKernel(kLlamaM).shared_bytes, dkdv_bytes + 1024 + 2 * 64 * 128 * 2);
  EXPECT_EQ(WgmmaFusedBackwardKernel(kLlamaM).grid[0], 132u);
  EXPECT_TRUE(HasFusedBackward(kLlamaM));
  EXPECT_FALSE(HasFusedBackward(kLlamaS));  // D 64 keeps the dq and dk/dv kernels
  // The zero kernel: 4 blocks an SM at most, fewer where dq is small.
  EXPECT_EQ(ZeroKernel(kLlamaM).grid[0], 4u * 132);
  EXPECT_EQ(ZeroKernel(few).grid[0], (1u * 4 * 256 * 128 / 4 + 255) / 256);
}

// The Hopper kernels compile for sm_90a at llama-S (D 64) and llama-M (D 128), fp32 and bf16
// outputs, and ptxas keeps every value in registers: the setmaxnreg splits (producer 72,
// consumers 216; dk/dv's producer 40, consumers 232 at D 128, where the backward moves
// registers at all) leave the consumers room for their accumulators of 64 rows. The report is
// printed for the record.
TEST(FlashAttentionKernelTest, WgmmaKernelsCompileForSm90aWithoutSpills) {
  KernelCase bf16_out = kLlamaM;
  bf16_out.name = "llama_m_bf16_o";
  bf16_out.o = Float::kBF16;
  KernelCase bf16_out_s = kLlamaS;
  bf16_out_s.name = "llama_s_bf16_o";
  bf16_out_s.o = Float::kBF16;
  bf16_out.grads = Float::kBF16;
  bf16_out_s.grads = Float::kBF16;
  for (const KernelCase& c : {kLlamaS, kLlamaM, bf16_out, bf16_out_s}) {
    for (const KernelSpec& k : WgmmaKernels(c)) {
      SCOPED_TRACE(k.name);
      absl::StatusOr<CompiledKernel> compiled = CompileKernel(k, NvrtcOptions{.arch = "sm_90a", .ptxas_info = true});
      ASSERT_TRUE(compiled.ok()) << compiled.status();
      EXPECT_FALSE(compiled->cubin.empty());
      const PtxasReport r = ParsePtxasReport(compiled->log);
      std::printf("  %-48s D%lld: %d registers, %d bytes spill stores, %d bytes spill loads\n", k.name.c_str(),
                  static_cast<long long>(c.shape.head_dim), r.registers, r.spill_stores, r.spill_loads);
      EXPECT_EQ(r.spill_stores, 0) << compiled->log;
      EXPECT_EQ(r.spill_loads, 0) << compiled->log;
      // 384 threads, one block per SM: at most 65536 / 384 rounded down to a multiple of 8 at
      // launch (the D-64 dq needs fewer, 122; setmaxnreg then moves what the block holds).
      EXPECT_LE(r.registers, 168) << compiled->log;
      EXPECT_GT(r.registers, 0) << compiled->log;  // the report was parsed
      // ptxas serializes a kernel's wgmmas (waits after each) when it cannot prove their
      // accumulators untouched while in flight, and says so: that would undo the pipelining.
      EXPECT_FALSE(absl::StrContains(compiled->log, "serialized")) << compiled->log;
    }
  }
}

TEST(FlashAttentionKernelTest, WgmmaForwardRefusesWhatItCannotTile) {
  EXPECT_EQ(kernels::FlashAttentionWgmmaUnsupportedReason(16, 12, 4, 1024, 64), nullptr);
  EXPECT_STREQ(kernels::FlashAttentionWgmmaUnsupportedReason(1, 4, 4, 192, 64),
               "T must be a multiple of 128 (the wgmma kernel's tiles)");
  EXPECT_STREQ(kernels::FlashAttentionWgmmaUnsupportedReason(1, 4, 4, 128, 96), "D must be 64 or 128");
}

// ---------------------------------------------------------------------- on a GPU

// Uniform in [lo, hi) from the raw generator (std distributions differ between libraries),
// rounded to `t`.
std::vector<double> RandomValues(int64_t n, double lo, double hi, DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = RoundToDType(lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1p-53, t);
  return v;
}

std::vector<uint8_t> Encode(const std::vector<double>& values, Float t) {
  std::vector<uint8_t> bytes(values.size() * Bytes(t));
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == Float::kF32) {
      const float f = static_cast<float>(values[i]);
      std::memcpy(&bytes[4 * i], &f, 4);
    } else {
      const uint16_t b = FloatToBF16Bits(static_cast<float>(values[i]));
      std::memcpy(&bytes[2 * i], &b, 2);
    }
  }
  return bytes;
}

std::vector<double> Decode(const std::vector<uint8_t>& bytes, Float t) {
  std::vector<double> values(bytes.size() / Bytes(t));
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == Float::kF32) {
      float f;
      std::memcpy(&f, &bytes[4 * i], 4);
      values[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[2 * i], 2);
      values[i] = BF16BitsToFloat(b);
    }
  }
  return values;
}

// A device buffer of `count` elements of `t`, filled with 0xFF bytes (NaN in every float
// width) unless given contents, so that an element no kernel writes shows.
struct Buffer {
  DeviceMemory memory;
  size_t bytes = 0;
  Float type = Float::kF32;
  void* get() const { return memory.get(); }
};

Buffer NewBuffer(int64_t count, Float t, const std::vector<double>* contents = nullptr) {
  Buffer b;
  b.type = t;
  b.bytes = count * Bytes(t);
  absl::StatusOr<void*> p = testing::TestDevice()->Allocate(b.bytes, "flash attention test buffer");
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return b;
  b.memory.reset(*p);
  if (contents != nullptr) {
    const std::vector<uint8_t> bytes = Encode(*contents, t);
    EXPECT_EQ(cudaMemcpy(b.get(), bytes.data(), b.bytes, cudaMemcpyHostToDevice), cudaSuccess);
  } else {
    EXPECT_EQ(cudaMemset(b.get(), 0xFF, b.bytes), cudaSuccess);
  }
  return b;
}

std::vector<uint8_t> DownloadBytes(const Buffer& b) {
  std::vector<uint8_t> bytes(b.bytes);
  EXPECT_EQ(cudaMemcpy(bytes.data(), b.get(), b.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return bytes;
}
std::vector<double> Download(const Buffer& b) { return Decode(DownloadBytes(b), b.type); }

// One compiled kernel, loaded and ready to launch.
struct GpuKernel {
  std::unique_ptr<KernelLibrary> library;
  KernelLaunch launch;

  void Run(std::vector<void*> pointers) const {
    absl::Status launched = EnqueueLaunch(launch, pointers, testing::TestDevice()->stream(), "flash attention test");
    ASSERT_TRUE(launched.ok()) << launched;
    ASSERT_EQ(cudaStreamSynchronize(testing::TestDevice()->stream()), cudaSuccess) << launch.name;
  }
};

GpuKernel Load(const KernelSpec& spec) {
  GpuKernel k;
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(spec, NvrtcOptions{.arch = testing::TestDevice()->arch()});
  EXPECT_TRUE(compiled.ok()) << compiled.status();
  if (!compiled.ok()) return k;
  absl::StatusOr<std::unique_ptr<KernelLibrary>> library = KernelLibrary::Load(*compiled);
  EXPECT_TRUE(library.ok()) << library.status();
  if (!library.ok()) return k;
  k.library = *std::move(library);
  absl::StatusOr<KernelLaunch> launch = PrepareLaunch(*k.library, spec, testing::TestDevice()->ordinal());
  EXPECT_TRUE(launch.ok()) << launch.status();
  if (launch.ok()) k.launch = *launch;
  return k;
}

// Every element within its tolerance (a bf16 result may also be one rounding away); on
// failure, the count and the worst elements. Prints the largest error and the largest
// fraction of its tolerance used, for the record.
void ExpectWithin(const std::string& what, const std::vector<double>& got, const ToleratedValues& want, Float type) {
  ASSERT_EQ(got.size(), want.value.size()) << what;
  int64_t bad = 0;
  double max_error = 0, max_used = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = want.tolerance[i] + 1e-12;
    if (type == Float::kBF16) tol += 0x1p-8 * std::abs(want.value[i]);
    const double error = std::abs(got[i] - want.value[i]);
    if (!(error <= tol)) {  // NaN (an unwritten element) fails too
      if (++bad <= 5) {
        absl::StrAppend(&first, "\n  [", i, "] gpu ", got[i], " reference ", want.value[i], " tolerance ", tol);
      }
      continue;
    }
    max_error = std::max(max_error, error);
    max_used = std::max(max_used, error / tol);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements out of tolerance:" << first;
  std::printf("  %-22s max |gpu - ref| %.3g, at most %.1f%% of an element's tolerance\n", what.c_str(), max_error,
              100 * max_used);
}

class FlashAttentionGpuTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FlashAttentionGpuTest, MatchesReference) {
  KILN_REQUIRE_GPU();
  ASSERT_TRUE(testing::TestDevice()->MakeCurrent().ok());
  const KernelCase& c = GetParam();
  const AttentionShape& s = c.shape;
  ASSERT_EQ(kernels::FlashAttentionUnsupportedReason(s.batch, s.heads, s.kv_heads, s.seq_len, s.head_dim), nullptr);

  const std::vector<double> q = RandomValues(s.q_elements(), -2, 2, DType::kBF16, 1);
  const std::vector<double> k = RandomValues(s.kv_elements(), -2, 2, DType::kBF16, 2);
  const std::vector<double> v = RandomValues(s.kv_elements(), -1, 1, DType::kBF16, 3);
  const std::vector<double> dout = RandomValues(s.q_elements(), -1, 1, ToDType(c.dout), 4);

  const GpuKernel forward = Load(ForwardKernel(c)), delta_kernel = Load(DeltaKernel(c)), dq_kernel = Load(DqKernel(c)),
                  dkdv_kernel = Load(DkDvKernel(c));
  ASSERT_FALSE(::testing::Test::HasFailure());

  Buffer q_buf = NewBuffer(s.q_elements(), Float::kBF16, &q), k_buf = NewBuffer(s.kv_elements(), Float::kBF16, &k),
         v_buf = NewBuffer(s.kv_elements(), Float::kBF16, &v), dout_buf = NewBuffer(s.q_elements(), c.dout, &dout);
  Buffer o = NewBuffer(s.q_elements(), c.o), lse = NewBuffer(s.rows(), Float::kF32);
  Buffer delta = NewBuffer(s.rows(), Float::kF32);
  ASSERT_FALSE(::testing::Test::HasFailure());

  forward.Run({o.get(), lse.get(), q_buf.get(), k_buf.get(), v_buf.get()});
  delta_kernel.Run({delta.get(), dout_buf.get(), o.get()});
  // Twice each, into fresh (poisoned) buffers: the same bits both times.
  Buffer dq[2], dk[2], dv[2];
  for (int run = 0; run < 2; ++run) {
    dq[run] = NewBuffer(s.q_elements(), c.grads);
    dk[run] = NewBuffer(s.kv_elements(), c.grads);
    dv[run] = NewBuffer(s.kv_elements(), c.grads);
    dq_kernel.Run({dq[run].get(), q_buf.get(), k_buf.get(), v_buf.get(), dout_buf.get(), lse.get(), delta.get()});
    dkdv_kernel.Run(
        {dk[run].get(), dv[run].get(), q_buf.get(), k_buf.get(), v_buf.get(), dout_buf.get(), lse.get(), delta.get()});
  }
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(DownloadBytes(dq[0]), DownloadBytes(dq[1])) << "dq differs between two runs";
  EXPECT_EQ(DownloadBytes(dk[0]), DownloadBytes(dk[1])) << "dk differs between two runs";
  EXPECT_EQ(DownloadBytes(dv[0]), DownloadBytes(dv[1])) << "dv differs between two runs";

  std::printf("%s: B%lld H%lld Hkv%lld T%lld D%lld\n", c.name.c_str(), static_cast<long long>(s.batch),
              static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads), static_cast<long long>(s.seq_len),
              static_cast<long long>(s.head_dim));
  const testing::AttentionForwardReference fwd = testing::AttentionForward(s, q, k, v, c.o == Float::kBF16);
  const std::vector<double> gpu_o = Download(o);
  ExpectWithin("O", gpu_o, fwd.o, c.o);
  ExpectWithin("LSE", Download(lse), fwd.lse, Float::kF32);

  // The backward given the GPU's O (its Delta is computed from it).
  for (testing::DeltaDefinition definition : {testing::DeltaDefinition::kFromOutput, testing::DeltaDefinition::kIr}) {
    const std::string suffix = definition == testing::DeltaDefinition::kIr ? " (IR's Delta)" : "";
    const testing::AttentionBackwardReference bwd = testing::AttentionBackward(s, q, k, v, dout, gpu_o, definition);
    ExpectWithin("dq" + suffix, Download(dq[0]), bwd.dq, c.grads);
    ExpectWithin("dk" + suffix, Download(dk[0]), bwd.dk, c.grads);
    ExpectWithin("dv" + suffix, Download(dv[0]), bwd.dv, c.grads);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionGpuTest,
    ::testing::Values(
        // GQA groups of 2, D 64, everything fp32 but the bf16 operands.
        KernelCase{"b2_h4_kv2_t128_d64", MakeShape(2, 4, 2, 128, 64), Float::kF32, Float::kF32, Float::kF32},
        // Groups of 4, D 128 (key and query tiles of 32 in the backward), bf16 O and dO.
        KernelCase{"b1_h4_kv1_t256_d128", MakeShape(1, 4, 1, 256, 128), Float::kBF16, Float::kBF16, Float::kF32},
        // No grouping, three tiles of T, bf16 everywhere.
        KernelCase{"b1_h2_kv2_t192_d64", MakeShape(1, 2, 2, 192, 64), Float::kBF16, Float::kBF16, Float::kBF16}),
    [](const ::testing::TestParamInfo<KernelCase>& info) { return info.param.name; });

// The Hopper forward against the reference definition, and against the mma.sync forward
// (the same definition with other tiles: they may differ by fp32 accumulation order and by
// a neighbouring bf16 P̃ at a rounding boundary, so by at most the sum of their tolerances).
// Then the Hopper backward, given the wgmma forward's O and LSE and a bf16 dO (what kiln's
// VJP passes): dq, dk and dv within tolerance of the reference (both Delta definitions), the
// same bits on a second run, and within twice the tolerance of the mma.sync backward.
class FlashAttentionWgmmaGpuTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FlashAttentionWgmmaGpuTest, MatchesReferenceAndMmaSyncKernel) {
  KILN_REQUIRE_GPU();
  if (testing::TestDevice()->arch() != "sm_90a") {
    GTEST_SKIP() << "the wgmma kernel needs sm_90a; this GPU is " << testing::TestDevice()->arch();
  }
  ASSERT_TRUE(testing::TestDevice()->MakeCurrent().ok());
  const KernelCase& c = GetParam();
  const AttentionShape& s = c.shape;
  ASSERT_EQ(kernels::FlashAttentionWgmmaUnsupportedReason(s.batch, s.heads, s.kv_heads, s.seq_len, s.head_dim),
            nullptr);
  const std::vector<double> q = RandomValues(s.q_elements(), -2, 2, DType::kBF16, 11);
  const std::vector<double> k = RandomValues(s.kv_elements(), -2, 2, DType::kBF16, 12);
  const std::vector<double> v = RandomValues(s.kv_elements(), -1, 1, DType::kBF16, 13);
  const GpuKernel wgmma = Load(WgmmaForwardKernel(c)), mma_sync = Load(ForwardKernel(c));
  ASSERT_FALSE(::testing::Test::HasFailure());
  Buffer q_buf = NewBuffer(s.q_elements(), Float::kBF16, &q), k_buf = NewBuffer(s.kv_elements(), Float::kBF16, &k),
         v_buf = NewBuffer(s.kv_elements(), Float::kBF16, &v);
  Buffer o[2] = {NewBuffer(s.q_elements(), c.o), NewBuffer(s.q_elements(), c.o)};
  Buffer lse[2] = {NewBuffer(s.rows(), Float::kF32), NewBuffer(s.rows(), Float::kF32)};
  ASSERT_FALSE(::testing::Test::HasFailure());
  wgmma.Run({o[0].get(), lse[0].get(), q_buf.get(), k_buf.get(), v_buf.get()});
  mma_sync.Run({o[1].get(), lse[1].get(), q_buf.get(), k_buf.get(), v_buf.get()});
  ASSERT_FALSE(::testing::Test::HasFailure());

  std::printf("%s: B%lld H%lld Hkv%lld T%lld D%lld\n", c.name.c_str(), static_cast<long long>(s.batch),
              static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads), static_cast<long long>(s.seq_len),
              static_cast<long long>(s.head_dim));
  const testing::AttentionForwardReference fwd = testing::AttentionForward(s, q, k, v, c.o == Float::kBF16);
  const std::vector<double> o_wgmma = Download(o[0]), o_mma = Download(o[1]);
  ExpectWithin("O (wgmma)", o_wgmma, fwd.o, c.o);
  ExpectWithin("LSE (wgmma)", Download(lse[0]), fwd.lse, Float::kF32);
  ExpectWithin("O (mma.sync)", o_mma, fwd.o, c.o);
  // wgmma against mma.sync: twice each element's tolerance.
  ToleratedValues mma_as_reference{o_mma, fwd.o.tolerance};
  for (double& t : mma_as_reference.tolerance) t *= 2;
  ExpectWithin("O (wgmma vs mma.sync)", o_wgmma, mma_as_reference, c.o);

  // The backward.
  KernelCase b = c;
  b.dout = Float::kBF16;
  const std::vector<double> dout = RandomValues(s.q_elements(), -1, 1, DType::kBF16, 14);
  const GpuKernel delta_kernel = Load(DeltaKernel(b)), dq_wgmma = Load(WgmmaDqKernel(b)),
                  dkdv_wgmma = Load(WgmmaDkDvKernel(b)), dq_mma = Load(DqKernel(b)), dkdv_mma = Load(DkDvKernel(b));
  ASSERT_FALSE(::testing::Test::HasFailure());
  Buffer dout_buf = NewBuffer(s.q_elements(), Float::kBF16, &dout), delta = NewBuffer(s.rows(), Float::kF32);
  ASSERT_FALSE(::testing::Test::HasFailure());
  delta_kernel.Run({delta.get(), dout_buf.get(), o[0].get()});
  // Runs 0 and 1 on wgmma, run 2 on mma.sync.
  Buffer dq[3], dk[3], dv[3];
  for (int run = 0; run < 3; ++run) {
    dq[run] = NewBuffer(s.q_elements(), b.grads);
    dk[run] = NewBuffer(s.kv_elements(), b.grads);
    dv[run] = NewBuffer(s.kv_elements(), b.grads);
    ASSERT_FALSE(::testing::Test::HasFailure());
    const std::vector<void*> inputs = {q_buf.get(),    k_buf.get(),  v_buf.get(), dout_buf.get(),
                                       lse[0].get(), delta.get()};
    std::vector<void*> dq_args = {dq[run].get()}, dkdv_args = {dk[run].get(), dv[run].get()};
    dq_args.insert(dq_args.end(), inputs.begin(), inputs.end());
    dkdv_args.insert(dkdv_args.end(), inputs.begin(), inputs.end());
    (run < 2 ? dq_wgmma : dq_mma).Run(dq_args);
    (run < 2 ? dkdv_wgmma : dkdv_mma).Run(dkdv_args);
  }
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(DownloadBytes(dq[0]), DownloadBytes(dq[1])) << "dq differs between two runs";
  EXPECT_EQ(DownloadBytes(dk[0]), DownloadBytes(dk[1])) << "dk differs between two runs";
  EXPECT_EQ(DownloadBytes(dv[0]), DownloadBytes(dv[1])) << "dv differs between two runs";

  // The fused backward (D 128, fp32 gradients), into poisoned buffers with dq zeroed by its
  // kernel: dk and dv the same bits as the dk/dv kernel's (the same products in the same
  // order), dq within tolerance of the reference below (its additions come in no fixed order).
  Buffer fused_dq, fused_dk, fused_dv;
  if (HasFusedBackward(b)) {
    const GpuKernel zero = Load(ZeroKernel(b)), fused = Load(WgmmaFusedBackwardKernel(b));
    fused_dq = NewBuffer(s.q_elements(), Float::kF32);
    fused_dk = NewBuffer(s.kv_elements(), Float::kF32);
    fused_dv = NewBuffer(s.kv_elements(), Float::kF32);
    ASSERT_FALSE(::testing::Test::HasFailure());
    zero.Run({fused_dq.get()});
    fused.Run({fused_dq.get(), fused_dk.get(), fused_dv.get(), q_buf.get(), k_buf.get(), v_buf.get(), dout_buf.get(),
               lse[0].get(), delta.get()});
    ASSERT_FALSE(::testing::Test::HasFailure());
    EXPECT_EQ(DownloadBytes(fused_dk), DownloadBytes(dk[0])) << "the fused backward's dk differs from the dk/dv kernel's";
    EXPECT_EQ(DownloadBytes(fused_dv), DownloadBytes(dv[0])) << "the fused backward's dv differs from the dk/dv kernel's";
  }
  for (testing::DeltaDefinition definition : {testing::DeltaDefinition::kFromOutput, testing::DeltaDefinition::kIr}) {
    const std::string suffix = definition == testing::DeltaDefinition::kIr ? " (wgmma, IR's Delta)" : " (wgmma)";
    const testing::AttentionBackwardReference bwd = testing::AttentionBackward(s, q, k, v, dout, o_wgmma, definition);
    ExpectWithin("dq" + suffix, Download(dq[0]), bwd.dq, b.grads);
    ExpectWithin("dk" + suffix, Download(dk[0]), bwd.dk, b.grads);
    ExpectWithin("dv" + suffix, Download(dv[0]), bwd.dv, b.grads);
    if (HasFusedBackward(b)) ExpectWithin("dq (fused)" + suffix, Download(fused_dq), bwd.dq, Float::kF32);
    if (definition != testing::DeltaDefinition::kFromOutput) continue;
    // wgmma against mma.sync: twice each element's tolerance.
    auto against_mma_sync = [&](const char* name, const Buffer& wgmma_grad, const Buffer& mma_grad,
                                const ToleratedValues& reference) {
      ToleratedValues mma_as_reference{Download(mma_grad), reference.tolerance};
      for (double& t : mma_as_reference.tolerance) t *= 2;
      ExpectWithin(absl::StrCat(name, " (wgmma vs mma.sync)"), Download(wgmma_grad), mma_as_reference, b.grads);
    };
    against_mma_sync("dq", dq[0], dq[2], bwd.dq);
    against_mma_sync("dk", dk[0], dk[2], bwd.dk);
    against_mma_sync("dv", dv[0], dv[2], bwd.dv);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionWgmmaGpuTest,
    ::testing::Values(
        KernelCase{"b2_h4_kv2_t256_d64", MakeShape(2, 4, 2, 256, 64), Float::kF32},
        KernelCase{"b2_h4_kv2_t256_d128", MakeShape(2, 4, 2, 256, 128), Float::kF32},
        KernelCase{"b2_h4_kv2_t256_d128_bf16", MakeShape(2, 4, 2, 256, 128), Float::kBF16, Float::kBF16,
                   Float::kBF16},
        // GQA groups of 4, 3 (llama-S's) and 1, bf16 gradients at D 64 over three 128-key blocks.
        KernelCase{"b1_h8_kv2_t256_d64", MakeShape(1, 8, 2, 256, 64), Float::kF32},
        KernelCase{"b1_h6_kv2_t256_d64", MakeShape(1, 6, 2, 256, 64), Float::kF32},
        KernelCase{"b1_h2_kv2_t384_d64_bf16", MakeShape(1, 2, 2, 384, 64), Float::kBF16, Float::kBF16, Float::kBF16},
        // Eight key tiles: every stage of the pipeline reused, every barrier phase flipped.
        KernelCase{"b1_h4_kv1_t1024_d64", MakeShape(1, 4, 1, 1024, 64), Float::kF32},
        KernelCase{"b1_h2_kv1_t1024_d128", MakeShape(1, 2, 1, 1024, 128), Float::kBF16},
        // The persistent kernels on 3 and 5 blocks: 32 and 16 query blocks (16 and 8 key blocks),
        // each block's kept tiles reloaded up to 10 times, its stages counted on across tiles.
        KernelCase{"b1_h4_kv1_t1024_d64_3sm", MakeShape(1, 4, 1, 1024, 64), Float::kF32, Float::kF32, Float::kF32, 3},
        KernelCase{"b1_h2_kv1_t1024_d128_5sm", MakeShape(1, 2, 1, 1024, 128), Float::kBF16, Float::kF32,
                   Float::kF32, 5}),
    [](const ::testing::TestParamInfo<KernelCase>& info) { return info.param.name; });

}  // namespace
}  // namespace kiln
