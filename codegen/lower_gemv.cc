// Lowering of a gemm of few rows (the decode step's) to kernels/gemv.cuh's SmallMGemm instead
// of cuBLASLt: see that header for why and how.
#include "codegen/lower_gemv.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
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

constexpr int kWarpsPerBlock = 4;

// B rows a warp computes, and the chunks of each it loads before using any, by rows of A:
// one A chunk serves kRows B chunks, so more A rows want more B rows a warp to keep A's L1
// reads below the B stream's; registers bound the product (kRows x kUnroll 16-byte B chunks
// and M x kRows f32 sums).
struct Geometry {
  int rows = 1;
  int unroll = 8;
};

Geometry GeometryFor(int64_t m) {
  if (m == 1) return {1, 8};
  if (m <= 4) return {2, 4};
  return {4, 2};
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
  const Geometry g = GeometryFor(m);
  const int64_t rows_per_block = static_cast<int64_t>(g.rows) * kWarpsPerBlock;
  const int64_t blocks = CeilDiv(n, rows_per_block);
  RETURN_IF_ERROR(composite::CheckGrid(node, blocks));
  Wrapper w;
  w.header = "gemv";
  w.comment = absl::StrCat(m, " x ", n, " x ", k, ": a warp per ", Count(g.rows, "row"), " of B, ", g.unroll,
                           " 16-byte chunks of each in flight a lane; ", Count(blocks, "block"), " of ",
                           kWarpsPerBlock, " warps");
  w.params = {Param(t, "a"), Param(t, "b")};
  if (has_c) {
    w.params.push_back(Param(d, "c"));
    w.comment += absl::StrCat("; adds ", FloatLiteral(beta), " C");
  }
  w.call = absl::StrCat("SmallMGemm<", CudaTypeName(t), ", ", CudaTypeName(d), ", ", m, ", ", n, "LL, ", k, "LL, ",
                        g.rows, ", ", g.unroll, ", ", kWarpsPerBlock, ", ", has_c ? "true" : "false",
                        ">::Run(out, a, b, ", has_c ? "c" : "nullptr", ", ", FloatLiteral(alpha), ", ",
                        FloatLiteral(has_c ? beta : 0.0), ")");
  LoweredNode lowered = Kernels({Emit(node, KernelName(node), w, blocks, kWarpsPerBlock * composite::kWarpSize)});
  lowered.label = "gemv";
  return lowered;
}

}  // namespace kiln::codegen
