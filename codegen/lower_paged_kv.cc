// Lowering of kv_cache_write and paged_attention to the templates of kernels/paged_kv.cuh.
#include <algorithm>

#include "absl/strings/str_cat.h"
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

// Two kernels: the pool copied into the output (a no-op when the runtime gives the output
// the pool's buffer), then one thread per element of the new rows.
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
  return Kernels(std::move(kernels));
}

absl::StatusOr<LoweredNode> LowerPagedAttention(const Node& node) {
  ASSIGN_OR_RETURN(int64_t layer, node.attrs().GetInt("layer"));
  ASSIGN_OR_RETURN(double scale, FiniteFloatAttr(node, "scale"));
  const TensorType& q = node.operand(0)->type();
  const TensorType& pool = node.operand(1)->type();
  const int64_t max_blocks = node.operand(3)->type().dims[1];
  const int64_t items = q.num_elements() / std::max<int64_t>(1, q.dims[3]);
  if (q.num_elements() == 0) return Kernels({});
  RETURN_IF_ERROR(CheckGrid(node, items));
  Wrapper w;
  w.header = "paged_kv";
  w.comment = absl::StrCat("a warp per (query, head): ", Count(items, "warp"), ", two passes over the keys");
  w.params = {Param(q.dtype, "q"), Param(pool.dtype, "k_pool"), Param(pool.dtype, "v_pool"),
              Param(DType::kI32, "block_tables"), Param(DType::kI32, "positions")};
  w.call = absl::StrCat("PagedAttention<", CudaTypeName(pool.dtype), ", ", q.dims[0], "LL, ", q.dims[1], "LL, ",
                        q.dims[2], ", ", q.dims[3], ", ", layer, ", ", pool.dims[1], "LL, ", pool.dims[2], ", ",
                        pool.dims[3], ", ", max_blocks,
                        ">(out, q, k_pool, v_pool, block_tables, positions, ", FloatLiteral(scale), ")");
  return Kernels({Emit(node, codegen::KernelName(node), w, items, kWarpSize)});
}

}  // namespace kiln::codegen::composite
