// reduce_sum and reduce_max. The operand's dims merge into groups of adjacent kept or
// reduced dims; most reductions are then [A, R, C]: A outer kept, R reduced, C inner kept.
//
//   R <= 32, or not [A, R, C]    one thread per output element loops over its R elements
//   C == 1 (trailing dims)       a warp (R <= 4096) or a block per output row: strided
//                                vector loads, then a warp-shuffle / shared-memory tree;
//                                a few long rows split over many blocks (below)
//   C > 1 (e.g. [16384,768] -> [768], a gradient summed over tokens: bias and norm-bias
//   gradients)                   two stages, deterministic without atomics:
//                                1. a block per (tile of columns, slice of rows): each warp
//                                   reads 32 adjacent 16-byte vectors of a row (coalesced),
//                                   its 8 row groups stride down the slice, then fold in
//                                   row-group order; each slice's sums go to partials[s][:]
//                                   in the node's scratch (LoweredNode::scratch_bytes);
//                                2. a small kernel folds partials[0..S)[c] in a fixed order.
//                                The slices give every SM ~8 blocks even when C has only
//                                6 tiles (768 f32 columns); one slice writes the result
//                                itself. At 4 TB/s a [16384, 768] f32 read is ~13 us
//                                (bf16 ~6 us), [16384, 3072] f32 ~50 us; stage 2 reads
//                                S x C x 8 bytes (~0.4 MB), a few us.
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
// Column reductions: blocks of 256 threads, 8 per SM (each thread keeps 8 loads of 16 bytes
// in flight; at 3 blocks per SM, 37% occupancy, [16384, 3072] bf16 ran at 2.6 TB/s under
// ncu), a row slice giving each thread at least 8 rows; at most 1024 slices.
constexpr int kColumnThreads = 256;
constexpr int64_t kColumnBlocksPerSm = 8;
constexpr int64_t kColumnMinRowsPerThread = 8;
constexpr int64_t kColumnMaxSlices = 1024;
// A partial sum in the scratch: the accumulator (double for sums, at most 8 bytes).
constexpr int64_t kPartialBytes = 8;

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

// The last block's fold of the partials. One row (a whole-tensor sum: a gradient's squared
// norm for clipping) is folded by the whole block, thread t taking partials t, t + 256, ...
// and the block combining them in its fixed tree order (a thread folding ~1000 partials
// alone made the fold most of such a kernel's time). Several rows: a thread per row, its
// partials in block order. Either order is fixed, so the sum does not depend on timing.
std::string FinalFoldCode(const Reduction& r, int64_t splits) {
  if (r.outputs == 1) {
    return absl::StrFormat(
        "  {\n"
        "    acc = Init();\n"
        "    for (int s = threadIdx.x; s < %d; s += %d) acc = Fold(acc, __ldcg(&g_partials[s]));\n"
        "  %s"
        "    if (threadIdx.x == 0) out[0] = kiln::Round<%s>::From(acc);\n"
        "  }\n",
        splits, kSplitThreads, GroupCombineCode(kSplitThreads), r.out_type);
  }
  return absl::StrFormat(
      "  for (Index o = threadIdx.x; o < %d; o += %d) {\n"
      "    Acc total = Init();\n"
      "    for (int s = 0; s < %d; ++s) total = Fold(total, __ldcg(&g_partials[o * %d + s]));\n"
      "    out[o] = kiln::Round<%s>::From(total);\n"
      "  }\n",
      r.outputs, kSplitThreads, splits, splits, r.out_type);
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
                        "%s"
                        "  if (threadIdx.x == 0) g_blocks_done = 0;\n"
                        "}\n",
                        splits, r.reduced, chunk, width, r.outputs * splits, kSplitThreads, r.name, r.out_type,
                        r.params, IndexTypeFor(r.input_elements + kSplitThreads), r.construct, splits, splits, chunk,
                        chunk, vectors, chunk, vectors, r.reduced, kSplitThreads, FoldLoads(r, width, "    "),
                        GroupCombineCode(kSplitThreads), FinalFoldCode(r, splits));
  return MakeKernel(r.name, std::move(source), {static_cast<uint32_t>(r.outputs * splits), 1, 1},
                    {static_cast<uint32_t>(kSplitThreads), 1, 1});
}

// The two-stage column reduction's geometry (see the file comment).
struct ColumnGeometry {
  // Elements per thread and row: one 16-byte vector of the operand, or as many elements
  // computed one by one when the operand is fused (a thread then still keeps several loads of
  // its inputs in flight: with one element a thread, a bf16 input moved 64 bytes per warp load
  // and [16384, 3072] ran at half the card's bandwidth).
  int width = 1;
  int64_t vectors = 1;    // loads per row: inner / width
  int lanes = 32;         // threads of a block across a tile's vectors (threadIdx.x)
  int row_groups = 8;     // threads of a block down the rows (threadIdx.y)
  int64_t tiles = 1;      // tiles of lanes * width columns per outer index
  int64_t slices = 1;     // row slices, each a block per tile: the partial sums per column
  int64_t slice_rows = 1; // rows per slice (the last may have fewer)
  int64_t blocks() const { return tiles * slices; }
};

ColumnGeometry ChooseColumnGeometry(const Reduction& r, const ThreeDims& t, int dtype_bytes) {
  ColumnGeometry g;
  g.width = VectorWidth(dtype_bytes, {t.inner});
  g.vectors = t.inner / g.width;
  while (g.lanes / 2 >= g.vectors && g.lanes > 1) g.lanes /= 2;  // no idle lanes on a narrow tensor
  g.row_groups = kColumnThreads / g.lanes;
  g.tiles = t.outer * ((g.vectors + g.lanes - 1) / g.lanes);
  const int64_t by_occupancy = (kColumnBlocksPerSm * r.target->sm_count + g.tiles - 1) / g.tiles;
  const int64_t by_work = t.reduced / (int64_t{g.row_groups} * kColumnMinRowsPerThread);
  g.slices = std::clamp<int64_t>(std::min(by_occupancy, by_work), 1, kColumnMaxSlices);
  g.slice_rows = (t.reduced + g.slices - 1) / g.slices;
  g.slices = (t.reduced + g.slice_rows - 1) / g.slice_rows;  // no empty slice
  return g;
}

// Stage 1: block (tile, slice) sums its tile's columns over the slice's rows. Lane x of row
// group y loads vector x of rows y, y + Y, ... (a warp reads 32 adjacent vectors of a row:
// coalesced, 16 bytes a lane); the Y row groups' sums are then folded in row-group order
// through shared memory. With one slice the block writes the result; otherwise partial s
// of column c goes to partials[s][c] (the node's scratch) for stage 2.
KernelSpec ColumnPartials(const Reduction& r, const ThreeDims& t, const ColumnGeometry& g, std::string source) {
  const bool staged = g.slices > 1;
  const int64_t columns = t.outer * t.inner;
  const int64_t tile_columns = int64_t{g.lanes} * g.width;
  const int64_t tiles_per_outer = g.tiles / t.outer;
  const std::string load =
      r.fused ? absl::StrFormat("#pragma unroll\n"
                                "      for (int j = 0; j < %d; ++j) acc[j] = Fold(acc[j], ToAcc(p[row * kInner + v * %d + j]));\n",
                                g.width, g.width)
              : absl::StrFormat("      const kiln::Vec<%s, %d> x = kiln::LoadVec<%d>(p + row * kInner, v);\n"
                                "#pragma unroll\n"
                                "      for (int j = 0; j < %d; ++j) acc[j] = Fold(acc[j], ToAcc(x.v[j]));\n",
                                r.type, g.width, g.width, g.width);
  const std::string store =
      staged ? "partials[static_cast<Index>(blockIdx.y) * kColumns + outer * kInner + col] = total;"
             : absl::StrFormat("out[outer * kInner + col] = kiln::Round<%s>::From(total);", r.out_type);
  absl::StrAppendFormat(
      &source,
      "// Stage 1 of %d: tiles of %d columns (%d lanes x %d elements), %d row slices of %d rows;\n"
      "// %d row groups each sum every %d-th row of a slice.\n"
      "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out%s%s) {\n"
      "  typedef %s Index;\n%s"
      "  constexpr Index kReduced = %d, kInner = %d, kVectors = %d, kColumns = %d, kSliceRows = %d;\n"
      "  const Index outer = blockIdx.x / %d;\n"
      "  const Index first_vector = (blockIdx.x %% %d) * %d;\n"
      "  const Index v = first_vector + threadIdx.x;\n"
      "  const Index begin = static_cast<Index>(blockIdx.y) * kSliceRows;\n"
      "  const Index end = begin + kSliceRows < kReduced ? begin + kSliceRows : kReduced;\n"
      "  Acc acc[%d];\n"
      "#pragma unroll\n"
      "  for (int j = 0; j < %d; ++j) acc[j] = Init();\n"
      "  if (v < kVectors) {\n"
      "    const auto p = in + outer * (kReduced * kInner);\n"
      "#pragma unroll 8\n"
      "    for (Index row = begin + threadIdx.y; row < end; row += %d) {\n"
      "%s"
      "    }\n"
      "  }\n"
      "  __shared__ Acc sums[%d][%d];\n"
      "#pragma unroll\n"
      "  for (int j = 0; j < %d; ++j) sums[threadIdx.y][threadIdx.x * %d + j] = acc[j];\n"
      "  __syncthreads();\n"
      "  for (int c = threadIdx.y * %d + threadIdx.x; c < %d; c += %d) {\n"
      "    const Index col = first_vector * %d + c;\n"
      "    if (col >= kInner) break;\n"
      "    Acc total = sums[0][c];\n"
      "    for (int y = 1; y < %d; ++y) total = Fold(total, sums[y][c]);\n"
      "    %s\n"
      "  }\n"
      "}\n",
      staged ? 2 : 1, tile_columns, g.lanes, g.width, g.slices, g.slice_rows, g.row_groups, g.row_groups,
      kColumnThreads, staged ? absl::StrCat(r.name, "_partials") : r.name, r.out_type, r.params,
      staged ? ", Acc* __restrict__ partials" : "",
      IndexTypeFor(std::max(r.input_elements, g.slices * columns) + kColumnThreads * int64_t{g.width}), r.construct,
      t.reduced, t.inner, g.vectors, columns, g.slice_rows, tiles_per_outer, tiles_per_outer, g.lanes, g.width,
      g.width, g.row_groups, load, g.row_groups, tile_columns, g.width, g.width, g.lanes, tile_columns,
      kColumnThreads, g.width, g.row_groups, store);
  return MakeKernel(staged ? absl::StrCat(r.name, "_partials") : r.name, std::move(source),
                    {static_cast<uint32_t>(g.tiles), static_cast<uint32_t>(g.slices), 1},
                    {static_cast<uint32_t>(g.lanes), static_cast<uint32_t>(g.row_groups), 1});
}

// Stage 2: out[c] = the fold of partials[0..S)[c] in slice order, in a fixed tree that
// does not depend on timing: row group y of a block folds slices y, y + Y, ... in order,
// then thread y = 0 folds the Y group sums in order. The operands are in the signature
// (every kernel of a node takes the same parameters) and unread.
KernelSpec ColumnFold(const Reduction& r, const ThreeDims& t, const ColumnGeometry& g, std::string source) {
  const int64_t columns = t.outer * t.inner;
  constexpr int kLanes = 32, kGroups = kColumnThreads / kLanes;
  const int64_t blocks = (columns + kLanes - 1) / kLanes;
  absl::StrAppendFormat(
      &source,
      "// Stage 2 of 2: each of %d columns folds its %d slice partials (slice order within each\n"
      "// of %d groups, then group order).\n"
      "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out%s, const Acc* __restrict__ partials) {\n"
      "  typedef %s Index;\n"
      "  constexpr Index kColumns = %d, kSlices = %d;\n"
      "  const Index col = static_cast<Index>(blockIdx.x) * %d + threadIdx.x;\n"
      "  Acc acc = Init();\n"
      "  if (col < kColumns) {\n"
      "#pragma unroll 8\n"
      "    for (Index s = threadIdx.y; s < kSlices; s += %d) acc = Fold(acc, __ldcg(&partials[s * kColumns + col]));\n"
      "  }\n"
      "  __shared__ Acc sums[%d][%d];\n"
      "  sums[threadIdx.y][threadIdx.x] = acc;\n"
      "  __syncthreads();\n"
      "  if (threadIdx.y != 0 || col >= kColumns) return;\n"
      "  Acc total = sums[0][threadIdx.x];\n"
      "  for (int y = 1; y < %d; ++y) total = Fold(total, sums[y][threadIdx.x]);\n"
      "  out[col] = kiln::Round<%s>::From(total);\n"
      "}\n",
      columns, g.slices, kGroups, kColumnThreads, absl::StrCat(r.name, "_fold"), r.out_type, r.params,
      IndexTypeFor(g.slices * columns + kColumnThreads), columns, g.slices, kLanes, kGroups, kGroups, kLanes, kGroups,
      r.out_type);
  return MakeKernel(absl::StrCat(r.name, "_fold"), std::move(source), {static_cast<uint32_t>(blocks), 1, 1},
                    {static_cast<uint32_t>(kLanes), static_cast<uint32_t>(kGroups), 1});
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
    const ColumnGeometry g = ChooseColumnGeometry(r, *three, DTypeBytes(x.dtype));
    if (g.slices > 1) {
      lowered.kernels.push_back(ColumnPartials(r, *three, g, source));
      lowered.kernels.push_back(ColumnFold(r, *three, g, std::move(source)));
      lowered.scratch_bytes = g.slices * three->outer * three->inner * kPartialBytes;
    } else {
      lowered.kernels.push_back(ColumnPartials(r, *three, g, std::move(source)));
    }
  }
  return lowered;
}

}  // namespace kiln::codegen
