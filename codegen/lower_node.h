// Lowering: one IR node -> the kernels that compute it (one kernel per op, per composite
// op, or per fusion node: codegen/lower_fusion.h). The one dispatch over the op table for codegen: every op has a
// lowering, or LowerNode fails and tests/op_table_test.cc says which op lacks one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codegen/kernel_spec.h"
#include "ir/graph.h"
#include "passes/target.h"

namespace kiln {

struct CodegenOptions {
  int threads_per_block = 256;
  // The GPU the kernels are for: grids are sized by its SM count.
  Target target;
  // A gemm of at most 8 rows of A runs kiln's SmallMGemm kernel instead of cuBLASLt where it
  // qualifies (codegen/lower_gemv.h): the decode step's projections.
  bool small_m_gemv = true;
  // SmallMGemm's geometry (kernels/gemv.cuh: B rows a group of warps computes, the warps
  // splitting K, 16-byte chunks in flight a lane, groups a block); zeros: chosen from the
  // shape (codegen/lower_gemv.cc). bench/decode_gemm_bench times others.
  struct GemvGeometry {
    int rows = 0, split = 0, unroll = 0, groups = 0;
  } small_m_gemv_geometry;
  // Geometries for particular shapes, ahead of small_m_gemv_geometry and the shape's default:
  // each for the gemms of its N x K (the gemm's n and k; a GLU gemm's n is its 2F weight rows,
  // and its rows are 2 whatever is given). For trying a geometry on one projection in the
  // decode graph ($KILN_GEMV_GEOMETRY, ParseGemvShapeGeometries).
  struct GemvShapeGeometry {
    int64_t n = 0, k = 0;
    GemvGeometry geometry;
  };
  std::vector<GemvShapeGeometry> small_m_gemv_shape_geometries;
  // Every kernel starts with griddepcontrol.launch_dependents and griddepcontrol.wait
  // (sm_90 and later), so the runtime may launch it with programmatic dependent launch: its
  // grid is set up while the kernel before it is still running, and the ~1-2 us between two
  // dependent launches of a CUDA graph mostly disappears (codegen/kernel_spec.h).
  bool programmatic_dependent_launch = true;
  // With it, a kernel may read what no kernel of the step writes before its grid-dependency
  // wait (KernelSpec::waits_itself): rms_norm's weight, SmallMGemm's first round of its weight,
  // paged attention's block tables and positions. Off: every read follows the wait.
  bool reads_before_wait = true;
  // attention_grad on wgmma at head dim 128 is one kernel that adds dq into a zeroed buffer
  // from its walk over the key blocks (5 matrix products a tile where the separate dq kernel
  // makes 7; dq's last bits then vary between runs with the order of the additions). Off: the
  // dq and dk/dv kernels, the same bits every run (codegen/lower_attention.cc).
  bool fused_attention_backward = true;
  // paged_attention's split kernel (kernels/paged_kv.cuh, PagedAttentionSplit): warps a block,
  // KV blocks staged through shared memory (stages - 1 in flight while one is scored), the
  // fewest KV blocks a split takes, and the blocks an SM the split count aims for. The
  // defaults are measured (codegen/lower_paged_kv.cc says where); bench/paged_attention_bench
  // times others.
  // fold_combine: the last split of each (row, kv head) to finish adds the splits' partials
  // itself (kernels/paged_kv.cuh, CombineIfLastSplit), instead of PagedAttentionCombine after
  // the split kernel: a launch a layer fewer, taken for at most fold_max_rows query rows.
  struct PagedAttentionGeometry {
    int warps = 4;
    int stages = 5;
    int min_split_blocks = 4;
    int blocks_per_sm = 4;
    bool fold_combine = true;
    int fold_max_rows = 8;  // query rows (batch x tokens) at most for the fold; more: the combine
    // Warps a block for at most fold_max_rows query rows (`warps` past them): at batch 1 a
    // block's few KV blocks are scored by more warps at once.
    int few_rows_warps = 8;
    // The tensor-core kernel (PagedAttentionSplitMma) where the shape allows it (a bf16 pool
    // and q, head dim a multiple of 16 up to 256, KV blocks of whole 16-key tiles, at most 8
    // query heads a kv head): `warps` warps a block at every batch, each streaming its own KV
    // blocks through at most warp_stages stages of shared memory; `stages` and
    // few_rows_warps are the CUDA-core kernel's.
    bool tensor_cores = true;
    int warp_stages = 3;
    // The tensor-core kernel's blocks an SM for its split count: its ~100 KB of shared memory
    // at 4 warps of 3 stages lets an SM hold 2 (blocks_per_sm is the CUDA-core kernel's).
    int tensor_core_blocks_per_sm = 2;
    // A promise of the caller's (the inference engine's, not ParsePagedAttentionGeometry's):
    // in one step, no kernel writes a KV block that ends before the block of a row's position
    // (kiln's decode writes only each row's own position's slot). With it, the tensor-core
    // kernel at one query row a sequence starts copying those blocks before its
    // grid-dependency wait, while the kernels ahead (the layer's cache writes) still run.
    bool complete_blocks_step_invariant = false;
    // The tensor-core kernel's stages filled by cp.async.bulk, a copy per K or V row, instead of
    // 16-byte cp.async copies ("+bulk" in the geometry's text).
    bool bulk_copies = false;
    // The tensor-core kernel at several query rows a sequence (prefill) takes up to 16 / group
    // consecutive rows of a sequence a block, as the m16 tile's rows, so that each K and V row
    // it loads serves them all; off ("+untiled"): a block a query row, as at decode.
    bool query_tiles = true;
  } paged_attention;
};

// SmallMGemm geometries as text, as bench/decode_gemm_bench and $KILN_GEMV_GEOMETRY take them:
// "1x2x4x2" is rows x split x unroll x groups (CodegenOptions::GemvGeometry); "4096x2048=4x4x4x1"
// is that geometry for the gemms of N 4096 and K 2048, several joined by commas (a later one
// for the same shape wins).
absl::StatusOr<CodegenOptions::GemvGeometry> ParseGemvGeometry(absl::string_view text);
absl::StatusOr<std::vector<CodegenOptions::GemvShapeGeometry>> ParseGemvShapeGeometries(absl::string_view text);

// A paged attention geometry as text, as bench/paged_attention_bench and $KILN_PAGED_ATTENTION
// take it: "tc4x3x4x2" is the tensor-core kernel with 4 warps, 3 stages a warp, splits of at
// least 4 KV blocks and 2 blocks an SM; "4(8)x5x4x4" the CUDA-core kernel with 4 warps (8 at
// up to fold_max_rows rows), 5 stages, 4 and 4; "+combine" keeps the combine kernel at every
// batch, "+fold" folds it at every batch, "+bulk" fills the tensor-core kernel's stages with
// bulk copies, "+untiled" gives its prefill a block a query row (query_tiles off). Unnamed
// fields keep their defaults.
std::string PagedAttentionGeometryName(const CodegenOptions::PagedAttentionGeometry& geometry);
absl::StatusOr<CodegenOptions::PagedAttentionGeometry> ParsePagedAttentionGeometry(absl::string_view text);

absl::StatusOr<LoweredNode> LowerNode(const Node& node, const CodegenOptions& options = {});

// Whether LowerNode handles `op` (driven by the same switch; no default case).
bool CodegenSupports(Opcode op);

// The CUDA C++ type that stores `t` ("float", "__nv_bfloat16", "__half", "__nv_fp8_e4m3",
// "__nv_fp8_e5m2", "int", "long long", "bool").
const char* CudaTypeName(DType t);

}  // namespace kiln
