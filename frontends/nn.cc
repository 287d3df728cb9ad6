#include "frontends/nn.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

// Node order follows statement order here, never argument order (which C++ leaves to the
// compiler), so the printed IR is the same whatever built it.

// [B,T,H,Dh] <-> [B,H,T,Dh]; the permutation is its own inverse.
const std::vector<int64_t> kSwapSeqAndHeads = {0, 2, 1, 3};

// k or v [B,KV,T,Dh] -> [B,KV*G,T,Dh], query head h reading kv head h / G.
Tensor RepeatKvHeads(Tensor kv, int64_t groups, Loc loc) {
  if (groups == 1) return kv;
  const int64_t b = kv.dim(0), n_kv = kv.dim(1), t = kv.dim(2), d = kv.dim(3);
  Tensor repeated = Broadcast(kv, {0, 1, 3, 4}, {b, n_kv, groups, t, d}, loc);
  return Reshape(repeated, {b, n_kv * groups, t, d}, loc);
}

}  // namespace

Tensor Linear(Tensor x, Tensor weight, DType gemm_dtype, DType result_dtype, Loc loc) {
  DotDims dims{.lhs_contract = {x.rank() - 1}, .rhs_contract = {1}};
  Tensor lhs = Convert(x, gemm_dtype, loc);
  Tensor rhs = Convert(weight, gemm_dtype, loc);
  return DotGeneral(lhs, rhs, dims, result_dtype, loc);
}

Tensor Linear(Tensor x, Tensor weight, DType gemm_dtype, Loc loc) {
  return Linear(x, weight, gemm_dtype, DType::kF32, loc);
}

Tensor Conv1D(Tensor x, Tensor weight, Tensor bias, DType gemm_dtype, DType result_dtype, Loc loc) {
  DotDims dims{.lhs_contract = {x.rank() - 1}, .rhs_contract = {0}};
  Tensor lhs = Convert(x, gemm_dtype, loc);
  Tensor rhs = Convert(weight, gemm_dtype, loc);
  Tensor y = DotGeneral(lhs, rhs, dims, DType::kF32, loc);
  if (!y.ok()) return y;
  if (result_dtype == DType::kF32) return Add(y, Broadcast(bias, {y.rank() - 1}, y.type().dims, loc), loc);
  // Autocast's biased linear: the bias rounded to result_dtype, added to the f32 accumulator,
  // the sum rounded once (what cuBLASLt's bias epilogue computes for a narrow D).
  Tensor narrow_bias = Convert(Convert(bias, result_dtype, loc), DType::kF32, loc);
  return Convert(Add(y, Broadcast(narrow_bias, {y.rank() - 1}, y.type().dims, loc), loc), result_dtype, loc);
}

Tensor Conv1D(Tensor x, Tensor weight, Tensor bias, DType gemm_dtype, Loc loc) {
  return Conv1D(x, weight, bias, gemm_dtype, DType::kF32, loc);
}

Tensor Embedding(Tensor table, Tensor ids, Loc loc) { return Gather(table, ids, loc); }

Tensor RMSNorm(Tensor x, Tensor weight, double eps, Loc loc) { return RmsNorm(x, weight, eps, loc); }

Tensor Positions(Graph& graph, int64_t seq_len, Loc loc) {
  return graph.Iota(TensorType{DType::kI32, {seq_len}}, 0, loc);
}

Tensor RoPE(Tensor x, Tensor positions, double theta, Loc loc) { return Rope(x, positions, theta, loc); }

Tensor CausalSelfAttention(Tensor x, const AttentionWeights& weights, const AttentionShape& shape,
                           DType gemm_dtype, Loc loc) {
  if (!x.ok()) return x;  // failed: every op below would be a no-op
  Graph& graph = *x.graph();
  const int64_t b = x.dim(0), t = x.dim(1);
  const int64_t h = shape.n_heads, n_kv = shape.n_kv_heads, d = shape.head_dim;
  if (n_kv <= 0 || h % n_kv != 0) {
    graph.Fail(absl::InvalidArgumentError(absl::StrCat("attention at ", FormatLocation(loc), ": ", h,
                                                       " query heads are not a multiple of ", n_kv, " kv heads")));
    return Tensor(&graph, nullptr);
  }

  x = Convert(x, gemm_dtype, loc);  // once for q, k and v (Linear adds none for it then)
  // q, k and v are activations: stored in gemm_dtype (autocast), as RoPE's results.
  Tensor q = Reshape(Linear(x, weights.q_proj, gemm_dtype, gemm_dtype, loc), {b, t, h, d}, loc);
  Tensor k = Reshape(Linear(x, weights.k_proj, gemm_dtype, gemm_dtype, loc), {b, t, n_kv, d}, loc);
  Tensor v = Reshape(Linear(x, weights.v_proj, gemm_dtype, gemm_dtype, loc), {b, t, n_kv, d}, loc);
  Tensor positions = Positions(graph, t, loc);
  q = Transpose(RoPE(q, positions, shape.rope_theta, loc), kSwapSeqAndHeads, loc);
  k = Transpose(RoPE(k, positions, shape.rope_theta, loc), kSwapSeqAndHeads, loc);
  v = Transpose(v, kSwapSeqAndHeads, loc);
  return Linear(CausalAttentionCore(q, k, v, gemm_dtype, loc), weights.o_proj, gemm_dtype, loc);
}

Tensor CausalAttentionCore(Tensor q, Tensor k, Tensor v, DType gemm_dtype, Loc loc) {
  if (!q.ok()) return q;
  Graph& graph = *q.graph();
  const int64_t b = q.dim(0), h = q.dim(1), t = q.dim(2), d = q.dim(3), n_kv = k.dim(1);
  k = RepeatKvHeads(k, h / n_kv, loc);
  v = RepeatKvHeads(v, h / n_kv, loc);

  const DotDims qk{.lhs_batch = {0, 1}, .rhs_batch = {0, 1}, .lhs_contract = {3}, .rhs_contract = {3}};
  q = Convert(q, gemm_dtype, loc);
  k = Convert(k, gemm_dtype, loc);
  Tensor scores = DotGeneral(q, k, qk, DType::kF32, loc);
  scores = Mul(scores, 1.0 / std::sqrt(static_cast<double>(d)), loc);

  const std::vector<int64_t> scores_shape = {b, h, t, t};
  TensorType square{DType::kI32, {t, t}};
  Tensor query_index = graph.Iota(square, 0, loc);
  Tensor key_index = graph.Iota(square, 1, loc);
  Tensor causal = Broadcast(Compare(query_index, key_index, "ge", loc), {2, 3}, scores_shape, loc);
  Tensor minus_inf = BroadcastScalar(graph.Scalar(-std::numeric_limits<double>::infinity(), DType::kF32, loc),
                                     scores_shape, loc);
  scores = Select(causal, scores, minus_inf, loc);
  Tensor probs = Softmax(scores, loc);

  const DotDims pv{.lhs_batch = {0, 1}, .rhs_batch = {0, 1}, .lhs_contract = {3}, .rhs_contract = {2}};
  probs = Convert(probs, gemm_dtype, loc);
  v = Convert(v, gemm_dtype, loc);
  Tensor out = DotGeneral(probs, v, pv, DType::kF32, loc);
  return Reshape(Transpose(out, kSwapSeqAndHeads, loc), {b, t, h * d}, loc);
}

Tensor PagedSelfAttention(Tensor x, const AttentionWeights& weights, const AttentionShape& shape, DType gemm_dtype,
                          int64_t layer, PagedKv& kv, Loc loc) {
  if (!x.ok()) return x;
  const int64_t b = x.dim(0), t = x.dim(1);
  const int64_t h = shape.n_heads, n_kv = shape.n_kv_heads, d = shape.head_dim;
  x = Convert(x, gemm_dtype, loc);  // once for q, k and v
  Tensor q, k, v;
  if (weights.qkv_proj.ok()) {
    Tensor qkv = Linear(x, weights.qkv_proj, gemm_dtype, loc);  // f32 [b, t, (h + 2 kv) d]
    q = Slice(qkv, {0, 0, 0}, {b, t, h * d}, loc);
    k = Slice(qkv, {0, 0, h * d}, {b, t, (h + n_kv) * d}, loc);
    v = Slice(qkv, {0, 0, (h + n_kv) * d}, {b, t, (h + 2 * n_kv) * d}, loc);
  } else {
    q = Linear(x, weights.q_proj, gemm_dtype, loc);
    k = Linear(x, weights.k_proj, gemm_dtype, loc);
    v = Linear(x, weights.v_proj, gemm_dtype, loc);
  }
  q = Reshape(q, {b, t, h, d}, loc);
  k = Reshape(k, {b, t, n_kv, d}, loc);
  v = Reshape(v, {b, t, n_kv, d}, loc);
  // RoPE takes one position per row of dim 1: every token of the batch as one row of B*T.
  Tensor flat_positions = Reshape(kv.positions, {b * t}, loc);
  auto rope = [&](Tensor y, int64_t heads) {
    Tensor rows = Reshape(y, {1, b * t, heads, d}, loc);
    return RoPE(rows, flat_positions, shape.rope_theta, loc);
  };
  Tensor q_rows = rope(q, h);
  Tensor k_rows = Reshape(rope(k, n_kv), {b * t, n_kv, d}, loc);
  Tensor v_rows = Reshape(v, {b * t, n_kv, d}, loc);
  Tensor flat_slots = Reshape(kv.slots, {b * t}, loc);
  kv.k_pool = KvCacheWrite(kv.k_pool, Convert(k_rows, gemm_dtype, loc), flat_slots, layer, loc);
  kv.v_pool = KvCacheWrite(kv.v_pool, Convert(v_rows, gemm_dtype, loc), flat_slots, layer, loc);
  if (kv.fresh_prompts) {
    // Every key is a token of this call, at the index its position is: the training
    // forward's attention, as CausalSelfAttention builds it, RoPE at positions 0..T-1 (the
    // real tokens' own, so q and k are the bits written above; padding, after a row's real
    // tokens, is seen by nobody). Its own RoPE, not the rows written above: then each has
    // one reader, fuse-cache-write folds the writes into the kernel computing their rows, and
    // merge-cache-write-siblings joins them with the transposes, as a decode step's are. The
    // core rounds q, k and v to gemm_dtype as the pool writes do; it rounds P to gemm_dtype
    // where paged_attention keeps it f32.
    Tensor positions = Positions(*x.graph(), t, loc);
    auto heads_first = [&](Tensor y, int64_t heads, bool rope) {
      y = Reshape(y, {b, t, heads, d}, loc);
      if (rope) y = RoPE(y, positions, shape.rope_theta, loc);
      return Transpose(y, kSwapSeqAndHeads, loc);
    };
    Tensor out = CausalAttentionCore(heads_first(q, h, true), heads_first(k, n_kv, true), heads_first(v, n_kv, false),
                                     gemm_dtype, loc);
    return Linear(out, weights.o_proj, gemm_dtype, loc);
  }
  q = Convert(Reshape(q_rows, {b, t, h, d}, loc), gemm_dtype, loc);
  Tensor out = PagedAttention(q, kv.k_pool, kv.v_pool, kv.block_tables, kv.positions, layer,
                              1.0 / std::sqrt(static_cast<double>(d)), loc);
  out = Reshape(out, {b, t, h * d}, loc);
  return Linear(out, weights.o_proj, gemm_dtype, loc);
}

Tensor Silu(Tensor x, Loc loc) { return Mul(x, Sigmoid(x, loc), loc); }

Tensor SwiGLU(Tensor x, const MlpWeights& weights, DType gemm_dtype, Loc loc) {
  x = Convert(x, gemm_dtype, loc);  // once for gate and up
  // gate, up and their product are activations, stored in gemm_dtype (autocast); the down
  // projection joins the f32 residual stream and stays f32.
  Tensor gate, up;
  if (weights.gate_up_proj.ok()) {
    Tensor gate_up = Linear(x, weights.gate_up_proj, gemm_dtype, gemm_dtype, loc);  // [..., 2F]
    if (!gate_up.ok()) return gate_up;
    std::vector<int64_t> start(gate_up.type().dims.size(), 0), limit = gate_up.type().dims;
    const int64_t f = limit.back() / 2;
    limit.back() = f;
    gate = Slice(gate_up, start, limit, loc);
    start.back() = f;
    limit.back() = 2 * f;
    up = Slice(gate_up, start, limit, loc);
  } else {
    gate = Linear(x, weights.gate_proj, gemm_dtype, gemm_dtype, loc);
    up = Linear(x, weights.up_proj, gemm_dtype, gemm_dtype, loc);
  }
  return Linear(Mul(Silu(gate, loc), up, loc), weights.down_proj, gemm_dtype, loc);
}

// The logits are rounded to gemm_dtype as autocast's are; cross_entropy reads them in f32.
Tensor LmHead(Tensor x, Tensor weight, DType gemm_dtype, Loc loc) {
  return Linear(x, weight, gemm_dtype, gemm_dtype, loc);
}

Tensor CrossEntropyLoss(Tensor logits, Tensor labels, int64_t classes, Loc loc) {
  const int64_t rows = logits.dim(0) * logits.dim(1), vocab = logits.dim(2);
  Tensor flat_logits = Reshape(logits, {rows, vocab}, loc);
  Tensor flat_labels = Reshape(labels, {rows}, loc);
  Tensor per_row = CrossEntropy(flat_logits, flat_labels, classes, loc);
  // A failed logits tensor has rows == 0; the op is a no-op then, so 1/0 never reaches IR.
  return Mul(ReduceSum(per_row, {0}, loc), rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0, loc);
}

}  // namespace kiln
