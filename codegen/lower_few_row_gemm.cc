// Lowering of a gemm of 9 to 64 rows to kernels/few_row_gemm.cuh's FewRowMmaGemm instead of
// cuBLASLt: see that header for why and how.
#include "codegen/lower_few_row_gemm.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "codegen/lower_gemv.h"
#include "ir/gemm_slots.h"
#include "ir/status_macros.h"

namespace kiln::codegen {
namespace {

using composite::CeilDiv;
using composite::Count;
using composite::FloatLiteral;

constexpr int64_t kChunk = 32;  // K elements a lane's two 16-byte loads and the two mma steps cover

// Shared memory a block holds A's slice in: about three blocks an SM fit beside it.
constexpr int64_t kMaxSliceBytes = 72 * 1024;

// A's slice in shared memory (kernels/few_row_gemm.cuh's kSharedBytes).
int64_t SliceBytes(int64_t m, int64_t slice_chunks) {
  return CeilDiv(m, 8) * 8 * (slice_chunks * kChunk + (slice_chunks % 2 == 0 ? 32 : 0)) * 2;
}

}  // namespace

std::string FewRowMmaRefusal(const Node& node, const CodegenOptions& options) {
  if (node.opcode() != Opcode::kGemm) return "not a gemm";
  if (!options.few_row_mma) return "CodegenOptions::few_row_mma is off";
  if (options.target.compute_capability < 80) {
    return absl::StrCat("sm_", options.target.compute_capability, " (mma.sync bf16 wants sm_80 or later)");
  }
  const AttrMap& attrs = node.attrs();
  const int64_t batch = attrs.GetInt("batch").value_or(-1), m = attrs.GetInt("m").value_or(-1),
                n = attrs.GetInt("n").value_or(-1), k = attrs.GetInt("k").value_or(-1);
  if (batch != 1) return absl::StrCat("batch ", batch, " (batched GEMMs stay cuBLASLt's)");
  if (m <= kSmallMGemmMaxRows || m > kFewRowMmaMaxRows) {
    return absl::StrCat("m ", m, " is not in [", kSmallMGemmMaxRows + 1, ", ", kFewRowMmaMaxRows, "]");
  }
  if (n < 1 || k < 1) return "an empty product";
  if (attrs.GetSymbol("a_layout").value_or("") != "mk" || attrs.GetSymbol("b_layout").value_or("") != "nk") {
    return "layouts other than a_layout=mk, b_layout=nk";
  }
  absl::StatusOr<GemmSlots> slots = GemmSlotsOf(attrs);
  if (!slots.ok() || slots->bias >= 0 || slots->a_scale >= 0 || slots->amax) return "an epilogue, FP8 scales or an amax";
  const DType a = node.operand(0)->type().dtype, b = node.operand(1)->type().dtype, d = node.type().dtype;
  if (a != b || (a != DType::kBF16 && a != DType::kF16) || (d != a && d != DType::kF32)) {
    return absl::StrCat(DTypeName(a), " x ", DTypeName(b), " -> ", DTypeName(d),
                        " (operands bf16 or f16 alike, the mma's; D theirs or f32)");
  }
  if (k % kChunk != 0) return absl::StrCat("K ", k, " is not a multiple of ", kChunk, " (the kernel's chunks)");
  return "";
}

// Blocks of 4 warps (64 rows of B), 8 chunks of each row in flight a lane, and K split into
// the fewest slices that make about two blocks an SM (llama-M's o projection at batch 32: 32
// row blocks of 8 slices; gate_up's 176 of 2) and keep A's slice within kMaxSliceBytes.
absl::StatusOr<FewRowMmaGeometry> FewRowMmaGeometryFor(int64_t m, int64_t n, int64_t k, const CodegenOptions& options) {
  const CodegenOptions::FewRowMmaGeometry& given = options.few_row_mma_geometry;
  const int64_t chunks = k / kChunk;
  FewRowMmaGeometry g;
  if (given.warps > 0) g.warps = given.warps;
  g.row_blocks = CeilDiv(n, 16 * int64_t{g.warps});
  int64_t slices = given.slices;
  if (slices <= 0) {
    slices = std::clamp<int64_t>(CeilDiv(2 * int64_t{std::max(1, options.target.sm_count)}, g.row_blocks), 1, chunks);
    while (slices < chunks && SliceBytes(m, CeilDiv(chunks, slices)) > kMaxSliceBytes) ++slices;
  }
  slices = std::clamp<int64_t>(slices, 1, chunks);
  g.slice_chunks = CeilDiv(chunks, slices);
  g.slices = static_cast<int>(CeilDiv(chunks, g.slice_chunks));  // every slice has a chunk
  g.unroll = static_cast<int>(std::min<int64_t>(given.unroll > 0 ? given.unroll : 8, g.slice_chunks));
  g.shared_bytes = SliceBytes(m, g.slice_chunks);
  g.scratch_bytes = g.slices > 1 ? g.row_blocks * g.slices * g.warps * CeilDiv(m, 8) * 4 * 32 * 4 : 0;
  if (g.warps > 32 || g.shared_bytes > options.target.shared_memory_per_block) {
    return absl::InvalidArgumentError(absl::StrCat("FewRowMmaGemm at m ", m, " k ", k, ": ", g.warps, " warps and ",
                                                   g.shared_bytes, " bytes of A's slice do not fit a block (at most 32 "
                                                   "warps and ", options.target.shared_memory_per_block, " bytes)"));
  }
  return g;
}

absl::StatusOr<LoweredNode> LowerFewRowMmaGemm(const Node& node, const CodegenOptions& options) {
  const std::string refusal = FewRowMmaRefusal(node, options);
  if (!refusal.empty()) return absl::InvalidArgumentError(absl::StrCat(composite::Where(node), ": ", refusal));
  ASSIGN_OR_RETURN(const int64_t m, node.attrs().GetInt("m"));
  ASSIGN_OR_RETURN(const int64_t n, node.attrs().GetInt("n"));
  ASSIGN_OR_RETURN(const int64_t k, node.attrs().GetInt("k"));
  ASSIGN_OR_RETURN(const double alpha, node.attrs().GetFloat("alpha"));
  ASSIGN_OR_RETURN(const double beta, node.attrs().GetFloat("beta"));
  ASSIGN_OR_RETURN(const GemmSlots slots, GemmSlotsOf(node.attrs()));
  const bool has_c = slots.c >= 0;
  const DType t = node.operand(0)->type().dtype, d = node.type().dtype;
  absl::StatusOr<FewRowMmaGeometry> geometry = FewRowMmaGeometryFor(m, n, k, options);
  if (!geometry.ok()) return absl::InvalidArgumentError(absl::StrCat(composite::Where(node), ": ", geometry.status().message()));
  const FewRowMmaGeometry& g = *geometry;
  const int64_t blocks = g.row_blocks * g.slices;
  RETURN_IF_ERROR(composite::CheckGrid(node, blocks));
  composite::Wrapper w;
  w.header = "few_row_gemm";
  w.comment = absl::StrCat(m, " x ", n, " x ", k, " on mma.sync: ", Count(g.row_blocks, "block"), " of ",
                           16 * g.warps, " rows of B x ", Count(g.slices, "slice"), " of ", g.slice_chunks * kChunk,
                           " of K (A's in shared memory), ", g.unroll, " chunks of each row in flight a lane");
  w.params = {composite::Param(t, "a"), composite::Param(t, "b")};
  if (has_c) {
    w.params.push_back(composite::Param(d, "c"));
    w.comment += absl::StrCat("; adds ", FloatLiteral(beta), " C");
  }
  if (g.slices > 1) {
    w.comment += "; the last slice of each row block adds the slices' partials";
    w.globals = absl::StrCat("// Finished slices per row block, zero at load; the last one resets its count.\n",
                             "static __device__ unsigned int g_slices_done[", g.row_blocks, "];\n\n");
    w.params.push_back("float* __restrict__ partials");  // the scratch
  }
  // The weight's first round read before the grid-dependency wait where nothing in the step
  // writes it (kernels/few_row_gemm.cuh).
  const bool weights_first =
      composite::EarlyReadsAllowed(options) && composite::IsStepInvariant(*node.operand(1));
  if (weights_first) w.comment += "; its first round of B read before the grid-dependency wait";
  w.call = absl::StrCat("FewRowMmaGemm<", CudaTypeName(t), ", ", CudaTypeName(d), ", ", m, ", ", n, "LL, ", k, "LL, ",
                        g.warps, ", ", g.unroll, ", ", g.slices, ", ", has_c ? "true" : "false", ", ",
                        weights_first ? "true" : "false", ">::Run(out, a, b, ", has_c ? "c" : "nullptr", ", ",
                        FloatLiteral(alpha), ", ", FloatLiteral(has_c ? beta : 0.0), ", ",
                        g.slices > 1 ? "partials, g_slices_done" : "nullptr, nullptr", ")");
  LoweredNode lowered = composite::Kernels({composite::Emit(node, KernelName(node), w, blocks, g.warps * 32)});
  lowered.kernels[0].shared_bytes = static_cast<uint32_t>(g.shared_bytes);
  lowered.kernels[0].launches_dependents_itself = true;  // after its loop (kernels/few_row_gemm.cuh)
  lowered.kernels[0].waits_itself = weights_first;
  lowered.scratch_bytes = g.scratch_bytes;
  lowered.label = "few-row gemm";
  return lowered;
}

}  // namespace kiln::codegen
