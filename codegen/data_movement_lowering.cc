// broadcast, transpose, slice: one thread per output element (or per 16-byte vector of
// them) computes its source index from compile-time dims and strides:
//
//   rest = v; src = kBase;
//   src += (rest % 768) * 1; rest /= 768;     // innermost dim first
//   src += rest * 0;                           // a broadcast dim: stride 0
//
// Adjacent dims that are contiguous in the source merge first, and dims of size 1 drop, so
// a row broadcast [768] -> [16384,768] is two dims, and copies of whole rows run as vectors.
// concatenate: each output vector comes from the operand whose run along the concatenated
// dim it falls in.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codegen/kernel_source.h"
#include "codegen/lowerings.h"
#include "ir/status_macros.h"

namespace kiln::codegen {
namespace {

// out[i] = in[base + sum_d index_d(i) * strides[d]], i running row-major over dims.
struct StridedLayout {
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
  int64_t base = 0;
};

absl::StatusOr<StridedLayout> LayoutOf(const Node& node) {
  const TensorType& x = node.operand(0)->type();
  const std::vector<int64_t> x_strides = RowMajorStrides(x.dims);
  StridedLayout layout{node.type().dims, std::vector<int64_t>(node.type().rank(), 0), 0};
  switch (node.opcode()) {
    case Opcode::kBroadcast: {
      ASSIGN_OR_RETURN(std::vector<int64_t> dims, node.attrs().GetInts("dims"));
      // Result dims no operand dim maps to, and operand dims of size 1, repeat: stride 0.
      for (size_t i = 0; i < dims.size(); ++i) {
        if (x.dims[i] != 1) layout.strides[dims[i]] = x_strides[i];
      }
      return layout;
    }
    case Opcode::kTranspose: {
      ASSIGN_OR_RETURN(std::vector<int64_t> perm, node.attrs().GetInts("perm"));
      for (size_t i = 0; i < perm.size(); ++i) layout.strides[i] = x_strides[perm[i]];
      return layout;
    }
    case Opcode::kSlice: {
      ASSIGN_OR_RETURN(std::vector<int64_t> start, node.attrs().GetInts("start"));
      ASSIGN_OR_RETURN(std::vector<int64_t> stride, node.attrs().GetInts("stride"));
      for (size_t d = 0; d < start.size(); ++d) {
        layout.base += start[d] * x_strides[d];
        layout.strides[d] = stride[d] * x_strides[d];
      }
      return layout;
    }
    default:
      break;
  }
  return absl::InternalError(absl::StrCat("%", node.name(), ": ", node.op_name(), " is not a strided copy"));
}

// Drops dims of size 1 and merges dim d into d+1 when d steps over exactly one run of d+1
// in the source (stride[d] == stride[d+1] * dims[d+1]; broadcast dims merge too, 0 == 0).
StridedLayout Collapse(const StridedLayout& in) {
  StridedLayout out{{}, {}, in.base};
  for (size_t d = 0; d < in.dims.size(); ++d) {
    if (in.dims[d] == 1) continue;
    if (!out.dims.empty() && out.strides.back() == in.strides[d] * in.dims[d]) {
      out.dims.back() *= in.dims[d];
      out.strides.back() = in.strides[d];
    } else {
      out.dims.push_back(in.dims[d]);
      out.strides.push_back(in.strides[d]);
    }
  }
  return out;
}

// Elements per thread: a vector along the innermost dim when it is contiguous in the
// source (and every vector starts aligned) or repeats one source element (stride 0).
int StridedVectorWidth(const StridedLayout& layout, int dtype_bytes) {
  if (layout.dims.empty()) return 1;
  const int64_t inner_stride = layout.strides.back();
  if (inner_stride == 0) return VectorWidth(dtype_bytes, {layout.dims.back()});
  if (inner_stride != 1) return 1;
  std::vector<int64_t> multiples = layout.strides;
  multiples.back() = layout.dims.back();
  multiples.push_back(layout.base);
  return VectorWidth(dtype_bytes, multiples);
}

}  // namespace

absl::StatusOr<LoweredNode> LowerStridedCopy(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(StridedLayout full, LayoutOf(node));
  const int64_t count = node.type().num_elements();
  if (count == 0) return LoweredNode{LoweringKind::kKernels, {}};
  const StridedLayout layout = Collapse(full);
  const DType dtype = node.type().dtype;
  const std::string type = CudaTypeName(dtype);
  const int width = StridedVectorWidth(layout, DTypeBytes(dtype));
  const int threads = options.threads_per_block;
  const std::array<uint32_t, 3> grid = GridFor(count / width, threads, options.target);
  const int64_t bound =
      std::max(count, node.operand(0)->type().num_elements()) + int64_t{grid[0]} * threads;

  // Source offset of vector v, innermost dim first; dims counted in vectors.
  std::string index = absl::StrFormat("    Index rest = v;\n    Index src = %d;\n", layout.base);
  const int rank = static_cast<int>(layout.dims.size());
  for (int d = rank - 1; d >= 0; --d) {
    const bool inner = d == rank - 1;
    const int64_t dim = inner ? layout.dims[d] / width : layout.dims[d];
    const int64_t stride = inner ? layout.strides[d] * width : layout.strides[d];
    if (dim == 1) continue;  // an innermost dim of one vector adds nothing
    if (d == 0) {
      if (stride != 0) absl::StrAppendFormat(&index, "    src += rest * %d;\n", stride);
    } else {
      if (stride != 0) absl::StrAppendFormat(&index, "    src += (rest %% %d) * %d;\n", dim, stride);
      absl::StrAppendFormat(&index, "    rest /= %d;\n", dim);
    }
  }
  std::string copy;
  if (width == 1) {
    copy = "    out[v] = in[src];\n";
  } else if (layout.strides.back() == 1) {
    copy = absl::StrFormat("    kiln::StoreVec<%d>(out, v, kiln::LoadVec<%d>(in + src, 0));\n", width, width);
  } else {
    copy = absl::StrFormat(
        "    const %s x = in[src];\n    kiln::Vec<%s, %d> r;\n#pragma unroll\n"
        "    for (int j = 0; j < %d; ++j) r.v[j] = x;\n    kiln::StoreVec<%d>(out, v, r);\n",
        type, type, width, width, width);
  }
  const std::string name = KernelName(node);
  std::string source = SourceOpening(node, {dtype});
  absl::StrAppendFormat(&source,
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out, const %s* in) {\n"
                        "  typedef %s Index;\n"
                        "  constexpr Index kVectors = %d;  // %d elements, %d per thread\n"
                        "  for (Index v = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; v < kVectors;\n"
                        "       v += static_cast<Index>(gridDim.x) * blockDim.x) {\n"
                        "%s%s"
                        "  }\n"
                        "}\n",
                        threads, name, type, type, IndexTypeFor(bound), count / width, count, width, index, copy);
  LoweredNode lowered{LoweringKind::kKernels, {}};
  lowered.kernels.push_back(MakeKernel(name, std::move(source), grid, {static_cast<uint32_t>(threads), 1, 1}));
  return lowered;
}

absl::StatusOr<LoweredNode> LowerConcatenate(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(int64_t dim, node.attrs().GetInt("dim"));
  const int64_t count = node.type().num_elements();
  if (count == 0) return LoweredNode{LoweringKind::kKernels, {}};
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= node.type().dims[d];
  // Per outer index, operand k contributes one contiguous run of runs[k] elements.
  std::vector<int64_t> runs;
  for (const Node* x : node.operands()) runs.push_back(x->type().num_elements() / outer);
  const DType dtype = node.type().dtype;
  const std::string type = CudaTypeName(dtype);
  const int width = VectorWidth(DTypeBytes(dtype), runs);
  const int threads = options.threads_per_block;
  const std::array<uint32_t, 3> grid = GridFor(count / width, threads, options.target);

  std::string params = absl::StrCat(type, "* out");
  // if (r < R0) x = in0[...]; else if ((r -= R0) < R1) x = in1[...]; ...
  std::string pick;
  int64_t previous_run = -1;
  for (int k = 0; k < node.num_operands(); ++k) {
    absl::StrAppend(&params, ", const ", type, "* in", k);
    const int64_t run = runs[k] / width;
    if (run == 0) continue;  // an empty operand contributes nothing
    const std::string test = previous_run < 0 ? "if (r < " : absl::StrFormat("else if ((r -= %d) < ", previous_run);
    absl::StrAppendFormat(&pick, "    %s%d) x = kiln::LoadVec<%d>(in%d, o * %d + r);\n", test, run, width, k, run);
    previous_run = run;
  }
  const std::string name = KernelName(node);
  std::string source = SourceOpening(node, {dtype});
  absl::StrAppendFormat(&source,
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n"
                        "  typedef %s Index;\n"
                        "  constexpr Index kVectors = %d;  // %d elements, %d per thread\n"
                        "  constexpr Index kRun = %d;  // vectors per outer index\n"
                        "  for (Index v = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; v < kVectors;\n"
                        "       v += static_cast<Index>(gridDim.x) * blockDim.x) {\n"
                        "    const Index o = v / kRun;\n"
                        "    Index r = v - o * kRun;\n"
                        "    kiln::Vec<%s, %d> x;\n"
                        "%s"
                        "    kiln::StoreVec<%d>(out, v, x);\n"
                        "  }\n"
                        "}\n",
                        threads, name, params, IndexTypeFor(count + int64_t{grid[0]} * threads), count / width,
                        count, width, count / outer / width, type, width, pick, width);
  LoweredNode lowered{LoweringKind::kKernels, {}};
  lowered.kernels.push_back(MakeKernel(name, std::move(source), grid, {static_cast<uint32_t>(threads), 1, 1}));
  return lowered;
}

}  // namespace kiln::codegen
