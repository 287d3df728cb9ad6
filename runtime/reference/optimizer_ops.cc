// adamw_update, element by element in double (the evaluator rounds the result to f32 once):
//   m' = beta1 m + (1 - beta1) g
//   v' = beta2 v + (1 - beta2) g^2
//   p' = p decay - step_size m' / (sqrt(v') / sqrt_bc2 + eps)
// The attribute `result` says which of p', m', v' the node is.
#include <cmath>

#include "ir/shape_inference.h"
#include "ir/status_macros.h"
#include "runtime/reference/kernels.h"

namespace kiln::reference {

absl::StatusOr<HostTensor> EvalAdamWUpdate(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double beta1, node.attrs().GetFloat("beta1"));
  ASSIGN_OR_RETURN(double beta2, node.attrs().GetFloat("beta2"));
  ASSIGN_OR_RETURN(double eps, node.attrs().GetFloat("eps"));
  ASSIGN_OR_RETURN(AdamWResult result, GetAdamWResult(node.attrs()));
  const double* p = xs[0]->values().data();
  const double* g = xs[1]->values().data();
  const double* m = xs[2]->values().data();
  const double* v = xs[3]->values().data();
  const double step_size = (*xs[4])[0], decay = (*xs[5])[0], sqrt_bc2 = (*xs[6])[0];
  HostTensor out(node.type());
  double* y = out.mutable_values().data();
  auto new_m = [&](int64_t i) { return beta1 * m[i] + (1 - beta1) * g[i]; };
  auto new_v = [&](int64_t i) { return beta2 * v[i] + (1 - beta2) * g[i] * g[i]; };
  ctx.pool.ParallelFor(out.num_elements(), kElementsPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (result == AdamWResult::kM) {
        y[i] = new_m(i);
      } else if (result == AdamWResult::kV) {
        y[i] = new_v(i);
      } else {
        y[i] = p[i] * decay - step_size * new_m(i) / (std::sqrt(new_v(i)) / sqrt_bc2 + eps);
      }
    }
  });
  return out;
}

}  // namespace kiln::reference
