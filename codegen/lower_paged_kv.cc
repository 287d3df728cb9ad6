// Lowering of kv_cache_write and paged_attention to the templates of kernels/paged_kv.cuh.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "codegen/composite_lowerings.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {
namespace {

// The pool's dims as template arguments: layer, blocks, kv heads, block size, head dim.
std::string PoolArgs(const TensorType& pool, int64_t layer) {
  return absl::StrCat(layer, ", ", pool.dims[1], "LL, ", pool.dims[2], ", ", pool.dims[3], ", ", pool.dims[4]);
}

}  // namespace

// Two kernels: the pool copied into the output (left out when the plan gives the output the
// pool's buffer, and a no-op in the kernel when it is), then one thread per element of the
// new rows.
absl::StatusOr<LoweredNode> LowerKvCacheWrite(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(int64_t layer, node.attrs().GetInt("layer"));
  const TensorType& pool = node.operand(0)->type();
  const TensorType& x = node.operand(1)->type();
  const int threads = options.threads_per_block;
  const std::string tp = CudaTypeName(pool.dtype);
  const int64_t copy_blocks = std::min<int64_t>(CeilDiv(pool.num_elements(), threads),
                                                int64_t{8} * std::max(1, options.target.sm_count));
  Wrapper copy;
  copy.header = "paged_kv";
  copy.comment = absl::StrCat("copies the pool (", Count(pool.num_elements(), "element"),
                              ") into the result unless it is the pool's own buffer; grid-stride");
  copy.params = {Param(pool.dtype, "pool"), Param(x.dtype, "x"), Param(DType::kI32, "slots")};
  copy.call = absl::StrCat("PoolCopy<", tp, ", ", pool.num_elements(), "LL>(out, pool)");
  std::vector<KernelSpec> kernels = {Emit(node, codegen::KernelName(node) + "_copy", copy, copy_blocks, threads)};
  if (x.num_elements() == 0) return Kernels(std::move(kernels));
  const int64_t write_blocks = CeilDiv(x.num_elements(), threads);
  RETURN_IF_ERROR(CheckGrid(node, write_blocks));
  Wrapper write = copy;
  write.comment = absl::StrCat("a thread per element of ", Count(x.dims[0], "row"), " x ", x.dims[1], " heads x ",
                               x.dims[2]);
  write.call = absl::StrCat("KvCacheWrite<", CudaTypeName(x.dtype), ", ", tp, ", ", x.dims[0], "LL, ",
                            PoolArgs(pool, layer), ">(out, x, slots)");
  kernels.push_back(Emit(node, codegen::KernelName(node), write, write_blocks, threads));
  // The pool is updated in place where the plan allows (passes/buffer_plan.h: a chain of
  // writes from the pool parameter to its donated output), and the copy is then left out.
  LoweredNode lowered = Kernels(std::move(kernels));
  lowered.in_place_operand = 0;
  lowered.copy_kernel_results = {0};
  return lowered;
}

// PagedAttentionSplitMma (bf16 tensor cores) or PagedAttentionSplit where a K/V row is whole
// 16-byte loads over a power of two of lanes, split over the keys up to
// CodegenOptions::paged_attention's blocks per SM (each split at least its min_split_blocks KV
// blocks); with several splits, the last of each row and head adds their partials
// (fold_combine), or PagedAttentionCombine does after the split kernel; otherwise a warp per
// (query row, head), one key at a time (PagedAttention).
absl::StatusOr<LoweredNode> LowerPagedAttention(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(int64_t layer, node.attrs().GetInt("layer"));
  ASSIGN_OR_RETURN(double scale, FiniteFloatAttr(node, "scale"));
  const TensorType& q = node.operand(0)->type();
  const TensorType& pool = node.operand(1)->type();
  const int64_t max_blocks = node.operand(3)->type().dims[1];
  if (q.num_elements() == 0) return Kernels({});
  const int64_t heads = q.dims[2], head_dim = q.dims[3], kv_heads = pool.dims[2], block_size = pool.dims[3];
  const int64_t group = heads / std::max<int64_t>(1, kv_heads);
  const int64_t rows = q.dims[0] * q.dims[1];
  // O's type: f32, or the op's out_dtype (the f32 value rounded once, on store).
  const std::string out_type = CudaTypeName(node.type().dtype);
  Wrapper w;
  w.header = "paged_kv";
  w.params = {Param(q.dtype, "q"), Param(pool.dtype, "k_pool"), Param(node.operand(2)->type().dtype, "v_pool"),
              Param(DType::kI32, "block_tables"), Param(DType::kI32, "positions")};
  const std::string args = absl::StrCat(q.dims[0], "LL, ", q.dims[1], "LL, ", heads, ", ", head_dim, ", ", layer, ", ",
                                        pool.dims[1], "LL, ", kv_heads, ", ", block_size, ", ", max_blocks);
  const std::string call_args = absl::StrCat("(out, q, k_pool, v_pool, block_tables, positions, ", FloatLiteral(scale));
  const int64_t vec = 16 / DTypeBytes(pool.dtype);
  const int64_t lanes_per_row = head_dim % vec == 0 ? head_dim / vec : 0;
  if (q.dtype != pool.dtype || lanes_per_row < 1 || lanes_per_row > kWarpSize || kWarpSize % lanes_per_row != 0) {
    const int64_t items = q.num_elements() / std::max<int64_t>(1, head_dim);
    RETURN_IF_ERROR(CheckGrid(node, items));
    w.comment = absl::StrCat("a warp per (query, head): ", Count(items, "warp"), ", two passes over the keys");
    w.call = absl::StrCat("PagedAttention<", CudaTypeName(pool.dtype), ", ", out_type, ", ", args, ">", call_args, ")");
    return Kernels({Emit(node, codegen::KernelName(node), w, items, kWarpSize)});
  }
  // CodegenOptions::paged_attention. Its defaults: 4 warps and 5 stages, four KV blocks in
  // flight while one is scored (32 KB a block at bf16 and head dim 128; the 45 KB of shared
  // memory let four blocks share an SM). A split is at least four KV blocks, which its first
  // round of copies takes at once: batch 1's splits wait on memory once, and the combine adds
  // few of them. bench/RESULTS.md, session 21 (paged_attention_bench, llama-M's heads, 640
  // keys): batch 32 35.7 us, the fastest of eight geometries (36.1-50.3); batch 1 11.5 us, all
  // eight within 11.1-13.2.
  const CodegenOptions::PagedAttentionGeometry& geometry = options.paged_attention;
  if (geometry.warps < 1 || geometry.warps > 32 || geometry.few_rows_warps < 1 || geometry.few_rows_warps > 32 ||
      geometry.stages < 2 || geometry.min_split_blocks < 1 || geometry.blocks_per_sm < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(node), ": CodegenOptions::paged_attention wants 1-32 warps, at least 2 stages, a split of at least one "
                     "block and at least one block an SM; got ",
        geometry.warps, " (", geometry.few_rows_warps, " for few rows) warps, ", geometry.stages, " stages, ",
        geometry.min_split_blocks, " blocks a split, ", geometry.blocks_per_sm, " blocks an SM"));
  }
  if (geometry.tensor_cores && (geometry.warp_stages < 2 || geometry.tensor_core_blocks_per_sm < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(node), ": CodegenOptions::paged_attention wants at least 2 warp stages and a block an SM; got ",
                     geometry.warp_stages, " and ", geometry.tensor_core_blocks_per_sm));
  }
  const bool tensor_cores = geometry.tensor_cores && pool.dtype == DType::kBF16 &&
                            head_dim % 16 == 0 && head_dim <= 256 && block_size % 16 == 0 && group <= 8;
  // The tensor-core kernel's query rows a block (kQRows): at prefill, the most consecutive rows
  // of a sequence, a power of two dividing its tokens, whose heads fill at most the m16 tile.
  // Each K and V row then serves that many queries (at llama-M's group of 2: 8), where a block
  // a row reads a sequence's keys once per query.
  int64_t query_rows = 1;
  if (tensor_cores && geometry.query_tiles) {
    while (query_rows * 2 * group <= 16 && q.dims[1] % (query_rows * 2) == 0) query_rows *= 2;
  }
  // 8 warps at batch 1: 11.7 against 12.5 us with 4 (bench/RESULTS.md, session 25,
  // paged_attention_bench on an H100); batch 32 keeps 4 (40.4 us; 8 warps 43.0). The
  // tensor-core kernel's warps each take whole KV blocks: `warps` at every batch.
  const int warps = !tensor_cores && rows <= geometry.fold_max_rows ? geometry.few_rows_warps : geometry.warps;
  const int64_t items = rows / query_rows * kv_heads;
  const int64_t item_rows = query_rows * group;  // the (query row, head) rows a block computes
  const int64_t wanted_blocks = (tensor_cores ? geometry.tensor_core_blocks_per_sm : geometry.blocks_per_sm) *
                                int64_t{std::max(1, options.target.sm_count)};
  // The splits divide each row's actual blocks at run time; this is their count, rounded down
  // so that the launch stays one wave.
  const int64_t splits =
      std::max<int64_t>(1, std::min(wanted_blocks / items, CeilDiv(max_blocks, int64_t{geometry.min_split_blocks})));
  RETURN_IF_ERROR(CheckGrid(node, items * splits));
  // The CUDA-core kernel's stages are the block's; the tensor-core kernel's are each warp's,
  // no more than a warp has KV blocks to take plus one (at batch 1 a warp takes one or two).
  const int64_t warp_blocks = CeilDiv(CeilDiv(max_blocks, splits), warps);
  const int stages = tensor_cores ? static_cast<int>(std::clamp<int64_t>(warp_blocks + 1, 2, geometry.warp_stages))
                                  : geometry.stages;
  // The stages, the block table row, the warps' partial outputs and their (max, sum) pairs.
  // The CUDA-core kernel's stages are the block's; the tensor-core kernel's each warp's, with
  // bulk copies rows of head_dim + 8 and a barrier a stage.
  const bool bulk = tensor_cores && geometry.bulk_copies;
  const int64_t shared_bytes =
      (tensor_cores ? warps : 1) * stages * 2 * block_size * (head_dim + (bulk ? 8 : 0)) *
          int64_t{DTypeBytes(pool.dtype)} +
      CeilDiv(max_blocks, 4) * 16 + warps * item_rows * (head_dim + 2) * int64_t{4} + (bulk ? warps * stages * 8 : 0);
  if (shared_bytes > options.target.shared_memory_per_block) {
    return absl::InvalidArgumentError(absl::StrCat(Where(node), ": paged attention needs ", shared_bytes,
                                                   " bytes of shared memory, beyond the target's ",
                                                   options.target.shared_memory_per_block));
  }
  if (splits > 1) w.params.push_back("float* __restrict__ partials");  // the scratch
  w.comment = absl::StrCat(
      "a block of ", warps, " warps per (",
      query_rows > 1 ? absl::StrCat(query_rows, " query rows of a sequence") : std::string("query row"),
      ", kv head, split): ", Count(items, "item"), " x ", splits, " splits of the rows' KV blocks, the ", item_rows,
      " query heads of an item sharing each K and V row; ",
      tensor_cores ? absl::StrCat("bf16 tensor cores, each warp its own KV blocks through ", stages,
                                  " stages of shared memory")
                   : absl::StrCat(stages, " KV blocks staged through shared memory"));
  // Folded only for few rows: at batch 32 the fences and counts of 512 blocks cost more than
  // the combine's launch (bench/RESULTS.md, session 24: paged_attention_bench on an H100,
  // batch 32 45.2 us folded against 40.9 with the combine; batch 1 13.3 against 13.4).
  const bool fold = splits > 1 && geometry.fold_combine && rows <= geometry.fold_max_rows;
  if (fold) {
    // The count of finished splits per (row, kv head): the module's, zero when it loads, put
    // back to zero by each item's last split (kernels/paged_kv.cuh, CombineIfLastSplit).
    w.globals += absl::StrCat("// Finished splits per (row, kv head), zero at load; the last one resets its count.\n",
                              "static __device__ unsigned int g_splits_done[", items, "];\n\n");
    w.comment += "; the last split of each adds the splits' partials";
  }
  // The block tables and positions read before the grid-dependency wait where nothing in the
  // step writes them (the inference functions' parameters).
  const bool tables_first =
      EarlyReadsAllowed(options) && IsStepInvariant(*node.operand(3)) && IsStepInvariant(*node.operand(4));
  if (tables_first) w.comment += "; block tables and positions read before the grid-dependency wait";
  // The KV blocks before each row's position's block copied before the wait too (the caller's
  // promise; one query row a sequence, so no other row of the step writes them either).
  const bool complete_blocks_first = tensor_cores && tables_first && geometry.complete_blocks_step_invariant &&
                                     q.dims[1] == 1;
  if (complete_blocks_first) w.comment += ", and the KV blocks before each row's position's block";
  if (bulk) w.comment += "; K and V rows by bulk copies";
  // The tensor-core template's trailing flags (kTablesBeforeWait, kCompleteBlocksBeforeWait,
  // kBulkCopies), written up to the last that is set.
  // (kQRows after them, all three written, where it is above 1.)
  std::string flags;
  {
    const bool set[] = {tables_first, complete_blocks_first, bulk};
    int last = query_rows > 1 ? 2 : -1;
    for (int i = 0; i < 3; ++i) last = set[i] ? std::max(i, last) : last;
    for (int i = 0; i <= last; ++i) absl::StrAppend(&flags, set[i] ? ", true" : ", false");
    if (query_rows > 1) absl::StrAppend(&flags, ", ", query_rows);
  }
  w.call = tensor_cores
               ? absl::StrCat("PagedAttentionSplitMma<", out_type, ", ", args, ", ", warps, ", ", splits, ", ", stages,
                              flags, ">", call_args, ", ", splits > 1 ? "partials" : "nullptr",
                              fold ? ", g_splits_done" : "", ")")
               : absl::StrCat("PagedAttentionSplit<", CudaTypeName(pool.dtype), ", ", out_type, ", ", args, ", ",
                              warps, ", ", splits, ", ", stages, tables_first ? ", true" : "", ">", call_args, ", ",
                              splits > 1 ? "partials" : "nullptr", fold ? ", g_splits_done" : "", ")");
  KernelSpec split_kernel = Emit(node, codegen::KernelName(node), w, items * splits, warps * kWarpSize);
  split_kernel.shared_bytes = static_cast<uint32_t>(shared_bytes);
  split_kernel.waits_itself = tables_first;
  if (splits == 1) return Kernels({std::move(split_kernel)});
  if (fold) {
    LoweredNode lowered = Kernels({std::move(split_kernel)});
    lowered.scratch_bytes = items * splits * item_rows * (head_dim + 2) * int64_t{4};
    return lowered;
  }
  Wrapper combine = w;
  combine.globals.clear();  // the combine reads only the partials
  combine.comment = absl::StrCat("adds the ", splits, " splits' partial outputs, a thread per element");
  combine.call = absl::StrCat("PagedAttentionCombine<", out_type, ", ", rows, "LL, ", heads, ", ", head_dim, ", ",
                              kv_heads, ", ", splits, query_rows > 1 ? absl::StrCat(", ", query_rows) : "",
                              ">(out, partials)");
  const int threads = options.threads_per_block;
  LoweredNode lowered =
      Kernels({std::move(split_kernel), Emit(node, codegen::KernelName(node) + "_combine", combine,
                                             CeilDiv(q.num_elements(), threads), threads)});
  lowered.scratch_bytes = items * splits * item_rows * (head_dim + 2) * int64_t{4};
  return lowered;
}

}  // namespace kiln::codegen::composite

namespace kiln {

std::string PagedAttentionGeometryName(const CodegenOptions::PagedAttentionGeometry& g) {
  const CodegenOptions::PagedAttentionGeometry defaults;
  const std::string combine =
      absl::StrCat(!g.fold_combine ? "+combine" : g.fold_max_rows != defaults.fold_max_rows ? "+fold" : "",
                   g.tensor_cores && g.bulk_copies ? "+bulk" : "", g.tensor_cores && !g.query_tiles ? "+untiled" : "");
  if (g.tensor_cores) {
    return absl::StrCat("tc", g.warps, "x", g.warp_stages, "x", g.min_split_blocks, "x", g.tensor_core_blocks_per_sm,
                        combine);
  }
  const std::string warps =
      g.few_rows_warps == g.warps ? absl::StrCat(g.warps) : absl::StrCat(g.warps, "(", g.few_rows_warps, ")");
  return absl::StrCat(warps, "x", g.stages, "x", g.min_split_blocks, "x", g.blocks_per_sm, combine);
}

absl::StatusOr<CodegenOptions::PagedAttentionGeometry> ParsePagedAttentionGeometry(absl::string_view text) {
  absl::string_view rest = text;
  CodegenOptions::PagedAttentionGeometry g;
  const bool untiled = absl::ConsumeSuffix(&rest, "+untiled");
  const bool bulk_copies = absl::ConsumeSuffix(&rest, "+bulk");
  const bool separate_combine = absl::ConsumeSuffix(&rest, "+combine");
  const bool always_fold = absl::ConsumeSuffix(&rest, "+fold");
  g.tensor_cores = absl::ConsumePrefix(&rest, "tc");
  std::vector<int> values;
  int few_rows_warps = -1;
  for (absl::string_view field : absl::StrSplit(rest, 'x')) {
    int value = 0;
    // The CUDA-core kernel's warps may name few_rows_warps: "4(8)".
    if (values.empty() && !g.tensor_cores && absl::ConsumeSuffix(&field, ")")) {
      const size_t open = field.find('(');
      if (open == absl::string_view::npos || !absl::SimpleAtoi(field.substr(open + 1), &few_rows_warps) ||
          few_rows_warps < 1) {
        values.clear();
        break;
      }
      field = field.substr(0, open);
    }
    if (!absl::SimpleAtoi(field, &value) || value < 1) {
      values.clear();
      break;
    }
    values.push_back(value);
  }
  if (values.size() != 4 || (separate_combine && always_fold) || ((bulk_copies || untiled) && !g.tensor_cores)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "paged attention geometry '", text,
        "': want [tc]WARPSxSTAGESxMIN_SPLIT_BLOCKSxBLOCKS_PER_SM[+combine|+fold][+bulk][+untiled] of positive integers "
        "(+bulk and +untiled only with tc), e.g. ",
        PagedAttentionGeometryName(CodegenOptions::PagedAttentionGeometry{}), " or 4(8)x5x4x4"));
  }
  g.warps = values[0];
  g.few_rows_warps = few_rows_warps > 0 ? few_rows_warps : values[0];
  (g.tensor_cores ? g.warp_stages : g.stages) = values[1];
  g.min_split_blocks = values[2];
  (g.tensor_cores ? g.tensor_core_blocks_per_sm : g.blocks_per_sm) = values[3];
  g.fold_combine = !separate_combine;
  if (always_fold) g.fold_max_rows = 1 << 30;
  g.bulk_copies = bulk_copies;
  g.query_tiles = !untiled;
  return g;
}

}  // namespace kiln
