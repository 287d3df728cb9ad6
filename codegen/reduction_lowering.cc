// reduce_sum and reduce_max. The operand's dims merge into groups of adjacent kept or
// reduced dims; most reductions are then [A, R, C]: A outer kept, R reduced, C inner kept.
//
//   R <= 32, or not [A, R, C]    one thread per output element loops over its R elements
//   C == 1 (trailing dims)       a warp (R <= 4096) or a block per output row: strided
//                                vector loads, then a warp-shuffle / shared-memory tree;
//                                a few long rows split over many blocks (below)
//   C > 1 (e.g. [16384,768] -> [768], a gradient summed over tokens)
//                                a block per tile of TC adjacent columns: RG row groups
//                                each sum every RG-th row of the tile with coalesced loads,
//                                then a shared-memory tree over the row groups
//
// Every kernel is deterministic (a fixed combination order, no atomics). reduce_sum
// accumulates in double whatever the dtype: on an H200 FP64 adds are far from the limit of
// a memory-bound kernel, and the reference sums in double, so results then differ from
// it only by summation order. reduce_max folds in the compute type (max is exact) and
// propagates NaN; an empty reduction gives -inf rounded to the dtype, as the reference.
//
// A few long rows (a whole-tensor sum, [R] -> []) would leave most SMs idle in a block per
// row: each row then splits over blocks, and the last block to finish folds the partials in
// block order (still deterministic). The partials live in module-scope __device__ memory,
// as in kernels/rms_norm.cuh: launches of one cubin must not overlap (one stream, or one
// CUDA graph chain, as the runtime runs a step).
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codegen/kernel_source.h"
#include "codegen/lowerings.h"
#include "ir/status_macros.h"

namespace kiln::codegen {
namespace {

constexpr int64_t kThreadPerOutputMaxReduced = 32;
constexpr int64_t kWarpPerRowMaxReduced = 4096;
// Enough blocks for two per SM: below this, wider tiles starve the GPU.
constexpr int64_t kBlocksPerSmToFill = 2;
// Long rows split over blocks: aim for 8 blocks of 256 threads per SM, each thread folding
// at least 4 vectors.
constexpr int64_t kSplitBlocksPerSm = 8;
constexpr int kSplitThreads = 256;
constexpr int64_t kSplitMinVectorsPerThread = 4;

struct DimGroup {
  int64_t size;
  int64_t stride;  // in the operand, elements
  bool reduced;
};

// The operand's dims without size-1 dims, adjacent dims of the same kind merged.
std::vector<DimGroup> GroupDims(const TensorType& x, const std::vector<int64_t>& reduced_dims) {
  std::vector<bool> reduced(x.rank(), false);
  for (int64_t d : reduced_dims) reduced[d] = true;
  const std::vector<int64_t> strides = RowMajorStrides(x.dims);
  std::vector<DimGroup> groups;
  for (int d = 0; d < x.rank(); ++d) {
    if (x.dims[d] == 1) continue;
    if (!groups.empty() && groups.back().reduced == reduced[d]) {
      groups.back().size *= x.dims[d];
      groups.back().stride = strides[d];
    } else {
      groups.push_back({x.dims[d], strides[d], reduced[d]});
    }
  }
  return groups;
}

// The [A, R, C] form of `groups`, when they have one (K? R? K? in that order).
struct ThreeDims {
  int64_t outer = 1, reduced = 1, inner = 1;
};
std::optional<ThreeDims> AsThreeDims(const std::vector<DimGroup>& groups) {
  ThreeDims t;
  size_t i = 0;
  if (i < groups.size() && !groups[i].reduced) t.outer = groups[i++].size;
  if (i < groups.size() && groups[i].reduced) t.reduced = groups[i++].size;
  if (i < groups.size() && !groups[i].reduced) t.inner = groups[i++].size;
  if (i != groups.size()) return std::nullopt;
  return t;
}

// The accumulator type and its fold, as device code shared by every strategy.
std::string AccumulatorLibrary(const Node& node, const std::string& type) {
  const DType dtype = node.type().dtype;
  if (node.opcode() == Opcode::kReduceSum) {
    return absl::StrFormat(
        "typedef double Acc;\n"
        "__device__ __forceinline__ Acc Init() { return 0.0; }\n"
        "__device__ __forceinline__ Acc ToAcc(%s x) { return static_cast<double>(kiln::Load(x)); }\n"
        "__device__ __forceinline__ Acc Fold(Acc a, Acc b) { return __dadd_rn(a, b); }\n\n",
        type);
  }
  const bool integer = IsInteger(dtype);
  return absl::StrFormat(
      "typedef %s Acc;\n"
      "__device__ __forceinline__ Acc Init() { return %s; }  // -inf\n"
      "__device__ __forceinline__ Acc ToAcc(%s x) { return kiln::Load(x); }\n"
      "__device__ __forceinline__ Acc Fold(Acc a, Acc b) { return kiln::Max(a, b); }\n\n",
      ComputeTypeName(dtype),
      integer ? "-__longlong_as_double(0x7ff0000000000000LL)" : "-__int_as_float(0x7f800000)", type);
}

// Emits `offset += index(group) * stride` for a row-major index `var` over `groups`.
std::string OffsetCode(const std::vector<DimGroup>& groups, const std::string& var, const std::string& offset) {
  std::string code = absl::StrFormat("      Index rest = %s;\n", var);
  for (int g = static_cast<int>(groups.size()) - 1; g >= 0; --g) {
    if (g == 0) {
      absl::StrAppendFormat(&code, "      %s += rest * %d;\n", offset, groups[g].stride);
    } else {
      absl::StrAppendFormat(&code, "      %s += (rest %% %d) * %d;\n      rest /= %d;\n", offset, groups[g].size,
                            groups[g].stride, groups[g].size);
    }
  }
  return code;
}

struct Reduction {
  std::string name;
  std::string type;      // the operand's element type
  std::string out_type;  // the result's
  std::string params;    // kernel parameters after `out`, each with its leading ", "
  std::string construct; // the kernel's first statements: defines `in` for a fused operand
  bool fused = false;    // `in` is a GroupInput (FusedReduceInput), not a pointer
  int64_t outputs;
  int64_t reduced;  // elements per output
  int64_t input_elements;
  const Target* target;  // the GPU it runs on
  int64_t blocks_to_fill() const { return kBlocksPerSmToFill * target->sm_count; }
};

// The loop body folding `width` elements at index i of `p` (a pointer: one vector access;
// a fused operand: one computed element).
std::string FoldLoads(const Reduction& r, int width, const std::string& indent) {
  if (r.fused) return absl::StrCat(indent, "acc = Fold(acc, ToAcc(p[i]));\n");
  return absl::StrFormat(
      "%sconst kiln::Vec<%s, %d> x = kiln::LoadVec<%d>(p, i);\n"
      "#pragma unroll\n"
      "%sfor (int j = 0; j < %d; ++j) acc = Fold(acc, ToAcc(x.v[j]));\n",
      indent, r.type, width, width, indent, width);
}

KernelSpec ThreadPerOutput(const Reduction& r, const std::vector<DimGroup>& groups, std::string source,
                           int threads) {
  std::vector<DimGroup> kept, reduced;
  for (const DimGroup& g : groups) (g.reduced ? reduced : kept).push_back(g);
  const std::array<uint32_t, 3> grid = GridFor(r.outputs, threads, *r.target);
  absl::StrAppendFormat(&source,
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out%s) {\n"
                        "  typedef %s Index;\n%s"
                        "  for (Index o = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; o < %d;\n"
                        "       o += static_cast<Index>(gridDim.x) * blockDim.x) {\n"
                        "    Index base = 0;\n"
                        "    {\n%s    }\n"
                        "    Acc acc = Init();\n"
                        "    for (Index i = 0; i < %d; ++i) {\n"
                        "      Index src = base;\n"
                        "%s"
                        "      acc = Fold(acc, ToAcc(in[src]));\n"
                        "    }\n"
                        "    out[o] = kiln::Round<%s>::From(acc);\n"
                        "  }\n"
                        "}\n",
                        threads, r.name, r.out_type, r.params,
                        IndexTypeFor(std::max(r.outputs, r.input_elements) + int64_t{grid[0]} * threads), r.construct,
                        r.outputs,
                        kept.empty() ? "" : OffsetCode(kept, "o", "base"), r.reduced,
                        reduced.empty() || r.reduced == 0 ? "" : OffsetCode(reduced, "i", "src"), r.out_type);
  return MakeKernel(r.name, std::move(source), grid, {static_cast<uint32_t>(threads), 1, 1});
}

// Combines `acc` across the 32 lanes of each warp, then (G > 32) across the warps of a row.
std::string GroupCombineCode(int group) {
  std::string code =
      "  for (int offset = 16; offset > 0; offset >>= 1) acc = Fold(acc, __shfl_xor_sync(0xffffffffu, acc, offset));\n";
  if (group > 32) {
    absl::StrAppendFormat(&code,
                          "  __shared__ Acc partial[%d];\n"
                          "  if (threadIdx.x %% 32 == 0) partial[threadIdx.x / 32] = acc;\n"
                          "  __syncthreads();\n"
                          "  if (threadIdx.x < 32) {\n"
                          "    acc = threadIdx.x < %d ? partial[threadIdx.x] : Init();\n"
                          "  %s"
                          "  }\n",
                          group / 32, group / 32, code);
  }
  return code;
}

KernelSpec RowReduce(const Reduction& r, int dtype_bytes, std::string source) {
  const int group = r.reduced <= kWarpPerRowMaxReduced ? 32 : (r.outputs >= r.blocks_to_fill() ? 256 : 1024);
  const int rows_per_block = group == 32 ? 8 : 1;
  const int width = r.fused ? 1 : VectorWidth(dtype_bytes, {r.reduced});
  const std::array<uint32_t, 3> grid = {
      static_cast<uint32_t>((r.outputs + rows_per_block - 1) / rows_per_block), 1, 1};
  absl::StrAppendFormat(&source,
                        "// %d threads per row of %d elements, %d rows per block.\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out%s) {\n"
                        "  typedef %s Index;\n%s"
                        "  const Index row = static_cast<Index>(blockIdx.x) * %d + threadIdx.y;\n"
                        "  Acc acc = Init();\n"
                        "  if (row < %d) {\n"
                        "    const auto p = in + row * %d;\n"
                        "#pragma unroll 4\n"
                        "    for (Index i = threadIdx.x; i < %d; i += %d) {\n"
                        "%s"
                        "    }\n"
                        "  }\n"
                        "%s"
                        "  if (threadIdx.x == 0 && row < %d) out[row] = kiln::Round<%s>::From(acc);\n"
                        "}\n",
                        group, r.reduced, rows_per_block, group * rows_per_block, r.name, r.out_type, r.params,
                        IndexTypeFor(r.input_elements + group), r.construct, rows_per_block, r.outputs, r.reduced,
                        r.reduced / width, group, FoldLoads(r, width, "      "), GroupCombineCode(group), r.outputs,
                        r.out_type);
  return MakeKernel(r.name, std::move(source), grid,
                    {static_cast<uint32_t>(group), static_cast<uint32_t>(rows_per_block), 1});
}

// Blocks per row when a few long rows would leave most SMs idle (a gradient's squared norm
// for clipping: [32000,768] -> []); 1 keeps a row in one block.
int64_t SplitsPerRow(const Reduction& r, int width) {
  if (r.outputs >= r.blocks_to_fill()) return 1;
  const int64_t by_occupancy = (kSplitBlocksPerSm * r.target->sm_count + r.outputs - 1) / r.outputs;
  const int64_t by_work = r.reduced / width / (kSplitThreads * kSplitMinVectorsPerThread);
  return std::max<int64_t>(1, std::min(by_occupancy, by_work));
}

KernelSpec SplitRowReduce(const Reduction& r, int width, int64_t splits, std::string source) {
  const int64_t vectors = r.reduced / width;
  const int64_t chunk = (vectors + splits - 1) / splits;
  splits = (vectors + chunk - 1) / chunk;  // no empty split
  absl::StrAppendFormat(&source,
                        "// %d blocks per row of %d elements, each folding %d vectors of %d; the last block to\n"
                        "// finish folds every row's partials in block order, so sums do not depend on timing.\n"
                        "// g_partials and g_blocks_done (zero at load, reset by the last block) belong to the\n"
                        "// module: launches of this cubin must not overlap.\n"
                        "static __device__ Acc g_partials[%d];\n"
                        "static __device__ unsigned int g_blocks_done = 0;\n\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out%s) {\n"
                        "  typedef %s Index;\n%s"
                        "  const Index row = static_cast<Index>(blockIdx.x) / %d;\n"
                        "  const Index begin = (static_cast<Index>(blockIdx.x) %% %d) * %d;\n"
                        "  const Index end = begin + %d < %d ? begin + %d : %d;\n"
                        "  const auto p = in + row * %d;\n"
                        "  Acc acc = Init();\n"
                        "#pragma unroll 4\n"
                        "  for (Index i = begin + threadIdx.x; i < end; i += %d) {\n"
                        "%s"
                        "  }\n"
                        "%s"
                        "  __shared__ bool is_last;\n"
                        "  if (threadIdx.x == 0) {\n"
                        "    g_partials[blockIdx.x] = acc;\n"
                        "    __threadfence();  // publish the partial before counting this block done\n"
                        "    is_last = atomicAdd(&g_blocks_done, 1u) == gridDim.x - 1;\n"
                        "  }\n"
                        "  __syncthreads();\n"
                        "  if (!is_last) return;\n"
                        "  __threadfence();\n"
                        "  for (Index o = threadIdx.x; o < %d; o += %d) {\n"
                        "    Acc total = Init();\n"
                        "    for (int s = 0; s < %d; ++s) total = Fold(total, __ldcg(&g_partials[o * %d + s]));\n"
                        "    out[o] = kiln::Round<%s>::From(total);\n"
                        "  }\n"
                        "  if (threadIdx.x == 0) g_blocks_done = 0;\n"
                        "}\n",
                        splits, r.reduced, chunk, width, r.outputs * splits, kSplitThreads, r.name, r.out_type,
                        r.params, IndexTypeFor(r.input_elements + kSplitThreads), r.construct, splits, splits, chunk,
                        chunk, vectors, chunk, vectors, r.reduced, kSplitThreads, FoldLoads(r, width, "    "),
                        GroupCombineCode(kSplitThreads), r.outputs, kSplitThreads, splits, splits, r.out_type);
  return MakeKernel(r.name, std::move(source), {static_cast<uint32_t>(r.outputs * splits), 1, 1},
                    {static_cast<uint32_t>(kSplitThreads), 1, 1});
}

KernelSpec ColumnReduce(const Reduction& r, const ThreeDims& t, std::string source) {
  auto blocks = [&](int64_t tile) { return t.outer * ((t.inner + tile - 1) / tile); };
  int64_t tile = blocks(32) >= r.blocks_to_fill() ? 32 : blocks(16) >= r.blocks_to_fill() ? 16 : 8;
  while (tile / 2 >= t.inner) tile /= 2;  // no idle columns when there are only a few
  int64_t row_groups = 1024 / tile;
  while (row_groups > t.reduced) row_groups /= 2;
  const int64_t tiles = (t.inner + tile - 1) / tile;
  absl::StrAppendFormat(&source,
                        "// Tiles of %d columns; %d row groups each sum every %d-th of the %d rows.\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out%s) {\n"
                        "  typedef %s Index;\n%s"
                        "  const Index outer = blockIdx.x / %d;\n"
                        "  const Index col = (blockIdx.x %% %d) * %d + threadIdx.x;\n"
                        "  Acc acc = Init();\n"
                        "  if (col < %d) {\n"
                        "    const auto p = in + outer * %d + col;\n"
                        "#pragma unroll 4\n"
                        "    for (Index row = threadIdx.y; row < %d; row += %d) acc = Fold(acc, ToAcc(p[row * %d]));\n"
                        "  }\n"
                        "  __shared__ Acc partial[%d][%d];\n"
                        "  partial[threadIdx.y][threadIdx.x] = acc;\n"
                        "  __syncthreads();\n"
                        "  for (int s = %d; s > 0; s >>= 1) {\n"
                        "    if (threadIdx.y < s) {\n"
                        "      partial[threadIdx.y][threadIdx.x] = Fold(partial[threadIdx.y][threadIdx.x], "
                        "partial[threadIdx.y + s][threadIdx.x]);\n"
                        "    }\n"
                        "    __syncthreads();\n"
                        "  }\n"
                        "  if (threadIdx.y == 0 && col < %d) out[outer * %d + col] = kiln::Round<%s>::From(partial[0][threadIdx.x]);\n"
                        "}\n",
                        tile, row_groups, row_groups, t.reduced, tile * row_groups, r.name, r.out_type, r.params,
                        IndexTypeFor(r.input_elements), r.construct, tiles, tiles, tile, t.inner, t.reduced * t.inner,
                        t.reduced, row_groups, t.inner, row_groups, tile, row_groups / 2, t.inner, t.inner, r.out_type);
  return MakeKernel(r.name, std::move(source), {static_cast<uint32_t>(blocks(tile)), 1, 1},
                    {static_cast<uint32_t>(tile), static_cast<uint32_t>(row_groups), 1});
}

}  // namespace

absl::StatusOr<LoweredNode> LowerReduce(const Node& node, const CodegenOptions& options,
                                        const FusedReduceInput* fused) {
  ASSIGN_OR_RETURN(std::vector<int64_t> reduced_dims, node.attrs().GetInts("dims"));
  const TensorType& x = node.operand(0)->type();
  const int64_t outputs = node.type().num_elements();
  if (outputs == 0) return LoweredNode{LoweringKind::kKernels, {}};
  Reduction r{fused ? fused->kernel_name : KernelName(node), CudaTypeName(x.dtype), CudaTypeName(node.type().dtype),
              fused ? fused->params : absl::StrCat(", const ", CudaTypeName(x.dtype), "* in"),
              fused ? fused->construct : "", fused != nullptr};
  r.outputs = outputs;
  r.reduced = x.num_elements() / outputs;
  r.input_elements = x.num_elements();
  r.target = &options.target;
  const std::vector<DimGroup> groups = GroupDims(x, reduced_dims);
  const std::optional<ThreeDims> three = AsThreeDims(groups);

  std::string source = fused ? fused->opening : SourceOpening(node, {x.dtype});
  absl::StrAppend(&source, AccumulatorLibrary(node, r.type), fused ? fused->definition : "");
  LoweredNode lowered{LoweringKind::kKernels, {}};
  if (!three.has_value() || r.reduced <= kThreadPerOutputMaxReduced) {
    lowered.kernels.push_back(ThreadPerOutput(r, groups, std::move(source), options.threads_per_block));
  } else if (three->inner == 1) {
    const int width = fused ? 1 : VectorWidth(DTypeBytes(x.dtype), {r.reduced});
    const int64_t splits = SplitsPerRow(r, width);
    lowered.kernels.push_back(splits > 1 ? SplitRowReduce(r, width, splits, std::move(source))
                                         : RowReduce(r, DTypeBytes(x.dtype), std::move(source)));
  } else {
    lowered.kernels.push_back(ColumnReduce(r, *three, std::move(source)));
  }
  return lowered;
}

}  // namespace kiln::codegen
