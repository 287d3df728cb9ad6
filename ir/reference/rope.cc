// rope on x [B,T,H,D] with positions i32[T], Hugging Face rotate-half convention: for
// i < D/2, freq_i = theta^(-2i/D), angle = pos * freq_i (negated when inverse=1),
//   out[i]       = x[i] * cos(angle) - x[i + D/2] * sin(angle)
//   out[i + D/2] = x[i + D/2] * cos(angle) + x[i] * sin(angle)
#include <algorithm>
#include <cmath>

#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {

absl::StatusOr<HostTensor> EvalRope(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double theta, node.attrs().GetFloat("theta"));
  ASSIGN_OR_RETURN(int64_t inverse, node.attrs().GetInt("inverse"));
  const std::vector<int64_t>& dims = xs[0]->type().dims;
  const int64_t seq = dims[1], heads = dims[2], head_dim = dims[3], half = head_dim / 2;
  // cos/sin per (position, frequency), shared by every batch and head.
  std::vector<double> cos_table(seq * half), sin_table(seq * half);
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      const double angle = (inverse ? -1.0 : 1.0) * (*xs[1])[t] * freq;
      cos_table[t * half + i] = std::cos(angle);
      sin_table[t * half + i] = std::sin(angle);
    }
  }
  HostTensor out(node.type());
  const int64_t vectors = xs[0]->num_elements() / std::max<int64_t>(1, head_dim);  // B*T*H
  ctx.pool.ParallelFor(vectors, std::max<int64_t>(1, kElementsPerChunk / std::max<int64_t>(1, head_dim)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t v = begin; v < end; ++v) {
                           const int64_t t = (v / heads) % seq;
                           const double* x = xs[0]->values().data() + v * head_dim;
                           double* y = out.mutable_values().data() + v * head_dim;
                           for (int64_t i = 0; i < half; ++i) {
                             const double c = cos_table[t * half + i], s = sin_table[t * half + i];
                             y[i] = x[i] * c - x[i + half] * s;
                             y[i + half] = x[i + half] * c + x[i] * s;
                           }
                         }
                       });
  return out;
}

}  // namespace kiln::reference
