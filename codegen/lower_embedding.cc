// Lowering of gather and scatter_add (the embedding and its gradient) to the templates of
// kernels/embedding.cuh.
#include "codegen/composite_lowerings.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {
namespace {

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

}  // namespace

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

}  // namespace kiln::codegen::composite
