// Each composite node becomes a small translation unit: the kernels/ header of its family
// and an extern "C" __global__ wrapper that instantiates the family's template with the
// node's shapes, dtypes, attributes and the launch geometry chosen here. For example
//
//   // k_h_rms_norm: node %h of @forward
//   // %h = rms_norm(%x, %w) {eps=1e-05} : bf16[4096,768]
//   // 4096 rows of 768, 8 elements per access, a warp per row, 8 rows per block
//   #include "kernels/rms_norm.cuh"
//
//   extern "C" __global__ void __launch_bounds__(256) k_h_rms_norm(
//       __nv_bfloat16* out, const __nv_bfloat16* x, const float* w) {
//     kiln::kernels::RmsNormForward<__nv_bfloat16, float, __nv_bfloat16, 4096LL, 768, 8, 32, 8>(
//         out, x, w, 0x1.4f8b58p-17f);
//   }
//
// Geometry of the row kernels (norms, softmax, cross-entropy): a thread keeps at most
// kRowElementsPerThread elements of each row it caches in registers. A row short enough for
// a warp under that limit gets a warp (threads_per_block / 32 rows per block, reductions by
// shuffles only); a longer row gets a whole block, as many warps as the limit asks, up to
// 1024 threads. Past 1024 * 32 elements a row no longer fits the registers a 1024-thread
// block leaves each thread (64), nor past 1024 * 16 for kernels that cache two inputs
// (softmax_grad, rms_norm_grad_input): the excess spills to local memory, still correct.
#include "codegen/lower_composite.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "codegen/kernel_source.h"
#include "ir/shape_inference.h"
#include "ir/status_macros.h"
#include "ir/text_format.h"
#include "kernels/flash_attention.cuh"  // launch geometry only: plain C++ outside a CUDA compiler

namespace kiln {
namespace {

constexpr int kWarpSize = 32;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr int kRowElementsPerThread = 32;
// rms_norm_grad_weight: at most this many per-block partial rows for the last block to sum.
constexpr int64_t kMaxPartialBlocks = 256;
constexpr int kGradWeightMinThreads = 256;  // 8 rows' r in flight per block
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
// Grid-stride kernels (AdamW): enough blocks to fill the target's SMs several times over;
// past that, each thread loops instead of the grid growing.
constexpr int64_t kGridStrideBlocksPerSm = 16;

// Row lengths are `int` template arguments and chunk offsets are computed in int.
constexpr int64_t kMaxRowLength = int64_t{1} << 30;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t multiple) { return CeilDiv(a, multiple) * multiple; }

// What a generated wrapper needs besides the node: its family's header, module-scope
// declarations, the named parameters after `out`, and the call of the template.
struct Wrapper {
  std::string header;              // "rms_norm" for kernels/rms_norm.cuh
  std::string comment;             // geometry, in words
  std::string globals;             // module-scope declarations, may be empty
  std::vector<std::string> params; // one per operand, e.g. "const float* w"
  std::string call;                // "RmsNormForward<...>(out, x, w, eps)"
  std::string out_type;            // the output pointer's type; empty: the node's dtype
  // A multi-result node's output parameters, one per result in order (e.g. "float* lse");
  // empty for a node of one result, whose output is "T* out".
  std::vector<std::string> outputs;
};

std::string Param(DType t, absl::string_view name) { return absl::StrCat("const ", CudaTypeName(t), "* ", name); }

// A float attribute as an exact hexadecimal fp32 literal ("0x1.4f8b58p-17f"); valid C++ for
// every finite value, zero included.
std::string FloatLiteral(double v) { return absl::StrFormat("%af", static_cast<float>(v)); }
std::string DoubleLiteral(double v) { return absl::StrFormat("%a", v); }

// "1 block", "256 blocks".
std::string Count(int64_t n, absl::string_view noun) { return absl::StrCat(n, " ", noun, n == 1 ? "" : "s"); }

std::string Where(const Node& node) { return absl::StrCat(node.op_name(), " %", node.name()); }

absl::StatusOr<double> FiniteFloatAttr(const Node& node, absl::string_view name) {
  ASSIGN_OR_RETURN(double v, node.attrs().GetFloat(name));
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(node), ": attribute ", name, "=", v, " must be finite"));
  }
  return v;
}

// Elements per 16-byte access of the narrowest dtype, when `length` is a multiple of it
// (then every row of every dtype starts on a chunk boundary); else 1, the scalar path.
int ChunkWidth(int64_t length, const std::vector<DType>& dtypes) {
  int narrowest = 16;
  for (DType t : dtypes) narrowest = std::min(narrowest, DTypeBytes(t));
  const int width = 16 / narrowest;
  return length % width == 0 ? width : 1;
}

struct RowGeometry {
  int vec = 1;
  int threads_per_row = kWarpSize;
  int rows_per_block = 1;
  int64_t blocks = 0;
  int block_threads() const { return threads_per_row * rows_per_block; }
};

RowGeometry ChooseRowGeometry(int64_t rows, int64_t length, int vec, const CodegenOptions& options) {
  RowGeometry g;
  g.vec = vec;
  const int64_t chunks = CeilDiv(length, vec);
  const int64_t chunks_per_thread = std::max(1, kRowElementsPerThread / vec);
  if (chunks <= kWarpSize * chunks_per_thread) {
    g.threads_per_row = kWarpSize;
    g.rows_per_block = static_cast<int>(std::clamp<int64_t>(rows, 1, options.threads_per_block / kWarpSize));
  } else {
    g.threads_per_row = static_cast<int>(
        std::min<int64_t>(kMaxThreadsPerBlock, RoundUp(CeilDiv(chunks, chunks_per_thread), kWarpSize)));
    g.rows_per_block = 1;
  }
  g.blocks = CeilDiv(rows, g.rows_per_block);
  return g;
}

std::string RowComment(int64_t rows, int64_t length, const RowGeometry& g) {
  return absl::StrCat(Count(rows, "row"), " of ", length, ", ", Count(g.vec, "element"), " per access, ",
                      g.threads_per_row == kWarpSize
                          ? absl::StrCat("a warp per row, ", g.rows_per_block, " rows per block")
                          : absl::StrCat("a block of ", g.threads_per_row, " threads per row"));
}

// The template arguments every row kernel ends with.
std::string RowArgs(int64_t rows, int64_t length, const RowGeometry& g) {
  return absl::StrCat(rows, "LL, ", length, ", ", g.vec, ", ", g.threads_per_row, ", ", g.rows_per_block);
}

struct Rows {
  int64_t count = 0;
  int64_t length = 0;
};
Rows RowsOf(const TensorType& t) {
  const int64_t length = t.dims.back();
  return {length == 0 ? 0 : t.num_elements() / length, length};
}

absl::Status CheckRowLength(const Node& node, int64_t length) {
  if (length > kMaxRowLength) {
    return absl::InvalidArgumentError(absl::StrCat(Where(node), ": rows of ", length,
                                                   " elements exceed the kernels' limit of ", kMaxRowLength));
  }
  return absl::OkStatus();
}

absl::Status CheckGrid(const Node& node, int64_t blocks) {
  if (blocks > kMaxGridX) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(node), ": ", blocks, " blocks exceed one launch's grid (", kMaxGridX, ")"));
  }
  return absl::OkStatus();
}

KernelSpec Emit(const Node& node, const std::string& name, const Wrapper& w, int64_t blocks, int threads) {
  const std::string function = node.parent() != nullptr ? node.parent()->name() : "";
  const std::string line = absl::StrReplaceAll(PrintNode(node), {{"\n", " "}, {"\r", " "}});
  std::vector<std::string> params = w.outputs;
  if (params.empty()) {
    params.push_back(absl::StrCat(w.out_type.empty() ? CudaTypeName(node.type().dtype) : w.out_type, "* out"));
  }
  params.insert(params.end(), w.params.begin(), w.params.end());
  std::string source =
      absl::StrCat("// ", name, ": node %", node.name(), " of @", function, "\n// ", line, "\n// ", w.comment,
                   "\n#include \"kernels/", w.header, ".cuh\"\n\n", w.globals, "extern \"C\" __global__ void __launch_bounds__(",
                   threads, ") ", name, "(", absl::StrJoin(params, ", "), ") {\n  kiln::kernels::", w.call, ";\n}\n");
  return codegen::MakeKernel(name, std::move(source), {static_cast<uint32_t>(blocks), 1, 1},
                             {static_cast<uint32_t>(threads), 1, 1});
}

LoweredNode Kernels(std::vector<KernelSpec> kernels) { return LoweredNode{LoweringKind::kKernels, std::move(kernels)}; }

// ------------------------------------------------------------------------- row kernels

absl::StatusOr<LoweredNode> LowerRmsNorm(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const Rows rows = RowsOf(node.operand(0)->type());
  if (rows.count == 0 || rows.length == 0) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const DType x = node.operand(0)->type().dtype, w = node.operand(1)->type().dtype, y = node.type().dtype;
  const bool forward = node.opcode() == Opcode::kRmsNorm;
  std::vector<DType> dtypes = {x, w, y};
  if (!forward) dtypes.push_back(node.operand(2)->type().dtype);
  const RowGeometry g = ChooseRowGeometry(rows.count, rows.length, ChunkWidth(rows.length, dtypes), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  Wrapper wrapper{"rms_norm", RowComment(rows.count, rows.length, g), "", {Param(x, "x"), Param(w, "w")}, ""};
  if (forward) {
    wrapper.call = absl::StrCat("RmsNormForward<", CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(y), ", ",
                                RowArgs(rows.count, rows.length, g), ">(out, x, w, ", FloatLiteral(eps), ")");
  } else {
    const DType dy = node.operand(2)->type().dtype;
    wrapper.params.push_back(Param(dy, "dy"));
    wrapper.call = absl::StrCat("RmsNormGradInput<", CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(dy),
                                ", ", CudaTypeName(y), ", ", RowArgs(rows.count, rows.length, g),
                                ">(out, x, w, dy, ", FloatLiteral(eps), ")");
  }
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
}

// One kernel, deterministic: per-block partial column sums in a module-scope buffer, summed
// in block order by the last block (kernels/rms_norm.cuh, RmsNormGradWeight).
absl::StatusOr<LoweredNode> LowerRmsNormGradWeight(const Node& node, const CodegenOptions&) {
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const Rows rows = RowsOf(node.operand(0)->type());
  if (rows.length == 0) return Kernels({});  // dw is empty; with no rows it is zeros, computed below
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const DType x = node.operand(0)->type().dtype, w = node.operand(1)->type().dtype,
              dy = node.operand(2)->type().dtype, dw = node.type().dtype;
  const int vec = ChunkWidth(rows.length, {x, dy, dw, DType::kF32});  // f32: the partials
  const int64_t chunks = CeilDiv(rows.length, vec);
  const int threads = static_cast<int>(std::clamp<int64_t>(
      RoundUp(CeilDiv(chunks, std::max(1, kRowElementsPerThread / vec)), kWarpSize), kGradWeightMinThreads,
      kMaxThreadsPerBlock));
  const int warps = threads / kWarpSize;
  const int64_t rows_per_block = RoundUp(std::max<int64_t>(1, CeilDiv(rows.count, kMaxPartialBlocks)), warps);
  const int64_t blocks = std::max<int64_t>(1, CeilDiv(rows.count, rows_per_block));
  Wrapper wrapper;
  wrapper.header = "rms_norm";
  wrapper.comment = absl::StrCat(Count(rows.count, "row"), " of ", rows.length, ", ", Count(vec, "element"),
                                 " per access; ", Count(blocks, "block"), " of ", threads, " threads, ",
                                 rows_per_block, " rows each; the last block sums the partials");
  wrapper.globals = absl::StrCat("// Per-block column sums and the count of finished blocks (zero at load).\n",
                                 "static __device__ __align__(16) float g_partials[", blocks * rows.length, "];\n",
                                 "static __device__ unsigned int g_blocks_done = 0;\n\n");
  wrapper.params = {Param(x, "x"), Param(w, "w"), Param(dy, "dy")};  // w: unused, part of the signature
  wrapper.call = absl::StrCat("RmsNormGradWeight<", CudaTypeName(x), ", ", CudaTypeName(dy), ", ", CudaTypeName(dw),
                              ", ", rows.count, "LL, ", rows.length, ", ", vec, ", ", threads, ", ", rows_per_block,
                              ">(out, x, dy, ", FloatLiteral(eps), ", g_partials, &g_blocks_done)");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, blocks, threads)});
}

absl::StatusOr<LoweredNode> LowerSoftmax(const Node& node, const CodegenOptions& options) {
  const Rows rows = RowsOf(node.type());
  if (rows.count == 0 || rows.length == 0) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const bool forward = node.opcode() == Opcode::kSoftmax;
  std::vector<DType> dtypes = {node.type().dtype};
  for (const Node* operand : node.operands()) dtypes.push_back(operand->type().dtype);
  const RowGeometry g = ChooseRowGeometry(rows.count, rows.length, ChunkWidth(rows.length, dtypes), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  const char* out = CudaTypeName(node.type().dtype);
  const DType in = node.operand(0)->type().dtype;
  Wrapper wrapper{"softmax", RowComment(rows.count, rows.length, g), "", {}, ""};
  if (forward) {
    wrapper.params = {Param(in, "x")};
    wrapper.call = absl::StrCat("SoftmaxForward<", CudaTypeName(in), ", ", out, ", ",
                                RowArgs(rows.count, rows.length, g), ">(out, x)");
  } else {
    const DType dy = node.operand(1)->type().dtype;
    wrapper.params = {Param(in, "y"), Param(dy, "dy")};
    wrapper.call = absl::StrCat("SoftmaxBackward<", CudaTypeName(in), ", ", CudaTypeName(dy), ", ", out, ", ",
                                RowArgs(rows.count, rows.length, g), ">(out, y, dy)");
  }
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
}

absl::StatusOr<LoweredNode> LowerCrossEntropy(const Node& node, const CodegenOptions& options) {
  const TensorType& logits = node.operand(0)->type();
  const int64_t rows = logits.dims[0], classes = logits.dims[1];
  if (node.type().num_elements() == 0) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, classes));
  const bool forward = node.opcode() == Opcode::kCrossEntropy;
  const DType labels = node.operand(1)->type().dtype;
  // The loss is written one scalar per row; only the gradient's rows share the chunking.
  std::vector<DType> dtypes = {logits.dtype};
  if (!forward) dtypes.push_back(node.type().dtype);
  const RowGeometry g = ChooseRowGeometry(rows, classes, ChunkWidth(classes, dtypes), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  Wrapper wrapper{"cross_entropy",
                  RowComment(rows, classes, g),
                  "",
                  {Param(logits.dtype, "logits"), Param(labels, "labels")},
                  ""};
  if (forward) {
    wrapper.call = absl::StrCat("CrossEntropyForward<", CudaTypeName(logits.dtype), ", ", CudaTypeName(labels), ", ",
                                RowArgs(rows, classes, g), ">(out, logits, labels)");
  } else {
    wrapper.params.push_back(Param(DType::kF32, "dloss"));
    wrapper.call = absl::StrCat("CrossEntropyBackward<", CudaTypeName(logits.dtype), ", ", CudaTypeName(labels), ", ",
                                CudaTypeName(node.type().dtype), ", ", RowArgs(rows, classes, g),
                                ">(out, logits, labels, dloss)");
  }
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
}

// ----------------------------------------------------------------------- other kernels

absl::StatusOr<LoweredNode> LowerRope(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double theta, FiniteFloatAttr(node, "theta"));
  ASSIGN_OR_RETURN(int64_t inverse, node.attrs().GetInt("inverse"));
  const TensorType& x = node.operand(0)->type();
  if (x.num_elements() == 0) return Kernels({});
  const int64_t batch = x.dims[0], seq = x.dims[1], heads = x.dims[2], head_dim = x.dims[3];
  RETURN_IF_ERROR(CheckRowLength(node, std::max(heads, head_dim)));
  const int vec = ChunkWidth(head_dim / 2, {x.dtype, node.type().dtype});
  const int64_t items = batch * seq * (head_dim / 2 / vec);
  const int threads = options.threads_per_block;
  const int64_t blocks = CeilDiv(items, threads);
  RETURN_IF_ERROR(CheckGrid(node, blocks));
  Wrapper wrapper;
  wrapper.header = "rope";
  wrapper.comment =
      absl::StrCat("a thread per (b, t, ", Count(vec, "rotation pair"), "), looping over ", Count(heads, "head"));
  wrapper.params = {Param(x.dtype, "x"), Param(DType::kI32, "positions")};
  wrapper.call = absl::StrCat("Rope<", CudaTypeName(x.dtype), ", ", CudaTypeName(node.type().dtype), ", ", batch,
                              "LL, ", seq, "LL, ", heads, ", ", head_dim, ", ", vec, ", ", inverse != 0 ? "true" : "false",
                              ">(out, x, positions, ", DoubleLiteral(theta), ")");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, blocks, threads)});
}

// One grid-stride kernel writing p', m', v' in place (each may be null where that result is
// not needed); the three per-step scalars stay operands (device memory).
absl::StatusOr<LoweredNode> LowerAdamWUpdate(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double beta1, FiniteFloatAttr(node, "beta1"));
  ASSIGN_OR_RETURN(double beta2, FiniteFloatAttr(node, "beta2"));
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const int64_t n = node.result_type(0).num_elements();
  LoweredNode lowered = Kernels({});
  lowered.elementwise_in_place = true;
  if (n == 0) return lowered;
  const int vec = ChunkWidth(n, {DType::kF32});
  const int threads = options.threads_per_block;
  const int64_t blocks = std::min(CeilDiv(n / vec, threads), kGridStrideBlocksPerSm * options.target.sm_count);
  Wrapper wrapper;
  wrapper.header = "adamw";
  wrapper.comment = absl::StrCat("adamw p', m', v' at once (in place) over ", Count(n, "element"), ", ",
                                 Count(vec, "element"), " per access, grid-stride over ", Count(blocks, "block"));
  wrapper.outputs = {"float* p_new", "float* m_new", "float* v_new"};
  for (const char* name : {"p", "g", "m", "v", "step_size", "decay", "sqrt_bc2"}) {
    wrapper.params.push_back(Param(DType::kF32, name));
  }
  wrapper.call = absl::StrCat("AdamWUpdate<", n, "LL, ", vec, ">(p_new, m_new, v_new, p, g, m, v, step_size, ",
                              "decay, sqrt_bc2, ", FloatLiteral(beta1), ", ", FloatLiteral(1 - beta1), ", ",
                              FloatLiteral(beta2), ", ", FloatLiteral(1 - beta2), ", ", FloatLiteral(eps), ")");
  lowered.kernels.push_back(Emit(node, codegen::KernelName(node), wrapper, blocks, threads));
  return lowered;
}

// The widest of 16/8/4/2/1 bytes dividing `bytes`, as the type the copy moves.
struct CopyUnit {
  int bytes;
  const char* type;
};
CopyUnit CopyUnitFor(int64_t bytes) {
  static constexpr CopyUnit kUnits[] = {
      {16, "int4"}, {8, "int2"}, {4, "int"}, {2, "unsigned short"}, {1, "unsigned char"}};
  for (const CopyUnit& unit : kUnits) {
    if (bytes % unit.bytes == 0) return unit;
  }
  return kUnits[4];
}

absl::StatusOr<LoweredNode> LowerGather(const Node& node, const CodegenOptions& options) {
  const TensorType& table = node.operand(0)->type();
  const TensorType& indices = node.operand(1)->type();
  if (node.type().num_elements() == 0) return Kernels({});
  const int64_t table_rows = table.dims[0];
  const TensorType table_row{table.dtype, std::vector<int64_t>(table.dims.begin() + 1, table.dims.end())};
  const int64_t row_bytes = table_row.num_bytes();
  const CopyUnit unit = CopyUnitFor(row_bytes);
  const int64_t row_units = row_bytes / unit.bytes;
  const int threads = options.threads_per_block;
  const int64_t blocks = CeilDiv(indices.num_elements() * row_units, threads);
  RETURN_IF_ERROR(CheckGrid(node, blocks));
  Wrapper wrapper;
  wrapper.header = "embedding";
  wrapper.comment = absl::StrCat(Count(indices.num_elements(), "row"), " of ", Count(row_bytes, "byte"), ", copied ",
                                 Count(unit.bytes, "byte"), " per thread");
  wrapper.params = {absl::StrCat("const ", unit.type, "* table"), Param(indices.dtype, "indices")};
  wrapper.call = absl::StrCat("Gather<", unit.type, ", ", CudaTypeName(indices.dtype), ", ", indices.num_elements(),
                              "LL, ", table_rows, "LL, ", row_units, "LL>(out, table, indices)");
  wrapper.out_type = unit.type;  // the table's bytes, moved without conversion
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, blocks, threads)});
}

// Two kernels: zero the output, then add every update row into its row with atomics.
absl::StatusOr<LoweredNode> LowerScatterAdd(const Node& node, const CodegenOptions& options) {
  const TensorType& indices = node.operand(0)->type();
  const TensorType& updates = node.operand(1)->type();
  if (node.type().dtype != DType::kF32) {
    return absl::UnimplementedError(absl::StrCat(Where(node), ": the GPU scatter_add sums in f32 atomics only; got ",
                                                 node.type().ToString(), " (convert the updates to f32 first)"));
  }
  if (node.type().num_elements() == 0) return Kernels({});
  const int threads = options.threads_per_block;
  const int64_t out_rows = node.type().dims[0];
  const int64_t row_length = node.type().num_elements() / out_rows;
  const std::vector<std::string> params = {Param(indices.dtype, "indices"), Param(updates.dtype, "updates")};

  const CopyUnit unit = CopyUnitFor(node.type().num_bytes());
  const int64_t units = node.type().num_bytes() / unit.bytes;
  const int64_t fill_blocks = CeilDiv(units, threads);
  RETURN_IF_ERROR(CheckGrid(node, fill_blocks));
  Wrapper fill{"embedding",
               absl::StrCat("zero-fills the output before the scatter-add, ", Count(unit.bytes, "byte"), " per thread"),
               "",
               params,
               absl::StrCat("ZeroFill<", unit.type, ", ", units, "LL>(out)"),
               unit.type};
  std::vector<KernelSpec> kernels = {Emit(node, codegen::KernelName(node) + "_zero_fill", fill, fill_blocks, threads)};

  if (indices.num_elements() > 0 && row_length > 0) {
    const int vec = row_length % 4 == 0 ? 4 : 1;
    const int64_t blocks = CeilDiv(indices.num_elements() * row_length / vec, threads);
    RETURN_IF_ERROR(CheckGrid(node, blocks));
    Wrapper add{"embedding",
                absl::StrCat(Count(indices.num_elements(), "update row"), " of ", row_length, " into ", out_rows, ", ",
                             Count(vec, "float"), " per atomic"),
                "",
                params,
                absl::StrCat("ScatterAdd<", CudaTypeName(indices.dtype), ", ", indices.num_elements(), "LL, ", out_rows,
                             "LL, ", row_length, "LL, ", vec, ">(out, indices, updates)")};
    kernels.push_back(Emit(node, codegen::KernelName(node), add, blocks, threads));
  }
  return Kernels(std::move(kernels));
}

// ------------------------------------------------------------------------- attention

using kernels::FlashAttentionBackwardDeltaLaunch;
using kernels::FlashAttentionBackwardDkDvLaunch;
using kernels::FlashAttentionBackwardDqLaunch;
using kernels::FlashAttentionForwardLaunch;
using kernels::FlashAttentionLaunch;
using kernels::FlashAttentionUnsupportedReason;

// The flash kernels' geometry for this node's shapes (kernels/flash_attention.cuh).
absl::Status CheckAttentionShape(const Node& node, const TensorType& q, const TensorType& kv) {
  if (const char* why = FlashAttentionUnsupportedReason(q.dims[0], q.dims[1], kv.dims[1], q.dims[2], q.dims[3])) {
    return absl::UnimplementedError(absl::StrCat(Where(node), ": the flash attention kernels cannot take q ",
                                                 q.ToString(), ", k/v ", kv.ToString(), ": ", why));
  }
  return absl::OkStatus();
}

KernelSpec EmitFlash(const Node& node, const std::string& name, const Wrapper& w, const FlashAttentionLaunch& launch) {
  KernelSpec spec = Emit(node, name, w, launch.grid_x, static_cast<int>(launch.block_threads));
  spec.shared_bytes = launch.shared_bytes;
  return spec;
}

// attention -> (O, LSE): the forward kernel, storing the LSE it computes anyway (null when
// no backward reads it).
absl::StatusOr<LoweredNode> LowerAttention(const Node& node) {
  const TensorType& q = node.operand(0)->type();
  const TensorType& kv = node.operand(1)->type();
  RETURN_IF_ERROR(CheckAttentionShape(node, q, kv));
  ASSIGN_OR_RETURN(double scale, FiniteFloatAttr(node, "scale"));
  const int64_t b = q.dims[0], h = q.dims[1], hkv = kv.dims[1], t = q.dims[2], d = q.dims[3];
  const FlashAttentionLaunch launch = FlashAttentionForwardLaunch(b, h, t, d);
  Wrapper w;
  w.header = "flash_attention";
  w.comment = absl::StrCat("causal flash attention and its LSE, ", launch.block_m, " queries per block of ",
                           launch.block_threads, " threads, key tiles of ", launch.block_n);
  w.outputs = {"float* out", "float* lse"};
  w.params = {Param(DType::kBF16, "q"), Param(DType::kBF16, "k"), Param(DType::kBF16, "v")};
  w.call = absl::StrCat("FlashAttentionForward<float, ", b, ", ", h, ", ", hkv, ", ", t, ", ", d,
                        ">(out, lse, q, k, v, ", FloatLiteral(scale), ")");
  return Kernels({EmitFlash(node, codegen::KernelName(node), w, launch)});
}

// attention_grad -> (dq, dk, dv): the dq kernel, then the kernel writing dk and dv.
absl::StatusOr<LoweredNode> LowerAttentionGrad(const Node& node) {
  const TensorType& q = node.operand(0)->type();
  const TensorType& kv = node.operand(1)->type();
  RETURN_IF_ERROR(CheckAttentionShape(node, q, kv));
  ASSIGN_OR_RETURN(double scale, FiniteFloatAttr(node, "scale"));
  const int64_t b = q.dims[0], h = q.dims[1], hkv = kv.dims[1], t = q.dims[2], d = q.dims[3];
  const std::string shape = absl::StrCat(b, ", ", h, ", ", hkv, ", ", t, ", ", d);
  const std::string operands = "q, k, v, dout, lse, delta";
  Wrapper w;
  w.header = "flash_attention";
  w.outputs = {"float* dq", "float* dk", "float* dv"};
  w.params = {Param(DType::kBF16, "q"),    Param(DType::kBF16, "k"),   Param(DType::kBF16, "v"),
              Param(DType::kBF16, "dout"), Param(DType::kF32, "lse"), Param(DType::kF32, "delta")};

  const FlashAttentionLaunch dq_launch = FlashAttentionBackwardDqLaunch(b, h, t, d);
  w.comment = absl::StrCat("flash attention dq, ", dq_launch.block_m, " queries per block, key tiles of ",
                           dq_launch.block_n);
  w.call = absl::StrCat("FlashAttentionBackwardDq<__nv_bfloat16, float, ", shape, ">(dq, ", operands, ", ",
                        FloatLiteral(scale), ")");
  KernelSpec dq = EmitFlash(node, codegen::KernelName(node) + "_dq", w, dq_launch);

  const FlashAttentionLaunch dkdv_launch = FlashAttentionBackwardDkDvLaunch(b, hkv, t, d);
  w.comment = absl::StrCat("flash attention dk and dv, ", dkdv_launch.block_m, " keys per block, query tiles of ",
                           dkdv_launch.block_n);
  w.call = absl::StrCat("FlashAttentionBackwardDkDv<__nv_bfloat16, float, ", shape, ">(dk, dv, ", operands, ", ",
                        FloatLiteral(scale), ")");
  KernelSpec dkdv = EmitFlash(node, codegen::KernelName(node) + "_dkdv", w, dkdv_launch);
  return Kernels({std::move(dq), std::move(dkdv)});
}

absl::StatusOr<LoweredNode> LowerAttentionDelta(const Node& node, const CodegenOptions& options) {
  const TensorType& o = node.operand(0)->type();
  const TensorType& dout = node.operand(1)->type();
  const int64_t rows = o.dims[0] * o.dims[1] * o.dims[2], d = o.dims[3];
  if (d != 64 && d != 128) {
    return absl::UnimplementedError(absl::StrCat(Where(node), ": the flash delta kernel takes head dim 64 or 128, not ", d));
  }
  const FlashAttentionLaunch launch = FlashAttentionBackwardDeltaLaunch(rows, d);
  Wrapper w{"flash_attention", absl::StrCat("rowsum(bf16(dO) * O) over ", rows, " rows of ", d), "",
            {Param(o.dtype, "o"), Param(dout.dtype, "dout")},
            absl::StrCat("FlashAttentionBackwardDelta<", CudaTypeName(dout.dtype), ", float, ", rows, "LL, ", d,
                         ">(out, dout, o)")};
  return Kernels({EmitFlash(node, codegen::KernelName(node), w, launch)});
}

absl::Status CheckOptions(const Node& node, const CodegenOptions& options) {
  const int t = options.threads_per_block;
  if (t < kWarpSize || t > kMaxThreadsPerBlock || t % kWarpSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(node), ": threads_per_block ", t,
                                                   " must be a multiple of 32 in [32, 1024]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoweredNode> LowerCompositeNode(const Node& node, const CodegenOptions& options) {
  RETURN_IF_ERROR(CheckOptions(node, options));
  switch (node.opcode()) {
    case Opcode::kRmsNorm:
    case Opcode::kRmsNormGradInput:
      return LowerRmsNorm(node, options);
    case Opcode::kRmsNormGradWeight:
      return LowerRmsNormGradWeight(node, options);
    case Opcode::kSoftmax:
    case Opcode::kSoftmaxGrad:
      return LowerSoftmax(node, options);
    case Opcode::kCrossEntropy:
    case Opcode::kCrossEntropyGrad:
      return LowerCrossEntropy(node, options);
    case Opcode::kRope:
      return LowerRope(node, options);
    case Opcode::kAdamWUpdate:
      return LowerAdamWUpdate(node, options);
    case Opcode::kGather:
      return LowerGather(node, options);
    case Opcode::kScatterAdd:
      return LowerScatterAdd(node, options);
    case Opcode::kAttention:
      return LowerAttention(node);
    case Opcode::kAttentionGrad:
      return LowerAttentionGrad(node);
    case Opcode::kAttentionDelta:
      return LowerAttentionDelta(node, options);
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(Where(node), " is not a composite op: LowerNode lowers it elsewhere"));
}

}  // namespace kiln
