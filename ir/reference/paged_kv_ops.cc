// kv_cache_write and paged_attention (ir/op_table.h) in double, rounding where the
// definition rounds: the K/V pool [L, NB, Hkv, BS, D] is addressed through flat slots
// (block * BS + offset) and per-sequence block tables.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "ir/numerics.h"
#include "ir/reference/kernels.h"
#include "ir/status_macros.h"

namespace kiln::reference {
namespace {

struct PoolDims {
  int64_t layers, blocks, kv_heads, block_size, head_dim;
  explicit PoolDims(const TensorType& pool)
      : layers(pool.dims[0]), blocks(pool.dims[1]), kv_heads(pool.dims[2]), block_size(pool.dims[3]),
        head_dim(pool.dims[4]) {}
  // The offset of pool[layer, block, head, offset, 0].
  int64_t Row(int64_t layer, int64_t block, int64_t head, int64_t offset) const {
    return (((layer * blocks + block) * kv_heads + head) * block_size + offset) * head_dim;
  }
};

double F32(double v) { return RoundToDType(v, DType::kF32); }

}  // namespace

absl::StatusOr<HostTensor> EvalKvCacheWrite(const Node& node, Operands xs, const EvalContext& ctx) {
  (void)ctx;
  ASSIGN_OR_RETURN(int64_t layer, node.attrs().GetInt("layer"));
  const PoolDims p(xs[0]->type());
  const HostTensor& x = *xs[1];
  const std::vector<double>& slots = xs[2]->values();
  const int64_t capacity = p.blocks * p.block_size;
  for (int64_t i = 0; i < static_cast<int64_t>(slots.size()); ++i) {
    if (slots[i] < -1 || slots[i] >= capacity) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", slots[i], " of row ", i, " is outside [0, ", capacity,
                                                     ") (", p.blocks, " blocks of ", p.block_size,
                                                     " tokens; -1 writes nothing)"));
    }
    for (int64_t j = 0; j < i; ++j) {
      if (slots[j] == slots[i] && slots[i] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("rows ", j, " and ", i, " both write slot ", slots[i], ": a slot holds one token"));
      }
    }
  }
  HostTensor out = *xs[0];
  double* dst = out.mutable_values().data();
  const double* src = x.values().data();
  for (int64_t i = 0; i < static_cast<int64_t>(slots.size()); ++i) {
    if (slots[i] < 0) continue;
    const int64_t slot = static_cast<int64_t>(slots[i]);
    for (int64_t h = 0; h < p.kv_heads; ++h) {
      const double* row = src + (i * p.kv_heads + h) * p.head_dim;
      std::copy(row, row + p.head_dim, dst + p.Row(layer, slot / p.block_size, h, slot % p.block_size));
    }
  }
  return out;  // rounded to the pool's dtype by the evaluator
}

absl::StatusOr<HostTensor> EvalPagedAttention(const Node& node, Operands xs, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(int64_t layer, node.attrs().GetInt("layer"));
  ASSIGN_OR_RETURN(double scale_attr, node.attrs().GetFloat("scale"));
  const double scale = F32(scale_attr);
  const TensorType& qt = xs[0]->type();
  const int64_t batch = qt.dims[0], seq = qt.dims[1], heads = qt.dims[2], d = qt.dims[3];
  const PoolDims p(xs[1]->type());
  const int64_t group = heads / p.kv_heads;
  const std::vector<double>& tables = xs[3]->values();
  const int64_t max_blocks = xs[3]->type().dims[1];
  const std::vector<double>& positions = xs[4]->values();
  // Data checks first, so that a bad table is an error and not a read out of bounds.
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const double pos = positions[b * seq + t];
      if (pos < 0) continue;
      if (pos >= max_blocks * p.block_size) {
        return absl::InvalidArgumentError(absl::StrCat("position ", pos, " of query [", b, ",", t, "] is beyond the ",
                                                       max_blocks, " blocks of ", p.block_size,
                                                       " tokens a block table row holds"));
      }
      for (int64_t j = 0; j <= static_cast<int64_t>(pos) / p.block_size; ++j) {
        const double block = tables[b * max_blocks + j];
        if (block < 0 || block >= p.blocks) {
          return absl::InvalidArgumentError(absl::StrCat("block_tables[", b, ",", j, "] = ", block,
                                                         " is outside the pool's ", p.blocks, " blocks (query [", b,
                                                         ",", t, "] at position ", pos, " reads it)"));
        }
      }
    }
  }
  HostTensor out(node.type());
  const double* q = xs[0]->values().data();
  const double* k = xs[1]->values().data();
  const double* v = xs[2]->values().data();
  double* o = out.mutable_values().data();
  ctx.pool.ParallelFor(batch * seq * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> scores;
    std::vector<int64_t> rows;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item % heads, bt = item / heads, b = bt / seq;
      const double pos = positions[bt];
      if (pos < 0) continue;  // a padding row: O = 0
      const int64_t keys = static_cast<int64_t>(pos) + 1;
      const double* qi = q + item * d;
      scores.resize(keys);
      rows.resize(keys);
      double max = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        const int64_t block = static_cast<int64_t>(tables[b * max_blocks + j / p.block_size]);
        rows[j] = p.Row(layer, block, h / group, j % p.block_size);
        double dot = 0;
        for (int64_t x = 0; x < d; ++x) dot += qi[x] * k[rows[j] + x];
        scores[j] = F32(F32(dot) * scale);
        max = std::max(max, scores[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < keys; ++j) sum += std::exp(scores[j] - max);
      double* oi = o + item * d;
      for (int64_t j = 0; j < keys; ++j) {
        const double prob = F32(std::exp(scores[j] - max) / sum);
        for (int64_t x = 0; x < d; ++x) oi[x] += prob * v[rows[j] + x];
      }
      // O is f32; with {out_dtype} the evaluator then rounds it once more, to that dtype, so
      // a narrow result is exactly convert(paged_attention) of the same inputs.
      for (int64_t x = 0; x < d; ++x) oi[x] = F32(oi[x]);
    }
  });
  return out;
}

}  // namespace kiln::reference
