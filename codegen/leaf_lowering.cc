// constant and iota. A constant's values are rounded to its dtype on the host, exactly as
// the reference rounds them (ir/numerics.h), and written into the source as the
// dtype's bit patterns, so the GPU holds the very same bits (NaN payloads and -0 included):
//
//   splat:  every thread stores 16-byte vectors of the one pattern
//   dense:  __device__ const unsigned int kValues[4] = {0x3f800000u, ...}; copied out
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codegen/kernel_source.h"
#include "codegen/lowerings.h"
#include "ir/status_macros.h"
#include "ir/numerics.h"

namespace kiln::codegen {
namespace {

// The unsigned integer type as wide as one element of `t`.
const char* BitsTypeName(DType t) {
  switch (DTypeBytes(t)) {
    case 1:
      return "unsigned char";
    case 2:
      return "unsigned short";
    case 4:
      return "unsigned int";
    default:
      return "unsigned long long";
  }
}

// The bits of `v` stored as `t`, rounded once like the reference.
uint64_t BitsOf(double v, DType t) {
  const double r = RoundToDType(v, t);
  switch (t) {
    case DType::kF32:
      return std::bit_cast<uint32_t>(static_cast<float>(r));
    case DType::kF16:
      return FloatToF16Bits(static_cast<float>(r));  // r is an f16 value: exact as a float
    case DType::kBF16:
      return FloatToBF16Bits(static_cast<float>(r));
    case DType::kF8E4M3:
      return FloatToF8E4M3Bits(static_cast<float>(r));
    case DType::kF8E5M2:
      return FloatToF8E5M2Bits(static_cast<float>(r));
    case DType::kI32:
      return static_cast<uint32_t>(static_cast<int32_t>(r));
    case DType::kI64:
      return static_cast<uint64_t>(static_cast<int64_t>(r));
    case DType::kPred:
      return r != 0 ? 1 : 0;
  }
  return 0;
}

std::string BitsLiteral(uint64_t bits, DType t) {
  return absl::StrFormat("0x%0*x%s", 2 * DTypeBytes(t), bits, DTypeBytes(t) == 8 ? "ull" : "u");
}

LoweredNode OneKernel(std::string name, std::string source, std::array<uint32_t, 3> grid, int threads) {
  LoweredNode lowered{LoweringKind::kKernels, {}};
  lowered.kernels.push_back(MakeKernel(std::move(name), std::move(source), grid,
                                       {static_cast<uint32_t>(threads), 1, 1}));
  return lowered;
}

}  // namespace

absl::StatusOr<LoweredNode> LowerConstant(const Node& node, const CodegenOptions& options) {
  const DType dtype = node.type().dtype;
  const int64_t count = node.type().num_elements();
  const bool dense = node.attrs().Has("values");
  std::vector<double> values;
  if (dense) {
    ASSIGN_OR_RETURN(values, node.attrs().GetFloats("values"));
    if (static_cast<int64_t>(values.size()) != count) {
      return absl::InvalidArgumentError(absl::StrCat("%", node.name(), ": constant has ", values.size(),
                                                     " values for ", node.type().ToString()));
    }
  } else {
    ASSIGN_OR_RETURN(double value, node.attrs().GetFloat("value"));
    values.push_back(value);
  }
  if (count == 0) return LoweredNode{LoweringKind::kKernels, {}};

  const std::string name = KernelName(node);
  const std::string type = CudaTypeName(dtype);
  const std::string bits_type = BitsTypeName(dtype);
  const int threads = options.threads_per_block;
  std::string source = SourceOpening(node, {dtype});
  if (!dense) {
    const int width = VectorWidth(DTypeBytes(dtype), {count});
    const std::array<uint32_t, 3> grid = GridFor(count / width, threads, options.target);
    absl::StrAppendFormat(&source,
                          "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out) {\n"
                          "  typedef %s Index;\n"
                          "  kiln::Vec<%s, %d> r;\n"
                          "#pragma unroll\n"
                          "  for (int j = 0; j < %d; ++j) r.v[j] = %s;  // %s\n"
                          "  for (Index v = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; v < %d;\n"
                          "       v += static_cast<Index>(gridDim.x) * blockDim.x) {\n"
                          "    kiln::StoreVec<%d>(reinterpret_cast<%s*>(out), v, r);\n"
                          "  }\n"
                          "}\n",
                          threads, name, type, IndexTypeFor(count / width + int64_t{grid[0]} * threads), bits_type,
                          width, width, BitsLiteral(BitsOf(values[0], dtype), dtype),
                          FormatDouble(RoundToDType(values[0], dtype)), count / width, width, bits_type);
    return OneKernel(name, std::move(source), grid, threads);
  }
  std::string literals;
  for (int64_t i = 0; i < count; ++i) {
    absl::StrAppend(&literals, i % 8 == 0 ? "\n    " : " ", BitsLiteral(BitsOf(values[i], dtype), dtype), ",");
  }
  const std::array<uint32_t, 3> grid = GridFor(count, threads, options.target);
  absl::StrAppendFormat(&source,
                        "__device__ const %s kValues[%d] = {%s\n};\n\n"
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out) {\n"
                        "  typedef %s Index;\n"
                        "  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < %d;\n"
                        "       i += static_cast<Index>(gridDim.x) * blockDim.x) {\n"
                        "    reinterpret_cast<%s*>(out)[i] = kValues[i];\n"
                        "  }\n"
                        "}\n",
                        bits_type, count, literals, threads, name, type,
                        IndexTypeFor(count + int64_t{grid[0]} * threads), count, bits_type);
  return OneKernel(name, std::move(source), grid, threads);
}

absl::StatusOr<std::string> SplatStorageExpression(const Node& constant) {
  ASSIGN_OR_RETURN(double value, constant.attrs().GetFloat("value"));
  const DType t = constant.type().dtype;
  const std::string bits = BitsLiteral(BitsOf(value, t), t);
  switch (t) {
    case DType::kF32:
      return absl::StrCat("__uint_as_float(", bits, ")");
    case DType::kBF16:
      return absl::StrCat("__ushort_as_bfloat16(static_cast<unsigned short>(", bits, "))");
    case DType::kF16:
      return absl::StrCat("__ushort_as_half(static_cast<unsigned short>(", bits, "))");
    case DType::kI32:
      return absl::StrCat("static_cast<int>(", bits, ")");
    case DType::kI64:
      return absl::StrCat("static_cast<long long>(", bits, ")");
    case DType::kPred:
      return std::string(BitsOf(value, t) ? "true" : "false");
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      break;
  }
  return absl::UnimplementedError(absl::StrCat("%", constant.name(), ": no fused literal for ", DTypeName(t)));
}

absl::StatusOr<LoweredNode> LowerIota(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(int64_t dim, node.attrs().GetInt("dim"));
  const TensorType& t = node.type();
  const int64_t count = t.num_elements();
  if (count == 0) return LoweredNode{LoweringKind::kKernels, {}};
  const std::string name = KernelName(node);
  const std::string type = CudaTypeName(t.dtype);
  const int threads = options.threads_per_block;
  const std::array<uint32_t, 3> grid = GridFor(count, threads, options.target);
  std::string source = SourceOpening(node, {t.dtype});
  // The index along `dim` of element i is (i / inner) % dims[dim]; it rounds into the dtype
  // from a double, like the reference (bf16 holds integers exactly only up to 256).
  absl::StrAppendFormat(&source,
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* out) {\n"
                        "  typedef %s Index;\n"
                        "  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < %d;\n"
                        "       i += static_cast<Index>(gridDim.x) * blockDim.x) {\n"
                        "    out[i] = kiln::Round<%s>::From(static_cast<double>((i / %d) %% %d));\n"
                        "  }\n"
                        "}\n",
                        threads, name, type, IndexTypeFor(count + int64_t{grid[0]} * threads), count, type,
                        RowMajorStrides(t.dims)[dim], t.dims[dim]);
  return OneKernel(name, std::move(source), grid, threads);
}

}  // namespace kiln::codegen
