// Lowering of a gemm of few rows (the decode step's) to kernels/gemv.cuh's SmallMGemm instead
// of cuBLASLt: see that header for why and how.
#include "codegen/lower_gemv.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/fusion.h"
#include "ir/gemm_slots.h"
#include "ir/status_macros.h"

namespace kiln::codegen {
namespace {

using composite::CeilDiv;
using composite::Count;
using composite::Emit;
using composite::FloatLiteral;
using composite::Kernels;
using composite::Param;
using composite::Wrapper;

// B rows a group of warps computes, the warps splitting K, the chunks of each row a lane loads
// before using any, and the groups a block. More A rows want more B rows a group (one A chunk
// serves kRows B chunks: A's L1 reads stay below the B stream's); registers bound rows x
// unroll (16-byte B chunks a lane holds) and M x rows (f32 sums). K is split over the fewest
// warps (a power of two, at most 8) whose one round of loads covers the row: every load of a
// long row is then in flight at once (llama-M's down projection, 11 KB rows, took a warp
// three rounds before). Blocks are 4 warps where the split leaves room, at least one group.
// At M = 1, 4 chunks a lane (a row of 2048 bf16 over two warps) and, for a row of more than
// 512 chunks, 2 rows a group of 6 chunks each: the fastest of 8 geometries for each of
// llama-M's shapes, launched back to back (bench/decode_gemm_bench on an H100, bench/RESULTS.md
// session 24: 4.62 against 4.88 us for o, 9.52 against 10.00 for down).
struct Geometry {
  int rows = 1, split = 1, unroll = 8, groups = 4;
};

Geometry GeometryFor(int64_t m, int64_t chunks, const CodegenOptions::GemvGeometry& given) {
  if (given.rows > 0 && given.split > 0 && given.unroll > 0 && given.groups > 0) {
    return Geometry{given.rows, given.split, given.unroll, given.groups};
  }
  Geometry g;
  const bool long_row = chunks > 512;
  const int cap = m == 1 ? (long_row ? 6 : 4) : m <= 4 ? 4 : 2;  // chunks a lane holds of each row
  g.rows = m == 1 ? (long_row ? 2 : 1) : m <= 4 ? 2 : 4;
  while (g.split < 8 && static_cast<int64_t>(g.split) * composite::kWarpSize * cap < chunks) g.split *= 2;
  g.unroll = static_cast<int>(
      std::min<int64_t>(cap, CeilDiv(chunks, static_cast<int64_t>(g.split) * composite::kWarpSize)));
  g.groups = std::max(1, 4 / g.split);
  return g;
}

bool IsGemvDType(DType t) { return t == DType::kBF16 || t == DType::kF16 || t == DType::kF32; }

}  // namespace

std::string SmallMGemmRefusal(const Node& node, const CodegenOptions& options) {
  if (node.opcode() != Opcode::kGemm) return "not a gemm";
  if (!options.small_m_gemv) return "CodegenOptions::small_m_gemv is off";
  const AttrMap& attrs = node.attrs();
  const int64_t batch = attrs.GetInt("batch").value_or(-1), m = attrs.GetInt("m").value_or(-1),
                n = attrs.GetInt("n").value_or(-1), k = attrs.GetInt("k").value_or(-1);
  if (batch != 1) return absl::StrCat("batch ", batch, " (batched GEMMs stay cuBLASLt's)");
  if (m < 1 || m > kSmallMGemmMaxRows) return absl::StrCat("m ", m, " is not in [1, ", kSmallMGemmMaxRows, "]");
  if (n < 1 || k < 1) return "an empty product";
  if (attrs.GetSymbol("a_layout").value_or("") != "mk" || attrs.GetSymbol("b_layout").value_or("") != "nk") {
    return "layouts other than a_layout=mk, b_layout=nk";
  }
  absl::StatusOr<GemmSlots> slots = GemmSlotsOf(attrs);
  if (!slots.ok() || slots->bias >= 0 || slots->a_scale >= 0 || slots->amax) return "an epilogue, FP8 scales or an amax";
  const DType a = node.operand(0)->type().dtype, b = node.operand(1)->type().dtype, d = node.type().dtype;
  if (a != b || !IsGemvDType(a) || (d != a && d != DType::kF32)) {
    return absl::StrCat(DTypeName(a), " x ", DTypeName(b), " -> ", DTypeName(d),
                        " (operands bf16, f16 or f32 alike; D theirs or f32)");
  }
  const int64_t vec = 16 / static_cast<int64_t>(DTypeBytes(a));
  if (k % vec != 0) return absl::StrCat("K ", k, " is not a multiple of ", vec, " (16-byte chunks)");
  return "";
}

absl::StatusOr<LoweredNode> LowerSmallMGemm(const Node& node, const CodegenOptions& options) {
  const std::string refusal = SmallMGemmRefusal(node, options);
  if (!refusal.empty()) return absl::InvalidArgumentError(absl::StrCat(composite::Where(node), ": ", refusal));
  ASSIGN_OR_RETURN(const int64_t m, node.attrs().GetInt("m"));
  ASSIGN_OR_RETURN(const int64_t n, node.attrs().GetInt("n"));
  ASSIGN_OR_RETURN(const int64_t k, node.attrs().GetInt("k"));
  ASSIGN_OR_RETURN(const double alpha, node.attrs().GetFloat("alpha"));
  ASSIGN_OR_RETURN(const double beta, node.attrs().GetFloat("beta"));
  ASSIGN_OR_RETURN(const GemmSlots slots, GemmSlotsOf(node.attrs()));
  const bool has_c = slots.c >= 0;
  const DType t = node.operand(0)->type().dtype, d = node.type().dtype;
  const int64_t vec = 16 / static_cast<int64_t>(DTypeBytes(t));
  const Geometry g = GeometryFor(m, k / vec, options.small_m_gemv_geometry);
  const int64_t blocks = CeilDiv(n, static_cast<int64_t>(g.rows) * g.groups);
  const int threads = g.groups * g.split * composite::kWarpSize;
  RETURN_IF_ERROR(composite::CheckGrid(node, blocks));
  Wrapper w;
  w.header = "gemv";
  w.comment = absl::StrCat(m, " x ", n, " x ", k, ": ", Count(g.split, "warp"), " per ", Count(g.rows, "row"),
                           " of B, ", g.unroll, " 16-byte chunks of each in flight a lane; ", Count(blocks, "block"),
                           " of ", Count(g.groups * g.split, "warp"));
  w.params = {Param(t, "a"), Param(t, "b")};
  if (has_c) {
    w.params.push_back(Param(d, "c"));
    w.comment += absl::StrCat("; adds ", FloatLiteral(beta), " C");
  }
  // The weight's first round read before the grid-dependency wait where nothing in the step
  // writes it (kernels/gemv.cuh).
  const bool weights_first =
      composite::EarlyReadsAllowed(options) && composite::IsStepInvariant(*node.operand(1));
  if (weights_first) w.comment += "; its first round of B read before the grid-dependency wait";
  w.call = absl::StrCat("SmallMGemm<", CudaTypeName(t), ", ", CudaTypeName(d), ", ", m, ", ", n, "LL, ", k, "LL, ",
                        g.rows, ", ", g.split, ", ", g.unroll, ", ", g.groups, ", ", has_c ? "true" : "false",
                        weights_first ? ", true" : "", ">::Run(out, a, b, ", has_c ? "c" : "nullptr", ", ",
                        FloatLiteral(alpha), ", ", FloatLiteral(has_c ? beta : 0.0), ")");
  LoweredNode lowered = Kernels({Emit(node, KernelName(node), w, blocks, threads)});
  lowered.kernels[0].launches_dependents_itself = true;  // after its loop (kernels/gemv.cuh)
  lowered.kernels[0].waits_itself = weights_first;
  lowered.label = "gemv";
  return lowered;
}

namespace {

// FewRowClusterGemm's geometry (kernels/few_row_cluster_gemm.cuh): a warp takes one m16 tile of
// B rows, a block 4 warps (64 rows; a GLU block 32 columns of D, each a gate row and its up
// row), and K is split over the fewest blocks of a cluster (1, 2, 4 or 8) that make at least
// one block an SM and leave a block at most 100 KB of shared memory (two an SM). 4 slabs of
// 32 columns in flight a lane.
struct ClusterGeometry {
  int tiles = 1, warps = 4, split = 1, unroll = 4;
};

// Mirrors FewRowClusterGemmLayout::kSharedBytes (the kernel checks it against what it was given).
int64_t ClusterSharedBytes(int64_t m, int64_t k, const ClusterGeometry& g) {
  const int64_t m_pad = CeilDiv(m, 8) * 8, slabs = CeilDiv(k, 32), per_split = CeilDiv(slabs, g.split);
  const int64_t x_stride = per_split * 64 + (per_split % 2 == 0 ? 64 : 0);
  return m_pad * x_stride + int64_t{16} * g.tiles * g.warps * (m_pad + 2) * 4;
}

ClusterGeometry ClusterGeometryFor(int64_t m, int64_t columns, int64_t k, bool glu, const CodegenOptions& options) {
  const CodegenOptions::ClusterGemmGeometry& given = options.few_row_cluster_gemm_geometry;
  if (given.tiles > 0 && given.warps > 0 && given.split > 0 && given.unroll > 0) {
    return ClusterGeometry{given.tiles, given.warps, given.split, given.unroll};
  }
  ClusterGeometry g;
  const int64_t per_block = int64_t{16} * g.tiles * g.warps / (glu ? 2 : 1);
  const int64_t row_tiles = CeilDiv(columns, per_block);
  constexpr int64_t kTwoAnSm = 100 * 1024;
  while (g.split < 8 && (row_tiles * g.split < options.target.sm_count || ClusterSharedBytes(m, k, g) > kTwoAnSm)) {
    g.split *= 2;
  }
  return g;
}

std::string ClusterGeometryRefusal(int64_t m, int64_t k, bool glu, const ClusterGeometry& g,
                                   const CodegenOptions& options) {
  if (g.split > 8 || (g.split & (g.split - 1)) != 0) return absl::StrCat("a cluster of ", g.split, " blocks (1, 2, 4 or 8)");
  if (glu && g.warps % 2 != 0) return absl::StrCat(g.warps, " warps (a GLU block's are half gate, half up)");
  const int64_t columns = int64_t{16} * g.tiles * g.warps / (glu ? 2 : 1);
  if (columns % g.split != 0) return absl::StrCat(columns, " columns a block over ", g.split, " ranks");
  if (g.warps * composite::kWarpSize > composite::kMaxThreadsPerBlock) return absl::StrCat(g.warps, " warps a block");
  const int64_t bytes = ClusterSharedBytes(m, k, g);
  if (bytes > options.target.shared_memory_per_block) {
    return absl::StrCat(bytes, " bytes of shared memory a block (", options.target.shared_memory_per_block, " at most)");
  }
  return "";
}

// The template call of FewRowClusterGemm and its kernel spec.
absl::StatusOr<LoweredNode> EmitClusterGemm(const Node& node, int64_t m, int64_t columns, int64_t k, double alpha,
                                            double beta, bool has_c, bool glu, DType d, const CodegenOptions& options) {
  const ClusterGeometry g = ClusterGeometryFor(m, columns, k, glu, options);
  if (std::string why = ClusterGeometryRefusal(m, k, glu, g, options); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(composite::Where(node), ": FewRowClusterGemm's geometry: ", why));
  }
  const int64_t per_block = int64_t{16} * g.tiles * g.warps / (glu ? 2 : 1);
  const int64_t blocks = CeilDiv(columns, per_block) * g.split;
  RETURN_IF_ERROR(composite::CheckGrid(node, blocks));
  const bool weights_first = composite::EarlyReadsAllowed(options) && composite::IsStepInvariant(*node.operand(1));
  Wrapper w;
  w.header = "few_row_cluster_gemm";
  w.comment = absl::StrCat(m, " x ", glu ? 2 * columns : columns, " x ", k, glu ? " and silu(gate) * up of its halves" : "",
                           ": tensor cores, ", Count(g.warps, "warp"), " of ", 16 * g.tiles, " B rows a block, K over ",
                           Count(g.split, "block"), " of a cluster, ", g.unroll, " slabs of 32 columns in flight a lane; ",
                           Count(blocks, "block"));
  w.params = {Param(DType::kBF16, "a"), Param(DType::kBF16, "b")};
  if (has_c) {
    w.params.push_back(Param(d, "c"));
    w.comment += absl::StrCat("; adds ", FloatLiteral(beta), " C");
  }
  if (weights_first) w.comment += "; its first round of B read before the grid-dependency wait";
  if (g.split > 1) w.attributes = absl::StrCat("__cluster_dims__(", g.split, ", 1, 1)");
  w.call = absl::StrCat("FewRowClusterGemm<", CudaTypeName(d), ", ", m, ", ", columns, "LL, ", k, "LL, ", g.tiles, ", ",
                        g.warps, ", ", g.split, ", ", g.unroll, ", ", has_c ? "true" : "false", ", ",
                        weights_first ? "true" : "false",
                        glu ? absl::StrCat(", kiln::kernels::SwiGlu<", CudaTypeName(d), ">") : std::string(),
                        ">::Run(out, a, b, ", has_c ? "c" : "nullptr", ", ", FloatLiteral(alpha), ", ",
                        FloatLiteral(has_c ? beta : 0.0), ")");
  LoweredNode lowered = Kernels({Emit(node, KernelName(node), w, blocks, g.warps * composite::kWarpSize)});
  lowered.kernels[0].shared_bytes = static_cast<uint32_t>(ClusterSharedBytes(m, k, g));
  lowered.kernels[0].launches_dependents_itself = true;  // after its loop, as SmallMGemm
  lowered.kernels[0].waits_itself = weights_first;
  lowered.label = "gemv";
  return lowered;
}

}  // namespace

std::string FewRowClusterGemmRefusal(const Node& node, const CodegenOptions& options) {
  if (node.opcode() != Opcode::kGemm) return "not a gemm";
  if (!options.few_row_cluster_gemm) return "CodegenOptions::few_row_cluster_gemm is off";
  if (options.target.compute_capability < 90) return absl::StrCat(options.target.arch, " has no thread-block clusters");
  const AttrMap& attrs = node.attrs();
  const int64_t batch = attrs.GetInt("batch").value_or(-1), m = attrs.GetInt("m").value_or(-1),
                n = attrs.GetInt("n").value_or(-1), k = attrs.GetInt("k").value_or(-1);
  if (batch != 1) return absl::StrCat("batch ", batch, " (batched GEMMs stay cuBLASLt's)");
  if (m <= kSmallMGemmMaxRows || m > kFewRowClusterGemmMaxRows) {
    return absl::StrCat("m ", m, " is not in [", kSmallMGemmMaxRows + 1, ", ", kFewRowClusterGemmMaxRows, "]");
  }
  if (n < 1 || k < 1) return "an empty product";
  if (attrs.GetSymbol("a_layout").value_or("") != "mk" || attrs.GetSymbol("b_layout").value_or("") != "nk") {
    return "layouts other than a_layout=mk, b_layout=nk";
  }
  absl::StatusOr<GemmSlots> slots = GemmSlotsOf(attrs);
  if (!slots.ok() || slots->bias >= 0 || slots->a_scale >= 0 || slots->amax) return "an epilogue, FP8 scales or an amax";
  const DType a = node.operand(0)->type().dtype, b = node.operand(1)->type().dtype, d = node.type().dtype;
  if (a != DType::kBF16 || b != DType::kBF16 || (d != DType::kBF16 && d != DType::kF32)) {
    return absl::StrCat(DTypeName(a), " x ", DTypeName(b), " -> ", DTypeName(d), " (operands bf16; D bf16 or f32)");
  }
  if (k % 8 != 0) return absl::StrCat("K ", k, " is not a multiple of 8 (16-byte chunks)");
  const ClusterGeometry g = ClusterGeometryFor(m, n, k, /*glu=*/false, options);
  return ClusterGeometryRefusal(m, k, /*glu=*/false, g, options);
}

absl::StatusOr<LoweredNode> LowerFewRowClusterGemm(const Node& node, const CodegenOptions& options) {
  const std::string refusal = FewRowClusterGemmRefusal(node, options);
  if (!refusal.empty()) return absl::InvalidArgumentError(absl::StrCat(composite::Where(node), ": ", refusal));
  ASSIGN_OR_RETURN(const int64_t m, node.attrs().GetInt("m"));
  ASSIGN_OR_RETURN(const int64_t n, node.attrs().GetInt("n"));
  ASSIGN_OR_RETURN(const int64_t k, node.attrs().GetInt("k"));
  ASSIGN_OR_RETURN(const double alpha, node.attrs().GetFloat("alpha"));
  ASSIGN_OR_RETURN(const double beta, node.attrs().GetFloat("beta"));
  ASSIGN_OR_RETURN(const GemmSlots slots, GemmSlotsOf(node.attrs()));
  return EmitClusterGemm(node, m, n, k, alpha, beta, slots.c >= 0, /*glu=*/false, node.type().dtype, options);
}

absl::StatusOr<LoweredNode> LowerGemvGluFusion(const Node& fusion, const CodegenOptions& options) {
  const Function* body = fusion.body();
  const Node* gemm = nullptr;
  if (body != nullptr) {
    for (const auto& n : body->nodes()) {
      if (n->opcode() == Opcode::kGemm) gemm = n.get();
    }
  }
  if (gemm == nullptr || MatchSwiGlu(*body, *gemm).out == nullptr || fusion.operands().size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("gemv_glu fusion %", fusion.name(),
                                                   ": its body is not a gemm of two operands followed by its SwiGLU"));
  }
  ASSIGN_OR_RETURN(const int64_t m, gemm->attrs().GetInt("m"));
  ASSIGN_OR_RETURN(const int64_t n, gemm->attrs().GetInt("n"));
  ASSIGN_OR_RETURN(const int64_t k, gemm->attrs().GetInt("k"));
  ASSIGN_OR_RETURN(const double alpha, gemm->attrs().GetFloat("alpha"));
  const int64_t half = n / 2;
  const DType t = gemm->operand(0)->type().dtype, d = gemm->type().dtype;
  if (fusion.type().dtype != d) {
    return absl::InvalidArgumentError(absl::StrCat("gemv_glu fusion %", fusion.name(), ": its result is ",
                                                   DTypeName(fusion.type().dtype), ", its gemm's ", DTypeName(d)));
  }
  const std::string refusal = SmallMGemmRefusal(*gemm, options);
  if (!refusal.empty()) {
    // Past SmallMGemm's rows, the tensor-core kernel's GLU form.
    const std::string cluster_refusal = FewRowClusterGemmRefusal(*gemm, options);
    if (cluster_refusal.empty()) {
      return EmitClusterGemm(fusion, m, half, k, alpha, 0.0, /*has_c=*/false, /*glu=*/true, d, options);
    }
    return absl::InvalidArgumentError(absl::StrCat("gemv_glu fusion %", fusion.name(), " (made by fuse-gemv-glu): its ",
                                                   composite::Where(*gemm), " takes neither SmallMGemm (", refusal,
                                                   ") nor FewRowClusterGemm (", cluster_refusal,
                                                   "); compile with --disable-pass fuse-gemv-glu"));
  }
  const int64_t vec = 16 / static_cast<int64_t>(DTypeBytes(t));
  Geometry g = GeometryFor(m, k / vec, options.small_m_gemv_geometry);
  g.rows = 2;  // a group's gate row and up row
  const int64_t blocks = CeilDiv(half, static_cast<int64_t>(g.groups));
  const int threads = g.groups * g.split * composite::kWarpSize;
  RETURN_IF_ERROR(composite::CheckGrid(fusion, blocks));
  const bool weights_first =
      composite::EarlyReadsAllowed(options) && composite::IsStepInvariant(*fusion.operand(1));
  Wrapper w;
  w.header = "gemv";
  w.comment = absl::StrCat(m, " x ", n, " x ", k, " and silu(gate) * up of its halves: ", Count(g.split, "warp"),
                           " per gate row and its up row, ", g.unroll, " 16-byte chunks of each in flight a lane; ",
                           Count(blocks, "block"), " of ", Count(g.groups * g.split, "warp"));
  if (weights_first) w.comment += "; its first round of B read before the grid-dependency wait";
  w.params = {Param(t, "a"), Param(t, "b")};
  w.call = absl::StrCat("SmallMGemm<", CudaTypeName(t), ", ", CudaTypeName(d), ", ", m, ", ", half, "LL, ", k, "LL, 2, ",
                        g.split, ", ", g.unroll, ", ", g.groups, ", false, ", weights_first ? "true" : "false",
                        ", kiln::kernels::SwiGlu<", CudaTypeName(d), ">>::Run(out, a, b, nullptr, ", FloatLiteral(alpha), ", 0.0f)");
  LoweredNode lowered = Kernels({Emit(fusion, KernelName(fusion), w, blocks, threads)});
  lowered.kernels[0].launches_dependents_itself = true;
  lowered.kernels[0].waits_itself = weights_first;
  lowered.label = "gemv";
  return lowered;
}

}  // namespace kiln::codegen
