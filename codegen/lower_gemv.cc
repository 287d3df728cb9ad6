// Lowering of a gemm of few rows (the decode step's) to kernels/gemv.cuh's SmallMGemm instead
// of cuBLASLt: see that header for why and how.
#include "codegen/lower_gemv.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

bool IsGiven(const CodegenOptions::GemvGeometry& g) { return g.rows > 0 && g.split > 0 && g.unroll > 0 && g.groups > 0; }

// The geometry for a gemm of m x n x k (k in 16-byte chunks): the options' for its shape, else
// theirs for every shape, else the default below.
Geometry GeometryFor(int64_t m, int64_t n, int64_t k, int64_t chunks, const CodegenOptions& options) {
  const CodegenOptions::GemvGeometry* given = &options.small_m_gemv_geometry;
  for (const CodegenOptions::GemvShapeGeometry& s : options.small_m_gemv_shape_geometries) {
    if (s.n == n && s.k == k && IsGiven(s.geometry)) given = &s.geometry;
  }
  if (IsGiven(*given)) return Geometry{given->rows, given->split, given->unroll, given->groups};
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
  const Geometry g = GeometryFor(m, n, k, k / vec, options);
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
  const std::string refusal = SmallMGemmRefusal(*gemm, options);
  if (!refusal.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("gemv_glu fusion %", fusion.name(), " (made by fuse-gemv-glu): its ",
                                                   composite::Where(*gemm), " does not take SmallMGemm: ", refusal,
                                                   "; compile with --disable-pass fuse-gemv-glu"));
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
  const int64_t vec = 16 / static_cast<int64_t>(DTypeBytes(t));
  Geometry g = GeometryFor(m, n, k, k / vec, options);
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

namespace kiln {

absl::StatusOr<CodegenOptions::GemvGeometry> ParseGemvGeometry(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, 'x');
  int v[4] = {0, 0, 0, 0};
  bool ok = parts.size() == 4;
  for (size_t i = 0; ok && i < 4; ++i) ok = absl::SimpleAtoi(parts[i], &v[i]) && v[i] >= 1;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("SmallMGemm geometry '", text,
                                                   "': want ROWSxSPLITxUNROLLxGROUPS of positive integers, e.g. 1x2x4x2"));
  }
  return CodegenOptions::GemvGeometry{v[0], v[1], v[2], v[3]};
}

absl::StatusOr<std::vector<CodegenOptions::GemvShapeGeometry>> ParseGemvShapeGeometries(absl::string_view text) {
  std::vector<CodegenOptions::GemvShapeGeometry> shapes;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> shape_and_geometry = absl::StrSplit(entry, '=');
    const std::vector<absl::string_view> n_and_k = absl::StrSplit(shape_and_geometry[0], 'x');
    CodegenOptions::GemvShapeGeometry s;
    if (shape_and_geometry.size() != 2 || n_and_k.size() != 2 || !absl::SimpleAtoi(n_and_k[0], &s.n) ||
        !absl::SimpleAtoi(n_and_k[1], &s.k) || s.n < 1 || s.k < 1) {
      return absl::InvalidArgumentError(absl::StrCat("SmallMGemm shape geometry '", entry,
                                                     "': want NxK=ROWSxSPLITxUNROLLxGROUPS, e.g. 4096x2048=4x4x4x1"));
    }
    absl::StatusOr<CodegenOptions::GemvGeometry> g = ParseGemvGeometry(shape_and_geometry[1]);
    if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("for ", shape_and_geometry[0], ": ", g.status().message()));
    s.geometry = *g;
    shapes.push_back(s);
  }
  return shapes;
}

}  // namespace kiln
