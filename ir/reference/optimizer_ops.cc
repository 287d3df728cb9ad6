// adamw_update, element by element in double (the evaluator rounds the result to f32 once):
//   m' = beta1 m + (1 - beta1) g
//   v' = beta2 v + (1 - beta2) g^2
//   p' = p decay - step_size m' / (sqrt(v') / sqrt_bc2 + eps)
// One node gives the three results (p', m', v') of each of its parameter groups; a grouped
// node (group-optimizer-updates') computes every group exactly as the one-group node would.
#include <cmath>

#include "ir/shape_inference.h"
#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {
namespace {

struct AdamWScalars {
  double beta1 = 0, beta2 = 0, eps = 0;
  double step_size = 0, decay = 0, sqrt_bc2 = 0, grad_scale = 0;
};

// One parameter group: p, g, m, v in; p', m', v' out (n elements each).
void AdamWGroup(const AdamWScalars& s, const double* p, const double* g, const double* m, const double* v,
                double* p_new, double* m_new, double* v_new, int64_t n, const EvalContext& ctx) {
  ctx.pool.ParallelFor(n, kElementsPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // p' reads the new moments in double; the evaluator rounds all three to f32 once.
      // The scaled gradient is an f32 value, as the mul it replaces stored it.
      const double gs = static_cast<float>(g[i] * s.grad_scale);
      m_new[i] = s.beta1 * m[i] + (1 - s.beta1) * gs;
      v_new[i] = s.beta2 * v[i] + (1 - s.beta2) * gs * gs;
      p_new[i] = p[i] * s.decay - s.step_size * m_new[i] / (std::sqrt(v_new[i]) / s.sqrt_bc2 + s.eps);
    }
  });
}

}  // namespace

absl::StatusOr<std::vector<HostTensor>> EvalAdamWUpdate(const Node& node, Operands xs, const EvalContext& ctx) {
  AdamWScalars s;
  ASSIGN_OR_RETURN(s.beta1, node.attrs().GetFloat("beta1"));
  ASSIGN_OR_RETURN(s.beta2, node.attrs().GetFloat("beta2"));
  ASSIGN_OR_RETURN(s.eps, node.attrs().GetFloat("eps"));
  const size_t groups = xs.size() / 4 - 1;  // shape inference checked 4 per group and 4 scalars
  s.step_size = (*xs[4 * groups])[0];
  s.decay = (*xs[4 * groups + 1])[0];
  s.sqrt_bc2 = (*xs[4 * groups + 2])[0];
  s.grad_scale = (*xs[4 * groups + 3])[0];
  std::vector<HostTensor> results;
  for (int r = 0; r < node.num_results(); ++r) results.emplace_back(node.result_type(r));
  for (size_t k = 0; k < groups; ++k) {
    AdamWGroup(s, xs[4 * k]->values().data(), xs[4 * k + 1]->values().data(), xs[4 * k + 2]->values().data(),
               xs[4 * k + 3]->values().data(), results[3 * k].mutable_values().data(),
               results[3 * k + 1].mutable_values().data(), results[3 * k + 2].mutable_values().data(),
               results[3 * k].num_elements(), ctx);
  }
  return results;
}

absl::StatusOr<HostTensor> EvalSumOfSquares(const Node& node, Operands xs, const EvalContext&) {
  // In double, operand by operand, element by element: the evaluator rounds the sum to f32
  // once. (The GPU kernel's f32 partials differ from this in the last bits.)
  double sum = 0;
  for (const HostTensor* x : xs) {
    for (double v : x->values()) sum += v * v;
  }
  HostTensor out(node.type());
  out.mutable_values()[0] = sum;
  return out;
}

}  // namespace kiln::reference
