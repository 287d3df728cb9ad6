#include "tests/testing/flash_attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/numerics.h"

namespace kiln::testing {
namespace {

// Bounds on how far the GPU's fp32 values may lie from the exact ones, as multiples of the
// sum of the magnitudes of the terms they add up. Generous (fp32 tensor-core sums over a
// few thousand terms stay well inside them), since a bound here only widens the window in
// which a bf16 rounding is taken as ambiguous, never the tolerance of a clean element.
constexpr double kDotError = 0x1p-18;       // an S or dP element, pre-rounding
constexpr double kAccumulation = 0x1p-16;   // an output element (O, dq, dk, dv)
constexpr double kUlpF32 = 0x1p-23;

double Bf16(double v) { return RoundToDType(v, DType::kBF16); }

// The bf16 value of x, and how far the GPU's rounding of a value within `err` of x may land
// from it (0 when no rounding boundary lies within the window).
struct Rounded {
  double value, slack;
};
Rounded RoundBf16Within(double x, double err) {
  const double r = Bf16(x);
  return {r, std::max(std::abs(Bf16(x - err) - r), std::abs(Bf16(x + err) - r))};
}

// Row-major offsets.
int64_t QIndex(const AttentionShape& s, int64_t b, int64_t h, int64_t t) {
  return ((b * s.heads + h) * s.seq_len + t) * s.head_dim;
}
int64_t KvIndex(const AttentionShape& s, int64_t b, int64_t kv, int64_t t) {
  return ((b * s.kv_heads + kv) * s.seq_len + t) * s.head_dim;
}

// P of one query row (keys 0..i; later keys are masked out) and what the GPU may differ by.
struct ProbabilityRow {
  std::vector<double> p, p_err;  // exact softmax, and the bound on the GPU's fp32 P
  std::vector<Rounded> pb;       // bf16(P), with the ambiguity of that rounding
  double lse = 0, lse_err = 0;
  // The forward's unnormalized terms: P̃_j = bf16(2^(x_j log2 e - m)), m = ceil(max x log2 e),
  // with the ambiguity of their rounding, and l = sum_j 2^(x_j log2 e - m) (relative error l_err).
  std::vector<Rounded> pt;
  double l = 0, l_err = 0;
};

ProbabilityRow Probabilities(const AttentionShape& s, const std::vector<double>& q, const std::vector<double>& k,
                             int64_t b, int64_t h, int64_t i) {
  const int64_t d = s.head_dim, n = i + 1;
  const double* qi = &q[QIndex(s, b, h, i)];
  std::vector<double> x(n), x_err(n);
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const double* kj = &k[KvIndex(s, b, h / s.group(), j)];
    double dot = 0, magnitude = 0;
    for (int64_t c = 0; c < d; ++c) {
      dot += qi[c] * kj[c];
      magnitude += std::abs(qi[c] * kj[c]);
    }
    x[j] = dot * s.scale;
    x_err[j] = kDotError * magnitude * s.scale + std::abs(x[j]) * 2 * kUlpF32;
    max = std::max(max, x[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(x[j] - max);
  ProbabilityRow row;
  row.lse = max + std::log(sum);
  // The GPU's LSE: its inputs' errors (an average of x_err weighted by P, at most their
  // max), the fp32 sum of n exp2 terms (relative n ulps, each exp2 within 2 ulps), the
  // rounding of max, log2 and the conversions (a few ulps of |LSE|).
  row.lse_err = *std::max_element(x_err.begin(), x_err.end()) + (n + 8) * kUlpF32 + 8 * kUlpF32 * std::abs(row.lse);
  row.p.resize(n);
  row.p_err.resize(n);
  row.pb.resize(n);
  row.pt.resize(n);
  // Any whole power of two gives the same O (bf16 rounding commutes with it); the kernels'
  // choice keeps the terms in (0, 1].
  const double m = std::ceil(max * M_LOG2E);
  double l_err = 0;
  for (int64_t j = 0; j < n; ++j) {
    row.p[j] = std::exp(x[j] - row.lse);
    // exp2(S * scale * log2e - LSE * log2e): the exponent's error (x, LSE, the two fp32
    // conversions), then exp2's 2 ulps.
    const double exponent_err = x_err[j] + row.lse_err + 4 * kUlpF32 * (std::abs(x[j]) + std::abs(row.lse));
    row.p_err[j] = row.p[j] * (std::expm1(exponent_err) + 4 * kUlpF32);
    row.pb[j] = RoundBf16Within(row.p[j], row.p_err[j]);
    // exp2(fp32(S * scale * log2e) - m): x's error, two fp32 roundings of the exponent, exp2's.
    const double t = std::exp2(x[j] * M_LOG2E - m);
    const double t_err = t * (std::expm1(x_err[j] + 4 * kUlpF32 * (std::abs(x[j]) + std::abs(m))) + 4 * kUlpF32);
    row.pt[j] = RoundBf16Within(t, t_err);
    row.l += t;
    l_err += t_err;
  }
  // l: its terms' errors and an fp32 sum of n terms.
  row.l_err = l_err / row.l + (n + 4) * kUlpF32;
  return row;
}

}  // namespace

AttentionForwardReference AttentionForward(const AttentionShape& s, const std::vector<double>& q,
                                           const std::vector<double>& k, const std::vector<double>& v,
                                           bool o_is_bf16) {
  const int64_t d = s.head_dim;
  AttentionForwardReference ref;
  ref.o.value.assign(s.q_elements(), 0);
  ref.o.tolerance.assign(s.q_elements(), 0);
  ref.lse.value.assign(s.rows(), 0);
  ref.lse.tolerance.assign(s.rows(), 0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.seq_len; ++i) {
        const ProbabilityRow row = Probabilities(s, q, k, b, h, i);
        const int64_t r = (b * s.heads + h) * s.seq_len + i;
        ref.lse.value[r] = row.lse;
        ref.lse.tolerance[r] = row.lse_err;
        double* o = &ref.o.value[QIndex(s, b, h, i)];
        double* tol = &ref.o.tolerance[QIndex(s, b, h, i)];
        // O = (sum_j P̃_j v_j) / l: the sum's accumulation and rounding ambiguity, scaled by
        // 1 / l, then l's relative error and the division's rounding.
        for (int64_t j = 0; j <= i; ++j) {
          const double* vj = &v[KvIndex(s, b, h / s.group(), j)];
          for (int64_t c = 0; c < d; ++c) {
            o[c] += row.pt[j].value * vj[c];
            tol[c] += kAccumulation * std::abs(row.pt[j].value * vj[c]) + row.pt[j].slack * std::abs(vj[c]);
          }
        }
        for (int64_t c = 0; c < d; ++c) {
          o[c] /= row.l;
          tol[c] = tol[c] / row.l + std::abs(o[c]) * (row.l_err + 2 * kUlpF32);
        }
        // A bf16 store rounds once more: within an ulp of bf16 (2^-7 relative at most,
        // counting a neighbour chosen by an fp32 sum at a boundary).
        if (o_is_bf16) {
          for (int64_t c = 0; c < d; ++c) tol[c] += 0x1p-7 * std::abs(o[c]);
        }
      }
    }
  }
  return ref;
}

AttentionBackwardReference AttentionBackward(const AttentionShape& s, const std::vector<double>& q,
                                             const std::vector<double>& k, const std::vector<double>& v,
                                             const std::vector<double>& dout, const std::vector<double>& o,
                                             DeltaDefinition delta_definition) {
  const int64_t d = s.head_dim;
  AttentionBackwardReference ref;
  for (ToleratedValues* t : {&ref.dq}) {
    t->value.assign(s.q_elements(), 0);
    t->tolerance.assign(s.q_elements(), 0);
  }
  for (ToleratedValues* t : {&ref.dk, &ref.dv}) {
    t->value.assign(s.kv_elements(), 0);
    t->tolerance.assign(s.kv_elements(), 0);
  }
  std::vector<double> dob(dout.size());
  for (size_t i = 0; i < dout.size(); ++i) dob[i] = Bf16(dout[i]);

  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kv = h / s.group();
      for (int64_t i = 0; i < s.seq_len; ++i) {
        const ProbabilityRow row = Probabilities(s, q, k, b, h, i);
        const double* doi = &dob[QIndex(s, b, h, i)];
        const double* oi = &o[QIndex(s, b, h, i)];
        const double* qi = &q[QIndex(s, b, h, i)];
        // dP of the row, and the bound on the GPU's fp32 dot products.
        std::vector<double> dp(i + 1), dp_err(i + 1);
        for (int64_t j = 0; j <= i; ++j) {
          const double* vj = &v[KvIndex(s, b, kv, j)];
          double dot = 0, magnitude = 0;
          for (int64_t c = 0; c < d; ++c) {
            dot += doi[c] * vj[c];
            magnitude += std::abs(doi[c] * vj[c]);
          }
          dp[j] = dot;
          dp_err[j] = kDotError * magnitude;
        }
        // Delta as the kernels compute it (O rounded to bf16, fp32 products and sum of D
        // terms), and, for the IR's definition, the distance between the two counted into
        // the GPU's error.
        double delta = 0, delta_magnitude = 0;
        for (int64_t c = 0; c < d; ++c) {
          const double ob = Bf16(oi[c]);
          delta += doi[c] * ob;
          delta_magnitude += std::abs(doi[c] * ob);
        }
        double delta_err = kDotError * delta_magnitude;
        if (delta_definition == DeltaDefinition::kIr) {
          double ir = 0;
          for (int64_t j = 0; j <= i; ++j) ir += dp[j] * row.p[j];
          delta_err += std::abs(ir - delta);
          delta = ir;
        }
        double* dq = &ref.dq.value[QIndex(s, b, h, i)];
        double* dq_tol = &ref.dq.tolerance[QIndex(s, b, h, i)];
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = row.p[j] * (dp[j] - delta) * s.scale;
          const double ds_err =
              s.scale * (row.p_err[j] * std::abs(dp[j] - delta) + row.p[j] * (dp_err[j] + delta_err)) +
              4 * kUlpF32 * std::abs(ds);
          const Rounded dsb = RoundBf16Within(ds, ds_err);
          const Rounded& pb = row.pb[j];
          const double* kj = &k[KvIndex(s, b, kv, j)];
          double* dk = &ref.dk.value[KvIndex(s, b, kv, j)];
          double* dk_tol = &ref.dk.tolerance[KvIndex(s, b, kv, j)];
          double* dv = &ref.dv.value[KvIndex(s, b, kv, j)];
          double* dv_tol = &ref.dv.tolerance[KvIndex(s, b, kv, j)];
          for (int64_t c = 0; c < d; ++c) {
            dq[c] += dsb.value * kj[c];
            dq_tol[c] += kAccumulation * std::abs(dsb.value * kj[c]) + dsb.slack * std::abs(kj[c]);
            dk[c] += dsb.value * qi[c];
            dk_tol[c] += kAccumulation * std::abs(dsb.value * qi[c]) + dsb.slack * std::abs(qi[c]);
            dv[c] += pb.value * doi[c];
            dv_tol[c] += kAccumulation * std::abs(pb.value * doi[c]) + pb.slack * std::abs(doi[c]);
          }
        }
      }
    }
  }
  return ref;
}

}  // namespace kiln::testing
