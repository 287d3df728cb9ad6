// rope on x [B,T,H,D] with positions i32[T], Hugging Face rotate-half convention: for
// i < D/2, freq_i = theta^(-2i/D), angle = pos * freq_i (negated when inverse=1),
//   out[i]       = x[i] * cos(angle) - x[i + D/2] * sin(angle)
//   out[i + D/2] = x[i + D/2] * cos(angle) + x[i] * sin(angle)
// with cos and sin computed in double and rounded to f32, and every product and sum rounded
// to f32 (ir/op_table.h): what the kernel computes, and what expand-rope's mul/sub/add of
// rope_table's columns compute op by op. (With f32_as_f64, f32 values stay in double here as
// everywhere.) rope_table is that cos/sin table.
#include <algorithm>
#include <cmath>

#include "ir/numerics.h"
#include "ir/status_macros.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {

namespace {

// Row t of rope's table: f32 cos of the angles of frequencies 0..half-1, then their sin.
void FillRopeTable(const HostTensor& positions, double theta, int64_t head_dim, bool inverse, bool f32_as_f64,
                   std::vector<double>& table) {
  const int64_t seq = positions.num_elements(), half = head_dim / 2;
  table.assign(seq * head_dim, 0.0);
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      const double angle = (inverse ? -1.0 : 1.0) * positions[t] * freq;
      table[t * head_dim + i] = std::cos(angle);
      table[t * head_dim + half + i] = std::sin(angle);
    }
  }
  RoundValuesToDType(table.data(), static_cast<int64_t>(table.size()), DType::kF32, f32_as_f64);
}

}  // namespace

absl::StatusOr<HostTensor> EvalRope(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double theta, node.attrs().GetFloat("theta"));
  ASSIGN_OR_RETURN(int64_t inverse, node.attrs().GetInt("inverse"));
  const std::vector<int64_t>& dims = xs[0]->type().dims;
  const int64_t seq = dims[1], heads = dims[2], head_dim = dims[3], half = head_dim / 2;
  const bool keep = ctx.options.f32_as_f64;
  // cos/sin per (position, frequency), shared by every batch and head.
  std::vector<double> table;
  FillRopeTable(*xs[1], theta, head_dim, inverse != 0, keep, table);
  const auto f32 = [keep](double v) { return keep ? v : RoundToDType(v, DType::kF32); };
  HostTensor out(node.type());
  const int64_t vectors = xs[0]->num_elements() / std::max<int64_t>(1, head_dim);  // B*T*H
  ctx.pool.ParallelFor(vectors, std::max<int64_t>(1, kElementsPerChunk / std::max<int64_t>(1, head_dim)),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t v = begin; v < end; ++v) {
                           const int64_t t = (v / heads) % seq;
                           const double* x = xs[0]->values().data() + v * head_dim;
                           double* y = out.mutable_values().data() + v * head_dim;
                           for (int64_t i = 0; i < half; ++i) {
                             const double c = table[t * head_dim + i], s = table[t * head_dim + half + i];
                             y[i] = f32(f32(x[i] * c) - f32(x[i + half] * s));
                             y[i + half] = f32(f32(x[i + half] * c) + f32(x[i] * s));
                           }
                         }
                       });
  return out;
}

absl::StatusOr<HostTensor> EvalRopeTable(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double theta, node.attrs().GetFloat("theta"));
  ASSIGN_OR_RETURN(int64_t head_dim, node.attrs().GetInt("head_dim"));
  ASSIGN_OR_RETURN(int64_t inverse, node.attrs().GetInt("inverse"));
  std::vector<double> table;
  FillRopeTable(*xs[0], theta, head_dim, inverse != 0, ctx.options.f32_as_f64, table);
  HostTensor out(node.type());
  std::copy(table.begin(), table.end(), out.mutable_values().begin());
  return out;
}

}  // namespace kiln::reference
