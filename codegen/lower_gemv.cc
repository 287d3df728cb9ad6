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

absl::StatusOr<LoweredNode> LowerGemvNormGemvFusion(const Node& fusion, const CodegenOptions& options) {
  auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("gemv_norm_gemv fusion %", fusion.name(),
                                                   " (made by fuse-norm-between-gemvs): ", why,
                                                   "; compile with --disable-pass fuse-norm-between-gemvs"));
  };
  if (fusion.body() == nullptr) return error("it has no body");
  absl::StatusOr<GemvNormGemvOps> ops = MatchGemvNormGemv(*fusion.body());
  if (!ops.ok()) return error(ops.status().message());
  const Node& first = *ops->first;
  const Node& norm = *ops->norm;
  const Node& second = *ops->second;
  for (const Node* gemm : {&first, &second}) {
    const std::string refusal = SmallMGemmRefusal(*gemm, options);
    if (!refusal.empty()) return error(absl::StrCat("its ", composite::Where(*gemm), " does not take SmallMGemm: ", refusal));
  }
  ASSIGN_OR_RETURN(const GemmSlots first_slots, GemmSlotsOf(first.attrs()));
  ASSIGN_OR_RETURN(const GemmSlots second_slots, GemmSlotsOf(second.attrs()));
  if (second_slots.c >= 0) return error("its second gemm adds a C");
  ASSIGN_OR_RETURN(const int64_t m, first.attrs().GetInt("m"));
  ASSIGN_OR_RETURN(const int64_t n1, first.attrs().GetInt("n"));
  ASSIGN_OR_RETURN(const int64_t k1, first.attrs().GetInt("k"));
  ASSIGN_OR_RETURN(const double alpha1, first.attrs().GetFloat("alpha"));
  ASSIGN_OR_RETURN(const double beta1, first.attrs().GetFloat("beta"));
  ASSIGN_OR_RETURN(const int64_t m2, second.attrs().GetInt("m"));
  ASSIGN_OR_RETURN(const int64_t n2, second.attrs().GetInt("n"));
  ASSIGN_OR_RETURN(const int64_t k2, second.attrs().GetInt("k"));
  ASSIGN_OR_RETURN(const double alpha2, second.attrs().GetFloat("alpha"));
  ASSIGN_OR_RETURN(const double eps, composite::FiniteFloatAttr(norm, "eps"));
  if (m2 != m || k2 != n1 || norm.type().dims.empty() || norm.type().dims.back() != n1) {
    return error(absl::StrCat("the second gemm's ", m2, " x ", k2, " A is not the first's ", m, " x ", n1, " D"));
  }
  const bool has_c = first_slots.c >= 0;
  const bool glu = ops->glu.out != nullptr;
  const DType t1 = first.operand(0)->type().dtype, t2 = second.operand(0)->type().dtype,
              tw = norm.operand(1)->type().dtype, d2 = second.type().dtype;
  if (glu && fusion.result(1)->type().dtype != d2) return error("its SwiGLU is not of its gemm's dtype");
  const int64_t vec1 = 16 / static_cast<int64_t>(DTypeBytes(t1)), vec2 = 16 / static_cast<int64_t>(DTypeBytes(t2));
  const Geometry g1 = GeometryFor(m, n1, k1, k1 / vec1, options);
  Geometry g2 = GeometryFor(m, n2, k2, k2 / vec2, options);
  if (glu) g2.rows = 2;  // a group's gate row and up row
  const int64_t n2_out = glu ? n2 / 2 : n2;
  const int64_t blocks1 = CeilDiv(n1, static_cast<int64_t>(g1.rows) * g1.groups);
  const int64_t blocks2 = CeilDiv(n2_out, static_cast<int64_t>(glu ? 1 : g2.rows) * g2.groups);
  const int threads1 = g1.groups * g1.split * composite::kWarpSize, threads2 = g2.groups * g2.split * composite::kWarpSize;
  RETURN_IF_ERROR(composite::CheckGrid(fusion, std::max(blocks1, blocks2)));
  const bool early = composite::EarlyReadsAllowed(options);
  const bool first_weights_first = early && composite::IsStepInvariant(*fusion.operand(1));
  const int second_b = static_cast<int>(fusion.num_operands()) - 1;  // the second gemm's B, the last operand
  const bool second_weights_first = early && composite::IsStepInvariant(*fusion.operand(second_b));

  // One parameter list for both kernels: the two results, the operands, D's scratch and the sums.
  Wrapper w;
  w.header = "gemv";
  w.outputs = {"float* x", absl::StrCat(CudaTypeName(fusion.result(1)->type().dtype), "* y")};
  w.params = {Param(t1, "a"), Param(t1, "b")};
  if (has_c) w.params.push_back(Param(DType::kF32, "c"));
  w.params.push_back(Param(tw, "w"));
  w.params.push_back(Param(t2, "b2"));
  if (static_cast<int>(w.params.size()) != fusion.num_operands()) {
    return error(absl::StrCat("its ", fusion.num_operands(), " operands are not the first gemm's, the norm's weight and the second gemm's weight"));
  }
  // x's rows go to the scratch where the plan gives x no buffer (nothing outside reads it: the
  // last layer's residual, read only by the final norm); the second kernel reads them either way.
  w.params.push_back("float* x_scratch");
  w.params.push_back("unsigned long long* sums");
  const std::string x_rows = "x != nullptr ? x : x_scratch";

  Wrapper first_kernel = w;
  first_kernel.comment = absl::StrCat(m, " x ", n1, " x ", k1, ", adding up the sums of squares of its rows: ",
                                      Count(g1.split, "warp"), " per ", Count(g1.rows, "row"), " of B, ", g1.unroll,
                                      " 16-byte chunks of each in flight a lane; ", Count(blocks1, "block"), " of ",
                                      Count(g1.groups * g1.split, "warp"));
  if (has_c) first_kernel.comment += absl::StrCat("; adds ", FloatLiteral(beta1), " C");
  if (first_weights_first) first_kernel.comment += "; its first round of B read before the grid-dependency wait";
  first_kernel.call =
      absl::StrCat("SmallMGemm<", CudaTypeName(t1), ", float, ", m, ", ", n1, "LL, ", k1, "LL, ", g1.rows, ", ", g1.split,
                   ", ", g1.unroll, ", ", g1.groups, ", ", has_c ? "true" : "false", ", ",
                   first_weights_first ? "true" : "false", ">::RunAddingSquares(", x_rows, ", a, b, ",
                   has_c ? "c" : "nullptr", ", ", FloatLiteral(alpha1), ", ", FloatLiteral(has_c ? beta1 : 0.0), ", sums)");

  Wrapper second_kernel = w;
  second_kernel.comment =
      absl::StrCat(m, " x ", n2, " x ", k2, " of A = rms_norm(x) formed as it is read", glu ? ", then silu(gate) * up of its halves" : "",
                   ": ", Count(g2.split, "warp"), " per ", glu ? "gate row and its up row" : Count(g2.rows, "row"), ", ",
                   g2.unroll, " 16-byte chunks of each in flight a lane; ", Count(blocks2, "block"), " of ",
                   Count(g2.groups * g2.split, "warp"));
  if (second_weights_first) second_kernel.comment += "; its first round of B read before the grid-dependency wait";
  second_kernel.call = absl::StrCat(
      "SmallMGemm<", CudaTypeName(t2), ", ", CudaTypeName(d2), ", ", m, ", ", n2_out, "LL, ", k2, "LL, ", g2.rows, ", ",
      g2.split, ", ", g2.unroll, ", ", g2.groups, ", false, ", second_weights_first ? "true" : "false",
      glu ? absl::StrCat(", kiln::kernels::SwiGlu<", CudaTypeName(d2), ">") : "", ">::RunNormedA<", CudaTypeName(tw),
      ">(y, ", x_rows, ", w, ", FloatLiteral(eps), ", sums, b2, ", FloatLiteral(alpha2), ")");

  const std::string name = KernelName(fusion);
  LoweredNode lowered = Kernels({Emit(fusion, name, first_kernel, blocks1, threads1),
                                 Emit(fusion, absl::StrCat(name, "_normed"), second_kernel, blocks2, threads2)});
  lowered.kernels[0].launches_dependents_itself = lowered.kernels[1].launches_dependents_itself = true;
  lowered.kernels[0].waits_itself = first_weights_first;
  lowered.kernels[1].waits_itself = second_weights_first;
  lowered.scratch_bytes = m * n1 * static_cast<int64_t>(sizeof(float));
  lowered.persistent_bytes = m * kSquareSumSlots * 2 * 8 + 8;  // kernels/gemv.cuh: SquareSums<m>::kBytes
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
