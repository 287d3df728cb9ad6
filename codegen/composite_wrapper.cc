// The generated wrapper, its literals and checks, and the row kernels' geometry, shared by
// the composite lowerings (codegen/composite_wrapper.h).
#include "codegen/composite_wrapper.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"
#include "ir/text_format.h"

namespace kiln::codegen::composite {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t multiple) { return CeilDiv(a, multiple) * multiple; }

std::string Param(DType t, absl::string_view name) { return absl::StrCat("const ", CudaTypeName(t), "* ", name); }

std::string FloatLiteral(double v) { return absl::StrFormat("%af", static_cast<float>(v)); }
std::string DoubleLiteral(double v) { return absl::StrFormat("%a", v); }

std::string Count(int64_t n, absl::string_view noun) { return absl::StrCat(n, " ", noun, n == 1 ? "" : "s"); }

std::string Where(const Node& node) { return absl::StrCat(node.op_name(), " %", node.name()); }

bool IsStepInvariant(const Node& value) {
  if (value.opcode() != Opcode::kParameter) return false;
  const Function* f = value.parent();
  if (f == nullptr || f->owner() != nullptr) return false;  // a fusion body's parameter is any value
  const absl::StatusOr<int64_t> index = value.attrs().GetInt("index");
  if (!index.ok()) return false;
  for (const int64_t aliased : f->output_aliases()) {
    if (aliased == *index) return false;
  }
  return true;
}

bool EarlyReadsAllowed(const CodegenOptions& options) {
  return options.programmatic_dependent_launch && options.reads_before_wait && options.target.compute_capability >= 90;
}

absl::StatusOr<double> FiniteFloatAttr(const Node& node, absl::string_view name) {
  ASSIGN_OR_RETURN(double v, node.attrs().GetFloat(name));
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(node), ": attribute ", name, "=", v, " must be finite"));
  }
  return v;
}

int ChunkWidth(int64_t length, const std::vector<DType>& dtypes) {
  int narrowest = 16;
  for (DType t : dtypes) narrowest = std::min(narrowest, DTypeBytes(t));
  const int width = 16 / narrowest;
  return length % width == 0 ? width : 1;
}

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

std::string RowArgs(int64_t rows, int64_t length, const RowGeometry& g) {
  return absl::StrCat(rows, "LL, ", length, ", ", g.vec, ", ", g.threads_per_row, ", ", g.rows_per_block);
}

bool WritesWeightGrad(const Node& node) {
  return node.attrs().Has("weight_grad") && node.attrs().GetInt("weight_grad").value_or(0) == 1;
}

WeightGradGeometry ChooseWeightGradGeometry(const RowGeometry& g, const CodegenOptions& options) {
  const int64_t per_sm = std::max<int64_t>(1, kWeightGradThreadsPerSm / g.block_threads());
  const int64_t target = std::clamp<int64_t>(options.target.sm_count * per_sm, 1, kMaxWeightGradPartials);
  WeightGradGeometry w;
  w.row_groups = CeilDiv(std::max<int64_t>(1, g.blocks), target);
  w.blocks = std::max<int64_t>(1, CeilDiv(g.blocks, w.row_groups));
  return w;
}

absl::StatusOr<LoweredNode> LowerNormGradInputAndWeight(const Node& node, const CodegenOptions& options,
                                                        const RowGeometry& g, const NormFamily& family) {
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  // The residual forms (add_*_norm_grad_input) take dres first.
  const bool residual = node.opcode() == Opcode::kAddRmsNormGradInput || node.opcode() == Opcode::kAddLayerNormGradInput;
  const int x_at = residual ? 1 : 0;
  const Rows rows = RowsOf(node.operand(x_at)->type());
  const DType x = node.operand(x_at)->type().dtype, w = node.operand(x_at + 1)->type().dtype,
              dy = node.operand(x_at + 2)->type().dtype, dx = node.result_type(0).dtype;
  const int64_t grads = static_cast<int64_t>(family.weight_grads.size());
  const bool copy = node.num_results() == 2 + grads;  // dx, [copy,] the weight gradients
  const DType dw = node.result_types().back().dtype;
  const DType dres = residual ? node.operand(0)->type().dtype : DType::kF32;
  const DType copy_type = copy ? node.result_type(1).dtype : dx;
  const WeightGradGeometry wg = ChooseWeightGradGeometry(g, options);

  Wrapper wrapper{family.header, "", "", {}, ""};
  wrapper.outputs = {absl::StrCat(CudaTypeName(dx), "* dx")};
  if (copy) wrapper.outputs.push_back(absl::StrCat(CudaTypeName(copy_type), "* dx_copy"));
  for (const std::string& grad : family.weight_grads) wrapper.outputs.push_back(absl::StrCat(CudaTypeName(dw), "* ", grad));
  if (residual) wrapper.params.push_back(Param(dres, "dres"));
  wrapper.params.insert(wrapper.params.end(), {Param(x, "x"), Param(w, "w"), Param(dy, "dy")});
  wrapper.params.push_back("float* __restrict__ partials");  // the scratch: wg.blocks x grads D floats

  Wrapper stage1 = wrapper;
  stage1.comment = absl::StrCat(
      RowComment(rows.count, rows.length, g), "; ", Count(wg.blocks, "block"), " of ", Count(wg.row_groups, "row group"),
      " each, summing ",
      absl::StrJoin(family.weight_grads, " and ", [](std::string* out, const std::string& grad) { absl::StrAppend(out, grad, "'s"); }),
      " partial rows",
      residual ? (copy ? "; adds the residual gradient and writes a copy of dx" : "; adds the residual gradient") : "");
  stage1.call = absl::StrCat(
      family.templates, "GradInputAndWeight<", CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(dy), ", ",
      CudaTypeName(dx), ", ", RowArgs(rows.count, rows.length, g), ", ", wg.row_groups, ", ", CudaTypeName(dres), ", ",
      CudaTypeName(copy_type), ">(dx, x, w, dy, ", FloatLiteral(eps), ", ", residual ? "dres" : "nullptr", ", ",
      copy ? "dx_copy" : "nullptr", ", partials)");

  Wrapper stage2 = wrapper;
  const int64_t columns = grads * rows.length;
  const int64_t fold_blocks = CeilDiv(columns, kWarpSize);
  stage2.comment = absl::StrCat(absl::StrJoin(family.weight_grads, " and "), ": ", Count(columns, "column"),
                                " each the sum of ", Count(wg.blocks, "partial row"), ", in block order within ",
                                kWeightGradFoldThreads / kWarpSize, " groups, then group order");
  stage2.call = absl::StrCat(family.templates, "WeightGradFold<", CudaTypeName(dw), ", ", rows.length, ", ", wg.blocks,
                             ", ", kWeightGradFoldThreads, ">(", absl::StrJoin(family.weight_grads, ", "),
                             ", partials)");

  const std::string name = codegen::KernelName(node);
  LoweredNode lowered = Kernels({Emit(node, name, stage1, wg.blocks, g.block_threads()),
                                 Emit(node, absl::StrCat(name, "_fold"), stage2, fold_blocks, kWeightGradFoldThreads)});
  lowered.scratch_bytes = wg.blocks * columns * static_cast<int64_t>(sizeof(float));
  return lowered;
}

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

}  // namespace kiln::codegen::composite
