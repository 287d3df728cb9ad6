// dot_general: maps the operands' batch, free and contracting dims to a batched GEMM
// [batch, M, K] x [batch, K, N] -> [batch, M, N], which is exactly the result layout
// (batch dims, lhs free dims, rhs free dims). Operands are used as stored: already
// rounded to their dtype, hence exact in double. The sum is the f32 accumulator: rounded to
// f32 first, then (for a narrower result: bf16, f16, fp8) by the evaluator to the result's
// dtype, as cuBLASLt converts its f32 accumulator (ir/op_table.h). For an f32 result that is
// one rounding, as before.
#include <algorithm>
#include <cmath>

#include "ir/gemm_slots.h"
#include "ir/numerics.h"
#include "ir/status_macros.h"
#include "ir/reference/gemm.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {
namespace {

// Offsets of the elements of `x` over the group of dims `group` (row-major within it).
std::vector<int64_t> OffsetsOf(const TensorType& x, const std::vector<int64_t>& group) {
  const std::vector<int64_t> strides = RowMajorStrides(x.dims);
  std::vector<int64_t> sizes, group_strides;
  for (int64_t d : group) {
    sizes.push_back(x.dims[d]);
    group_strides.push_back(strides[d]);
  }
  return GroupOffsets(sizes, group_strides);
}

// The dims of `x` in neither list, in increasing order.
std::vector<int64_t> FreeDims(const TensorType& x, const std::vector<int64_t>& batch,
                              const std::vector<int64_t>& contract) {
  std::vector<int64_t> free;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
        std::find(contract.begin(), contract.end(), d) == contract.end()) {
      free.push_back(d);
    }
  }
  return free;
}

// The f32 accumulator every float GEMM result is computed in: the double sum rounded to f32
// (a no-op under f32_as_f64, which keeps f32 values in double).
void RoundToAccumulator(double* values, int64_t n, DType result, const EvalContext& ctx) {
  if (IsFloat(result)) RoundValuesToDType(values, n, DType::kF32, ctx.options.f32_as_f64);
}

}  // namespace

absl::StatusOr<HostTensor> EvalDotGeneral(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(std::vector<int64_t> lhs_batch, node.attrs().GetInts("lhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> rhs_batch, node.attrs().GetInts("rhs_batch"));
  ASSIGN_OR_RETURN(std::vector<int64_t> lhs_contract, node.attrs().GetInts("lhs_contract"));
  ASSIGN_OR_RETURN(std::vector<int64_t> rhs_contract, node.attrs().GetInts("rhs_contract"));
  const TensorType& lt = xs[0]->type();
  const TensorType& rt = xs[1]->type();
  GemmOperand a{xs[0]->values().data(), OffsetsOf(lt, lhs_batch), OffsetsOf(lt, FreeDims(lt, lhs_batch, lhs_contract)),
                OffsetsOf(lt, lhs_contract)};
  GemmOperand b{xs[1]->values().data(), OffsetsOf(rt, rhs_batch), OffsetsOf(rt, rhs_contract),
                OffsetsOf(rt, FreeDims(rt, rhs_batch, rhs_contract))};
  HostTensor out(node.type());
  Gemm(a, b, out.mutable_values().data(), ctx.pool);
  RoundToAccumulator(out.mutable_values().data(), out.num_elements(), node.type().dtype, ctx);
  return out;
}

// gemm: the same GEMM over the operands' bytes as they lie ([batch, M, K] or [batch, K, M];
// [batch, N, K] or [batch, K, N]), then cuBLASLt's f32 epilogue, each step rounded to f32
// (ir/op_table.h):
//   acc = f32(A B);  t = f32(alpha' acc);  D = f32(t + f32(beta C))  (then d_scale, and the
//   evaluator rounds D to the result dtype)
// with alpha' = f32(alpha a_scale b_scale) and the amax of the bracket when asked; scales are
// 1 without the FP8 slots. So gemm(a, b) then add(., x) is gemm(a, b, x) {beta=1} bit for bit,
// and a bf16 result is the f32 result converted. epilogue=bias adds f32(bias[j]) to column j
// of the bracket, before d_scale and the amax.
absl::StatusOr<std::vector<HostTensor>> EvalGemm(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(int64_t batch, node.attrs().GetInt("batch"));
  ASSIGN_OR_RETURN(int64_t m, node.attrs().GetInt("m"));
  ASSIGN_OR_RETURN(int64_t n, node.attrs().GetInt("n"));
  ASSIGN_OR_RETURN(int64_t k, node.attrs().GetInt("k"));
  ASSIGN_OR_RETURN(std::string a_layout, node.attrs().GetSymbol("a_layout"));
  ASSIGN_OR_RETURN(std::string b_layout, node.attrs().GetSymbol("b_layout"));
  ASSIGN_OR_RETURN(double alpha, node.attrs().GetFloat("alpha"));
  ASSIGN_OR_RETURN(double beta, node.attrs().GetFloat("beta"));
  ASSIGN_OR_RETURN(const GemmSlots slots, GemmSlotsOf(node.attrs()));
  const bool scaled = slots.a_scale >= 0, amax = slots.amax;
  auto steps = [](int64_t count, int64_t stride) {
    std::vector<int64_t> offsets(count);
    for (int64_t i = 0; i < count; ++i) offsets[i] = i * stride;
    return offsets;
  };
  const bool a_mk = a_layout == "mk", b_nk = b_layout == "nk";
  GemmOperand a{xs[0]->values().data(), steps(batch, m * k), steps(m, a_mk ? k : 1), steps(k, a_mk ? 1 : m)};
  GemmOperand b{xs[1]->values().data(), steps(batch, n * k), steps(k, b_nk ? 1 : n), steps(n, b_nk ? k : 1)};
  HostTensor out(node.result_type(0));
  double* d = out.mutable_values().data();
  Gemm(a, b, d, ctx.pool);
  const int64_t count = out.num_elements();
  const bool keep = ctx.options.f32_as_f64 || !IsFloat(out.type().dtype);  // integers: exact
  auto f32 = [keep](double v) { return keep ? v : RoundToDType(v, DType::kF32); };
  RoundToAccumulator(d, count, out.type().dtype, ctx);
  const double ab_scale = scaled ? xs[slots.a_scale]->values()[0] * xs[slots.b_scale]->values()[0] : 1.0;
  const double d_scale = scaled ? xs[slots.d_scale]->values()[0] : 1.0;
  const double scaled_alpha = f32(alpha * ab_scale);
  const double* c = slots.c >= 0 ? xs[slots.c]->values().data() : nullptr;
  const double* bias = slots.bias >= 0 ? xs[slots.bias]->values().data() : nullptr;
  double max_abs = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double t = f32(scaled_alpha * d[i]);
    double v = c != nullptr ? f32(t + f32(beta * c[i])) : t;
    if (bias != nullptr) v = f32(v + f32(bias[i % n]));
    max_abs = std::isnan(v) || std::isnan(max_abs) ? std::nan("") : std::max(max_abs, std::abs(v));
    d[i] = scaled ? f32(d_scale * v) : v;
  }
  std::vector<HostTensor> results;
  results.push_back(std::move(out));
  if (amax) results.push_back(HostTensor::FromValues(TensorType{DType::kF32, {}}, {max_abs}));
  return results;
}

}  // namespace kiln::reference
