// attention (O and LSE), attention_delta and attention_grad (dq, dk, dv) (ir/op_table.h) in double:
// the definitions that kernels/flash_attention.cuh computes in fp32 on tensor cores. Each
// row of scores is built, used and dropped; the [T, T] matrices are never held whole.
//   S_ij  = (q_i . k_j) scale for key j <= query i (the rest masked out)
//   LSE_i = log sum_j exp(S_ij)
//   with {out_dtype=bf16}, O rounded to f32 and then once to bf16 (the evaluator's rounding),
//           so that it is convert(O) of the f32 result bit for bit
//   O_i   = sum_j bf16(2^(S_ij log2 e - m_i)) v_j / sum_j 2^(S_ij log2 e - m_i),
//           m_i = ceil(max_j S_ij log2 e): P rounded to bf16 before its normalization
//           (any whole m_i gives the same O, since bf16 rounding commutes with powers of 2;
//           this one is the kernels' and keeps every term in (0, 1])
//   Delta_i = sum_d bf16(dO_id) bf16(O_id): O rounded to bf16 too, as FlashAttention and
//           cuDNN compute it from their bf16 O, so it is the same for an f32 O and for that O
//           stored bf16 ({out_dtype=bf16}; narrow-activations-bf16 relies on it)
//   dS_ij = P_ij (dO_i . v_j - Delta_i) scale, P_ij = exp(S_ij - lse_i) with the given lse
//   dq_i = sum_j bf16(dS_ij) k_j;  dk_j = sum_i bf16(dS_ij) q_i;  dv_j = sum_i bf16(P_ij) dO_i
// with dk and dv summed over the query heads that share kv head j's head.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "ir/numerics.h"
#include "ir/reference/kernels.h"

namespace kiln::reference {
namespace {

struct AttentionDims {
  int64_t b, h, hkv, t, d;
  int64_t group() const { return h / hkv; }
};

AttentionDims DimsOf(const HostTensor& q, const HostTensor& k) {
  return {q.type().dims[0], q.type().dims[1], k.type().dims[1], q.type().dims[2], q.type().dims[3]};
}

double Bf16(double v) { return RoundToDType(v, DType::kBF16); }

// The scaled scores of query row `i` of head (b, h) against keys 0..i.
void ScoreRow(const AttentionDims& s, const double* q, const double* k, int64_t b, int64_t h, int64_t i,
              double scale, std::vector<double>& row) {
  const double* qi = q + ((b * s.h + h) * s.t + i) * s.d;
  const double* kh = k + (b * s.hkv + h / s.group()) * s.t * s.d;
  row.resize(i + 1);
  for (int64_t j = 0; j <= i; ++j) {
    double dot = 0;
    for (int64_t x = 0; x < s.d; ++x) dot += qi[x] * kh[j * s.d + x];
    row[j] = dot * scale;
  }
}

double LogSumExpOf(const std::vector<double>& row) {
  double max = -INFINITY;
  for (double v : row) max = std::max(max, v);
  double sum = 0;
  for (double v : row) sum += std::exp(v - max);
  return max + std::log(sum);
}

// Calls fn(b, h) for every (batch, head), in parallel.
template <typename Fn>
void ForEachHead(const EvalContext& ctx, const AttentionDims& s, Fn fn) {
  ctx.pool.ParallelFor(s.b * s.h, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) fn(bh / s.h, bh % s.h);
  });
}

}  // namespace

// O and the LSE of each row, which the backward reads.
absl::StatusOr<std::vector<HostTensor>> EvalAttention(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double scale, node.attrs().GetFloat("scale"));
  const AttentionDims s = DimsOf(*xs[0], *xs[1]);
  const double* v = xs[2]->values().data();
  HostTensor out(node.result_type(0));
  HostTensor lse_out(node.result_type(1));
  const bool narrow_o = node.result_type(0).dtype != DType::kF32;
  ForEachHead(ctx, s, [&](int64_t b, int64_t h) {
    std::vector<double> row;
    const double* vh = v + (b * s.hkv + h / s.group()) * s.t * s.d;
    for (int64_t i = 0; i < s.t; ++i) {
      ScoreRow(s, xs[0]->values().data(), xs[1]->values().data(), b, h, i, scale, row);
      lse_out.mutable_values()[(b * s.h + h) * s.t + i] = LogSumExpOf(row);
      double max = -INFINITY;
      for (double x : row) max = std::max(max, x);
      const double m = std::ceil(max * M_LOG2E);
      double* o = out.mutable_values().data() + ((b * s.h + h) * s.t + i) * s.d;
      double l = 0;
      for (int64_t j = 0; j <= i; ++j) {
        const double t = std::exp2(row[j] * M_LOG2E - m);
        l += t;
        const double p = Bf16(t);
        for (int64_t x = 0; x < s.d; ++x) o[x] += p * vh[j * s.d + x];
      }
      for (int64_t x = 0; x < s.d; ++x) o[x] /= l;
      // A bf16 O is the f32 O rounded once (ir/op_table.h): round to f32 here as the
      // evaluator rounds an f32 result (kept in double under f32_as_f64), and it rounds that
      // to bf16 after, exactly as convert(attention : f32) would.
      if (narrow_o && !ctx.options.f32_as_f64) {
        for (int64_t x = 0; x < s.d; ++x) o[x] = RoundToDType(o[x], DType::kF32);
      }
    }
  });
  std::vector<HostTensor> results;
  results.push_back(std::move(out));
  results.push_back(std::move(lse_out));
  return results;
}

absl::StatusOr<HostTensor> EvalAttentionDelta(const Node& node, Operands xs, const EvalContext& ctx) {
  const std::vector<int64_t>& dims = xs[0]->type().dims;
  const int64_t rows = dims[0] * dims[1] * dims[2], d = dims[3];
  HostTensor out(node.type());
  ctx.pool.ParallelFor(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      double sum = 0;
      for (int64_t x = 0; x < d; ++x) sum += Bf16(xs[1]->values()[r * d + x]) * Bf16(xs[0]->values()[r * d + x]);
      out.mutable_values()[r] = sum;
    }
  });
  return out;
}

absl::StatusOr<std::vector<HostTensor>> EvalAttentionGrad(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(double scale, node.attrs().GetFloat("scale"));
  const AttentionDims s = DimsOf(*xs[0], *xs[1]);
  const double* q = xs[0]->values().data();
  const double* k = xs[1]->values().data();
  const double* v = xs[2]->values().data();
  const double* dout = xs[3]->values().data();
  const double* lse = xs[4]->values().data();
  const double* delta = xs[5]->values().data();
  std::vector<HostTensor> results;
  for (int r = 0; r < 3; ++r) results.emplace_back(node.result_type(r));
  double* dq = results[0].mutable_values().data();
  double* dk = results[1].mutable_values().data();
  double* dv = results[2].mutable_values().data();
  // dq rows are per query head: heads in parallel. dk and dv rows sum over the heads of a
  // group: kv heads in parallel, each walking its group's heads in order (deterministic).
  for (const bool per_query_head : {true, false}) {
    const int64_t units = per_query_head ? s.b * s.h : s.b * s.hkv;
    ctx.pool.ParallelFor(units, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> row;
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t b = per_query_head ? unit / s.h : unit / s.hkv;
        const int64_t first_head = per_query_head ? unit % s.h : (unit % s.hkv) * s.group();
        const int64_t heads = per_query_head ? 1 : s.group();
        for (int64_t h = first_head; h < first_head + heads; ++h) {
          const int64_t kv_base = (b * s.hkv + h / s.group()) * s.t * s.d;
          for (int64_t i = 0; i < s.t; ++i) {
            const int64_t qrow = (b * s.h + h) * s.t + i;
            ScoreRow(s, q, k, b, h, i, scale, row);
            for (int64_t j = 0; j <= i; ++j) {
              const double p = std::exp(row[j] - lse[qrow]);
              double dp = 0;
              for (int64_t x = 0; x < s.d; ++x) dp += dout[qrow * s.d + x] * v[kv_base + j * s.d + x];
              const double ds = Bf16(p * (dp - delta[qrow]) * scale);
              if (per_query_head) {
                for (int64_t x = 0; x < s.d; ++x) dq[qrow * s.d + x] += ds * k[kv_base + j * s.d + x];
              } else {
                const double pb = Bf16(p);
                for (int64_t x = 0; x < s.d; ++x) {
                  dk[kv_base + j * s.d + x] += ds * q[qrow * s.d + x];
                  dv[kv_base + j * s.d + x] += pb * dout[qrow * s.d + x];
                }
              }
            }
          }
        }
      }
    });
  }
  return results;
}

}  // namespace kiln::reference
