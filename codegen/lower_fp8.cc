// Lowering of delayed scaling's ops to the templates of kernels/fp8.cuh:
//   fp8_quantize      one kernel: Fp8Quantize (a grid-stride loop), or with q_t
//                     Fp8QuantizeTransposed (128 x 128 tiles); its last block writes amax and
//                     scale_inv, and with update_state the next state in place of the state
//   fp8_dequantize    Fp8Dequantize (a grid-stride loop)
//   fp8_scale_update  Fp8ScaleUpdate (one block)
// For example, %q = fp8_quantize(%x, %s) {out_dtype=f8e4m3, transposed=1, update_state=1,
// margin=0} of bf16[4096, 2048]:
//   k_q_fp8_quantize        512 blocks of 256 threads (32 x 16 tiles), 8 elements per load
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/composite_lowerings.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/fp8_scaling.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {
namespace {

// kernels/fp8.cuh's tile (kFp8Tile x kFp8Tile elements, kFp8TileThreads threads).
constexpr int64_t kTile = 128;
constexpr int kTileThreads = 256;
// Grid-stride kernels: enough blocks to fill the target's SMs several times over; past
// that, each thread loops instead of the grid growing.
constexpr int64_t kGridStrideBlocksPerSm = 16;
// The elements of one chunk of the grid-stride kernels: 16 bytes of fp8.
constexpr int64_t kChunk = 16;

// The largest power of two <= `most` that divides n (n > 0).
int PowerOfTwoDividing(int64_t n, int most) {
  int v = 1;
  while (v < most && n % (2 * v) == 0) v *= 2;
  return v;
}

int64_t GridStrideBlocks(int64_t n, int threads, const CodegenOptions& options) {
  return std::clamp<int64_t>(CeilDiv(n / kChunk, threads), 1, kGridStrideBlocksPerSm * options.target.sm_count);
}

}  // namespace

absl::StatusOr<LoweredNode> LowerFp8Quantize(const Node& node, const CodegenOptions& options) {
  const TensorType& x = node.operand(0)->type();
  const DType q = node.result_type(0).dtype;
  ASSIGN_OR_RETURN(const Fp8QuantizeResults layout, Fp8QuantizeResultsOf(node.attrs()));
  const int64_t n = x.num_elements();
  const int64_t state_n = node.operand(1)->type().num_elements();
  const std::string tq = CudaTypeName(q), tx = CudaTypeName(x.dtype);

  Wrapper wrapper;
  wrapper.header = "fp8";
  wrapper.outputs = {absl::StrCat(tq, "* q"), "float* amax", "float* scale_inv"};
  if (layout.transposed()) wrapper.outputs.push_back(absl::StrCat(tq, "* q_t"));
  if (layout.updates_state()) wrapper.outputs.push_back("float* next_state");
  wrapper.params = {Param(x.dtype, "x"), Param(DType::kF32, "state")};
  wrapper.globals =
      "// The blocks' atomic max of |x| (a float's bits) and the count of finished blocks: zero at\n"
      "// load; the last block reads them and sets them back to zero for the next launch.\n"
      "static __device__ unsigned int g_amax_bits = 0;\n"
      "static __device__ unsigned int g_blocks_done = 0;\n\n";
  const std::string finish = absl::StrCat(
      "kiln::kernels::Fp8QuantizeFinish{amax, scale_inv, ", layout.updates_state() ? "next_state" : "nullptr",
      ", &g_amax_bits, &g_blocks_done, ", FloatLiteral(Fp8MaxFinite(q)), ", ", layout.margin, "}");
  const std::string update =
      layout.updates_state() ? absl::StrCat("; the last block updates the state (margin ", layout.margin, ")") : "";
  const std::string name = codegen::KernelName(node);
  LoweredNode lowered;
  // A transposing quantize of no element launches the grid-stride form's one block, which
  // writes amax (0), scale_inv and the next state.
  if (!layout.transposed() || n == 0) {
    const int threads = options.threads_per_block;
    const int64_t blocks = GridStrideBlocks(n, threads, options);
    wrapper.comment = absl::StrCat("q and amax of ", Count(n, "element"), ", ", kChunk,
                                   " per access, grid-stride over ", Count(blocks, "block"), update);
    wrapper.call = absl::StrCat("Fp8Quantize<", tx, ", ", tq, ", ", n, "LL, ", threads, ", ", state_n,
                                "LL>(q, x, state, ", finish, ")");
    lowered = Kernels({Emit(node, name, wrapper, blocks, threads)});
  } else {
    const Rows rows = RowsOf(x);
    const int in_vec = PowerOfTwoDividing(rows.length, 16 / DTypeBytes(x.dtype));
    const int out_vec = PowerOfTwoDividing(rows.count, 16);
    const int64_t tile_rows = CeilDiv(rows.count, kTile), tile_cols = CeilDiv(rows.length, kTile);
    const int64_t blocks = tile_rows * tile_cols;
    RETURN_IF_ERROR(CheckGrid(node, blocks));
    wrapper.comment = absl::StrCat("q, q_t and amax of ", Count(rows.count, "row"), " of ", rows.length, ", ",
                                   Count(blocks, "tile"), " of ", kTile, " x ", kTile, " (", tile_rows, " x ",
                                   tile_cols, "), ", Count(in_vec, "element"), " per load, q_t in ", out_vec,
                                   "-byte pieces", update);
    wrapper.call = absl::StrCat("Fp8QuantizeTransposed<", tx, ", ", tq, ", ", rows.count, "LL, ", rows.length, "LL, ",
                                in_vec, ", ", out_vec, ", ", state_n, "LL>(q, q_t, x, state, ", finish, ")");
    lowered = Kernels({Emit(node, name, wrapper, blocks, kTileThreads)});
  }
  if (layout.updates_state()) {
    // The next state may take the state's buffer (the donated parameter: no copy at the
    // finish): the last block reads the whole state before writing it, and every other block
    // read its scale before counting itself finished (kernels/fp8.cuh).
    lowered.elementwise_in_place = true;
    lowered.in_place_operand_of_results.assign(node.num_results(), -1);
    lowered.in_place_operand_of_results[layout.next_state] = 1;
  }
  return lowered;
}

absl::StatusOr<LoweredNode> LowerFp8Dequantize(const Node& node, const CodegenOptions& options) {
  const DType q = node.operand(0)->type().dtype, out = node.type().dtype;
  const int64_t n = node.type().num_elements();
  if (n == 0) return Kernels({});
  const int threads = options.threads_per_block;
  const int64_t blocks = GridStrideBlocks(n, threads, options);
  Wrapper wrapper;
  wrapper.header = "fp8";
  wrapper.comment =
      absl::StrCat(Count(n, "element"), ", ", kChunk, " per access, grid-stride over ", Count(blocks, "block"));
  wrapper.params = {Param(q, "q"), Param(DType::kF32, "scale_inv")};
  wrapper.call = absl::StrCat("Fp8Dequantize<", CudaTypeName(q), ", ", CudaTypeName(out), ", ", n, "LL, ", threads,
                              ">(out, q, scale_inv)");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, blocks, threads)});
}

absl::StatusOr<LoweredNode> LowerFp8ScaleUpdate(const Node& node, const CodegenOptions&) {
  ASSIGN_OR_RETURN(DType format, node.attrs().GetDType("fp8_format"));
  ASSIGN_OR_RETURN(int64_t margin, node.attrs().GetInt("margin"));
  const int64_t n = node.type().num_elements();
  // One block: the history is a few dozen floats (up to a few thousand: several per thread).
  const int threads = static_cast<int>(std::min<int64_t>(256, RoundUp(n, kWarpSize)));
  Wrapper wrapper;
  wrapper.header = "fp8";
  wrapper.comment = absl::StrCat("the next state of ", Count(n - kFp8StateHeader, "amax"), " of history, one block");
  wrapper.params = {Param(DType::kF32, "state"), Param(DType::kF32, "amax")};
  wrapper.call = absl::StrCat("Fp8ScaleUpdate<", n, "LL, ", threads, ">(out, state, amax, ",
                              FloatLiteral(Fp8MaxFinite(format)), ", ", margin, ")");
  LoweredNode lowered = Kernels({Emit(node, codegen::KernelName(node), wrapper, 1, threads)});
  // The one block reads the whole state before its first write (kernels/fp8.cuh), so the
  // next state may take the donated state's buffer: no copy back at the end of the step.
  lowered.in_place_operand = 0;
  return lowered;
}

}  // namespace kiln::codegen::composite
