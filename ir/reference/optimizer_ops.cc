// adamw_update, element by element in double (the evaluator rounds the result to f32 once):
//   m' = beta1 m + (1 - beta1) g
//   v' = beta2 v + (1 - beta2) g^2
//   p' = p decay - step_size m' / (sqrt(v') / sqrt_bc2 + eps)
// One node gives the three results (p', m', v').
#include <cmath>

#include "ir/shape_inference.h"
#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {

absl::StatusOr<std::vector<HostTensor>> EvalAdamWUpdate(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double beta1, node.attrs().GetFloat("beta1"));
  ASSIGN_OR_RETURN(double beta2, node.attrs().GetFloat("beta2"));
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  const double* p = xs[0]->values().data();
  const double* g = xs[1]->values().data();
  const double* m = xs[2]->values().data();
  const double* v = xs[3]->values().data();
  const double step_size = (*xs[4])[0], decay = (*xs[5])[0], sqrt_bc2 = (*xs[6])[0], grad_scale = (*xs[7])[0];
  std::vector<HostTensor> results;
  for (int r = 0; r < 3; ++r) results.emplace_back(node.result_type(r));
  double* p_new = results[0].mutable_values().data();
  double* m_new = results[1].mutable_values().data();
  double* v_new = results[2].mutable_values().data();
  ctx.pool.ParallelFor(results[0].num_elements(), kElementsPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // p' reads the new moments in double; the evaluator rounds all three to f32 once.
      // The scaled gradient is an f32 value, as the mul it replaces stored it.
      const double gs = static_cast<float>(g[i] * grad_scale);
      m_new[i] = beta1 * m[i] + (1 - beta1) * gs;
      v_new[i] = beta2 * v[i] + (1 - beta2) * gs * gs;
      p_new[i] = p[i] * decay - step_size * m_new[i] / (std::sqrt(v_new[i]) / sqrt_bc2 + eps);
    }
  });
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
