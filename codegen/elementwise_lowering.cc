// Unary, binary, compare, select and convert: one grid-stride kernel over the output
// elements, each thread handling one 16-byte vector (float4 of f32, 8 x bf16, ...) when
// the element count allows, loading to the compute type and rounding once on store.
//
//   extern "C" __global__ void k_y_add(__nv_bfloat16* out, const __nv_bfloat16* in0, ...) {
//     for (Index v = <thread>; v < kVectors; v += <grid threads>) {
//       const kiln::Vec<__nv_bfloat16, 8> a0 = kiln::LoadVec<8>(in0, v); ...
//       for (j < 8) r.v[j] = kiln::Round<__nv_bfloat16>::From(__fadd_rn(kiln::Load(x0), kiln::Load(x1)));
//       kiln::StoreVec<8>(out, v, r);
//     }
//   }
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codegen/kernel_source.h"
#include "codegen/lowerings.h"
#include "ir/status_macros.h"

namespace kiln::codegen {
namespace {

// The C++ operator of a compare node's direction.
absl::StatusOr<const char*> CompareOperator(const Node& node) {
  ASSIGN_OR_RETURN(const std::string direction, node.attrs().GetSymbol("direction"));
  for (const auto& [name, op] : {std::pair{"eq", "=="}, {"ne", "!="}, {"lt", "<"}, {"le", "<="}, {"gt", ">"},
                                 {"ge", ">="}}) {
    if (direction == name) return op;
  }
  return absl::InvalidArgumentError(absl::StrCat("%", node.name(), ": unknown compare direction '", direction, "'"));
}

}  // namespace

absl::StatusOr<std::string> ElementExpression(const Node& node, const std::vector<std::string>& operands) {
  if (static_cast<int>(operands.size()) != node.num_operands()) {
    return absl::InternalError(absl::StrCat("%", node.name(), ": ", operands.size(), " operand names for ",
                                            node.num_operands(), " operands"));
  }
  const DType out = node.type().dtype;
  const DType in = node.operand(0)->type().dtype;
  const bool integer = IsInteger(in);
  const std::string a = absl::StrCat("kiln::Load(", operands[0], ")");
  const std::string b = operands.size() > 1 ? absl::StrCat("kiln::Load(", operands[1], ")") : "";
  // A compute-type value rounded once into the result dtype.
  auto round = [&](const std::string& value) {
    return absl::StrCat("kiln::Round<", CudaTypeName(out), ">::From(", value, ")");
  };
  auto call = [](const char* f, const std::string& x, const std::string& y) {
    return absl::StrCat(f, "(", x, ", ", y, ")");
  };
  switch (node.opcode()) {
    case Opcode::kNeg:
      return round(absl::StrCat("-", a));
    case Opcode::kAbs:
      return round(absl::StrCat(integer ? "fabs(" : "fabsf(", a, ")"));
    case Opcode::kExp:
      return round(absl::StrCat("expf(", a, ")"));
    case Opcode::kLog:
      return round(absl::StrCat("logf(", a, ")"));
    case Opcode::kSqrt:
      return round(absl::StrCat("sqrtf(", a, ")"));  // IEEE: NVRTC's default -prec-sqrt=true
    case Opcode::kRsqrt:
      return round(absl::StrCat("__fdiv_rn(1.0f, sqrtf(", a, "))"));  // rsqrtf is 2 ulp; this is 1
    case Opcode::kTanh:
      return round(absl::StrCat("tanhf(", a, ")"));
    case Opcode::kSigmoid:
      // Rounded to bf16 (or f16), the hardware's approximate exp and divide (a few f32 ulps,
      // 2^-16 below bf16's resolution) serve: the IEEE forms made SwiGLU's backward kernels,
      // which recompute sigmoid(gate), compute-bound on the H200 (110 us for a [16384, 2048]
      // bf16 kernel whose bytes take 40 us). f32 results keep the correctly rounded forms.
      if (DTypeBytes(out) < DTypeBytes(DType::kF32)) {
        return round(absl::StrCat("__fdividef(1.0f, 1.0f + __expf(-", a, "))"));
      }
      return round(absl::StrCat("__fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-", a, ")))"));
    case Opcode::kGelu:
      // A result narrower than f32 (bf16) does not need Gelu's double: see GeluToNarrow.
      return round(absl::StrCat(DTypeBytes(out) < DTypeBytes(DType::kF32) ? "kiln::GeluToNarrow(" : "kiln::Gelu(", a,
                                ")"));
    case Opcode::kAdd:
      return round(call(integer ? "__dadd_rn" : "__fadd_rn", a, b));
    case Opcode::kSub:
      return round(call(integer ? "__dsub_rn" : "__fsub_rn", a, b));
    case Opcode::kMul:
      return round(call(integer ? "__dmul_rn" : "__fmul_rn", a, b));
    case Opcode::kDiv:
      return round(call(integer ? "kiln::IntDiv" : "__fdiv_rn", a, b));
    case Opcode::kMax:
      return round(call("kiln::Max", a, b));
    case Opcode::kMin:
      return round(call("kiln::Min", a, b));
    case Opcode::kCompare: {
      ASSIGN_OR_RETURN(const char* op, CompareOperator(node));
      return absl::StrCat("(", a, " ", op, " ", b, ")");  // IEEE: false with a NaN, but for !=
    }
    case Opcode::kSelect:
      // storage values: no conversion, bit-exact
      return absl::StrCat("(", operands[0], " ? ", operands[1], " : ", operands[2], ")");
    case Opcode::kConvert:
      return round(a);
    default:
      break;
  }
  return absl::InternalError(absl::StrCat("%", node.name(), ": ", node.op_name(), " is not elementwise"));
}

absl::StatusOr<LoweredNode> LowerElementwise(const Node& node, const CodegenOptions& options) {
  std::vector<std::string> operand_names;
  for (int i = 0; i < node.num_operands(); ++i) operand_names.push_back(absl::StrCat("x", i));
  ASSIGN_OR_RETURN(std::string expression, ElementExpression(node, operand_names));
  const int64_t count = node.type().num_elements();
  if (count == 0) return LoweredNode{LoweringKind::kKernels, {}};

  std::vector<DType> dtypes = {node.type().dtype};
  int widest = DTypeBytes(node.type().dtype);
  for (const Node* operand : node.operands()) {
    dtypes.push_back(operand->type().dtype);
    widest = std::max(widest, DTypeBytes(operand->type().dtype));
  }
  const int width = VectorWidth(widest, {count});
  const int threads = options.threads_per_block;
  const std::array<uint32_t, 3> grid = GridFor(count / width, threads, options.target);
  const std::string name = KernelName(node);
  const std::string out_type = CudaTypeName(node.type().dtype);

  std::string params = absl::StrCat(out_type, "* out");
  std::string loads, unpack;
  for (int i = 0; i < node.num_operands(); ++i) {
    const std::string type = CudaTypeName(node.operand(i)->type().dtype);
    absl::StrAppend(&params, ", const ", type, "* in", i);
    absl::StrAppendFormat(&loads, "    const kiln::Vec<%s, %d> a%d = kiln::LoadVec<%d>(in%d, v);\n", type, width, i,
                          width, i);
    absl::StrAppendFormat(&unpack, "      const %s x%d = a%d.v[j];\n", type, i, i);
  }
  std::string source = SourceOpening(node, dtypes);
  absl::StrAppendFormat(&source,
                        "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n"
                        "  typedef %s Index;\n"
                        "  constexpr Index kVectors = %d;  // %d elements, %d per access\n"
                        "  for (Index v = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; v < kVectors;\n"
                        "       v += static_cast<Index>(gridDim.x) * blockDim.x) {\n"
                        "%s"
                        "    kiln::Vec<%s, %d> r;\n"
                        "#pragma unroll\n"
                        "    for (int j = 0; j < %d; ++j) {\n"
                        "%s"
                        "      r.v[j] = %s;\n"
                        "    }\n"
                        "    kiln::StoreVec<%d>(out, v, r);\n"
                        "  }\n"
                        "}\n",
                        threads, name, params, IndexTypeFor(count / width + int64_t{grid[0]} * threads),
                        count / width, count, width, loads, out_type, width, width, unpack, expression, width);
  LoweredNode lowered{LoweringKind::kKernels, {}};
  lowered.kernels.push_back(MakeKernel(name, std::move(source), grid, {static_cast<uint32_t>(threads), 1, 1}));
  return lowered;
}

}  // namespace kiln::codegen
