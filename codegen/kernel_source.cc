#include "codegen/kernel_source.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "codegen/lower_node.h"
#include "ir/text_format.h"

namespace kiln::codegen {
namespace {

// The grid of a grid-stride loop: enough blocks to fill the GPU four times over (2048
// resident threads per SM), not one per element, so huge tensors loop instead.
constexpr int64_t kResidentThreadsPerSm = 2048;
constexpr int64_t kGridWaves = 4;

// Load overload and Round specialization of one dtype.
std::string DTypeLibrary(DType t) {
  const std::string type = CudaTypeName(t);
  switch (t) {
    case DType::kF32:
      return "__device__ __forceinline__ float Load(float x) { return x; }\n"
             "template <> struct Round<float> {\n"
             "  static __device__ __forceinline__ float From(float v) { return v; }\n"
             "  static __device__ __forceinline__ float From(double v) { return __double2float_rn(v); }\n"
             "};\n";
    case DType::kBF16:
      return "__device__ __forceinline__ float Load(__nv_bfloat16 x) { return __bfloat162float(x); }\n"
             "template <> struct Round<__nv_bfloat16> {\n"
             "  static __device__ __forceinline__ __nv_bfloat16 From(float v) { return __float2bfloat16_rn(v); }\n"
             "  static __device__ __forceinline__ __nv_bfloat16 From(double v) { return __double2bfloat16(v); }\n"
             "};\n";
    case DType::kF16:
      return "__device__ __forceinline__ float Load(__half x) { return __half2float(x); }\n"
             "template <> struct Round<__half> {\n"
             "  static __device__ __forceinline__ __half From(float v) { return __float2half_rn(v); }\n"
             "  static __device__ __forceinline__ __half From(double v) { return __double2half(v); }\n"
             "};\n";
    case DType::kF8E4M3:
    case DType::kF8E5M2: {
      const char* kind = t == DType::kF8E4M3 ? "__NV_E4M3" : "__NV_E5M2";
      // Saturating to the largest finite value, like the reference (and the FP8 GEMM path).
      return absl::StrCat("__device__ __forceinline__ float Load(", type, " x) { return static_cast<float>(x); }\n",
                          "template <> struct Round<", type, "> {\n",
                          "  static __device__ __forceinline__ ", type, " From(float v) {\n", "    ", type,
                          " r; r.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ", kind, "); return r;\n  }\n",
                          "  static __device__ __forceinline__ ", type, " From(double v) {\n", "    ", type,
                          " r; r.__x = __nv_cvt_double_to_fp8(v, __NV_SATFINITE, ", kind, "); return r;\n  }\n",
                          "};\n");
    }
    case DType::kI32:
      // cvt.rzi.s32.f64 truncates and clamps to the int range; NaN is made 0 explicitly.
      return "__device__ __forceinline__ double Load(int x) { return x; }\n"
             "template <> struct Round<int> {\n"
             "  static __device__ __forceinline__ int From(double v) { return v != v ? 0 : __double2int_rz(v); }\n"
             "  static __device__ __forceinline__ int From(float v) { return From(static_cast<double>(v)); }\n"
             "};\n";
    case DType::kI64:
      // The reference clamps to the doubles at the ends of the i64 range; 2^63 - 1 is not one.
      return "__device__ __forceinline__ double Load(long long x) { return static_cast<double>(x); }\n"
             "template <> struct Round<long long> {\n"
             "  static __device__ __forceinline__ long long From(double v) {\n"
             "    if (v != v) return 0;\n"
             "    return __double2ll_rz(fmin(fmax(v, -0x1p63), 0x1.fffffffffffffp62));\n"
             "  }\n"
             "  static __device__ __forceinline__ long long From(float v) { return From(static_cast<double>(v)); }\n"
             "};\n";
    case DType::kPred:
      return "__device__ __forceinline__ float Load(bool x) { return x ? 1.0f : 0.0f; }\n"
             "template <> struct Round<bool> {\n"
             "  static __device__ __forceinline__ bool From(float v) { return v != 0.0f; }\n"
             "  static __device__ __forceinline__ bool From(double v) { return v != 0.0; }\n"
             "};\n";
  }
  return "";
}

constexpr const char* kCommonLibrary = R"(template <typename T> struct Round;
template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };
template <int N, typename T, typename I>
__device__ __forceinline__ Vec<T, N> LoadVec(const T* p, I i) { return reinterpret_cast<const Vec<T, N>*>(p)[i]; }
template <int N, typename T, typename I>
__device__ __forceinline__ void StoreVec(T* p, I i, const Vec<T, N>& v) { reinterpret_cast<Vec<T, N>*>(p)[i] = v; }
// NaN-propagating max and min (a NaN operand makes the sum NaN), as the reference.
__device__ __forceinline__ float Max(float a, float b) { return (a != a || b != b) ? __fadd_rn(a, b) : (a > b ? a : b); }
__device__ __forceinline__ float Min(float a, float b) { return (a != a || b != b) ? __fadd_rn(a, b) : (a < b ? a : b); }
__device__ __forceinline__ double Max(double a, double b) { return (a != a || b != b) ? __dadd_rn(a, b) : (a > b ? a : b); }
__device__ __forceinline__ double Min(double a, double b) { return (a != a || b != b) ? __dadd_rn(a, b) : (a < b ? a : b); }
// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed
// as x / (1 + exp(-2u)) (the same function, without 1 + tanh's cancellation for x < 0) in
// double: the error of u is amplified by |2u| in exp, which f32 would show as tens of ulps.
// Elementwise kernels are memory-bound; the few double ops cost nothing visible.
__device__ __forceinline__ float Gelu(float x) {
  const double xd = x;
  const double cubic = __dmul_rn(0.044715, __dmul_rn(xd, __dmul_rn(xd, xd)));
  const double u = __dmul_rn(0.7978845608028654, __dadd_rn(xd, cubic));
  return static_cast<float>(__ddiv_rn(xd, __dadd_rn(1.0, exp(-2.0 * u))));
}
// The same function in f32 for a result rounded to bf16 (or f16), with the hardware's
// approximate exp2 and reciprocal: their few-ulp f32 errors, even amplified by |2u|, stay
// orders of magnitude below bf16's 2^-8 resolution (a result lands one bf16 ulp away only
// where the exact value sits within ~1e-6 of a rounding boundary). The double form made GPT-2's
// MLP gelu compute-bound on the H200 (163 us for a [16384, 3072] bf16 tensor whose bytes take
// ~45 us), and IEEE expf and division still cost ~40 instructions an element (68 us): at
// FP32's issue rate that is the kernel's time, not its bytes. Below x ~ -9.4 exp(-2u)
// overflows and the result is -0 where the exact one is below 1e-37.
__device__ __forceinline__ float GeluToNarrow(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  return __fdividef(x, 1.0f + __expf(-2.0f * u));
}
// Integer division truncating toward zero. The reference rejects a zero divisor before
// running; a kernel cannot, and yields 0.
__device__ __forceinline__ double IntDiv(double a, double b) {
  if (b == 0.0) return 0.0;
  if (b == -1.0) return -a;
  return static_cast<double>(static_cast<long long>(a) / static_cast<long long>(b));
}
)";

}  // namespace

std::string KernelName(const Node& node) {
  std::string name = "k_";
  for (char c : node.name()) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    name += alnum ? c : '_';
  }
  absl::StrAppend(&name, "_", node.op_name());
  return name;
}

std::string SourceOpening(const Node& node, const std::vector<DType>& dtypes) {
  const std::set<DType> used(dtypes.begin(), dtypes.end());
  const std::string function = node.parent() != nullptr ? node.parent()->name() : "";
  // A node line has no newline, but a string attribute could carry one in principle.
  const std::string line = absl::StrReplaceAll(PrintNode(node), {{"\n", " "}, {"\r", " "}});
  std::string s = absl::StrCat("// ", KernelName(node), ": node %", node.name(), " of @", function, "\n// ", line,
                               "\n");
  if (std::any_of(used.begin(), used.end(), IsFp8)) {
    s += "#include <cuda_fp8.h>\n";  // includes cuda_fp16.h and cuda_bf16.h
  } else {
    if (used.count(DType::kF16)) s += "#include <cuda_fp16.h>\n";
    if (used.count(DType::kBF16)) s += "#include <cuda_bf16.h>\n";
  }
  s += "\nnamespace kiln {\n";
  s += kCommonLibrary;
  for (DType t : used) s += DTypeLibrary(t);
  s += "}  // namespace kiln\n\n";
  return s;
}

const char* ComputeTypeName(DType t) { return IsInteger(t) ? "double" : "float"; }

const char* IndexTypeFor(int64_t bound) { return bound < (int64_t{1} << 31) ? "int" : "long long"; }

int VectorWidth(int widest_dtype_bytes, const std::vector<int64_t>& multiples_of) {
  int width = std::max(1, 16 / widest_dtype_bytes);
  auto divides_all = [&](int w) {
    return std::all_of(multiples_of.begin(), multiples_of.end(), [w](int64_t m) { return m % w == 0; });
  };
  while (width > 1 && !divides_all(width)) width /= 2;
  return width;
}

std::array<uint32_t, 3> GridFor(int64_t work_items, int threads, const Target& target) {
  const int64_t blocks = (work_items + threads - 1) / threads;
  const int64_t max_blocks = std::max<int64_t>(1, target.sm_count * kResidentThreadsPerSm / threads * kGridWaves);
  return {static_cast<uint32_t>(std::clamp<int64_t>(blocks, 1, max_blocks)), 1, 1};
}

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * dims[d + 1];
  return strides;
}

KernelSpec MakeKernel(std::string name, std::string source, std::array<uint32_t, 3> grid,
                      std::array<uint32_t, 3> block) {
  KernelSpec k;
  k.name = std::move(name);
  k.source = std::move(source);
  k.grid = grid;
  k.block = block;
  return k;
}

}  // namespace kiln::codegen
