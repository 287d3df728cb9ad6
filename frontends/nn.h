// Transformer layers over frontends/tensor.h, built from primitive IR ops so that passes
// see (and may rewrite) every step. Shapes: B batch, T sequence, D model width, H query
// heads, KV key/value heads, G = H / KV, Dh head dim, V vocabulary, F MLP hidden size.
//
// GEMM precision: every layer that multiplies matrices takes `gemm_dtype`. Both operands of
// each dot_general are converted to it (no convert node when they already have it) and the
// dot_general accumulates in f32. Its result is rounded once to the layer's result dtype:
// under kBF16 an activation (q, k, v, SwiGLU's gate and up, GPT-2's qkv and MLP hidden) is
// stored bf16 as autocast stores it, and the elementwise ops after it (RoPE, SiLU, GELU, the
// gate product) compute in f32 and round to bf16 as autocast's do, and so are the LM head's
// logits (the loss reads them in f32); a GEMM whose result joins the f32 residual stream (the
// attention and MLP output projections) keeps f32, so the residual add is exact and can be
// the GEMM's C. With kF32 the
// graph has no converts at all. This is DESIGN.md's policy.
//
// The causal self-attention pattern, which select-flash-attention matches node by node
// (one layer; `cvt` is convert to gemm_dtype, absent under f32):
//
//   x = cvt(x)                                       shared by the q, k, v Linears
//   q = reshape(Linear(x, Wq), [B,T,H,Dh])          Linear: see below
//   k = reshape(Linear(x, Wk), [B,T,KV,Dh])
//   v = reshape(Linear(x, Wv), [B,T,KV,Dh])
//   pos = iota i32[T] {dim=0}                        one node, shared by both ropes
//   q = transpose(rope(q, pos), [0,2,1,3])           [B,H,T,Dh]
//   k = transpose(rope(k, pos), [0,2,1,3])           [B,KV,T,Dh]
//   v = transpose(v, [0,2,1,3])                      [B,KV,T,Dh]
//   if G > 1 (GQA; absent when G == 1), query head h reads kv head h / G:
//     k = reshape(broadcast(k, dims=[0,1,3,4]) : [B,KV,G,T,Dh], [B,H,T,Dh]), v likewise
//   s = dot_general(cvt(q), cvt(k)) {lhs_batch=[0,1], rhs_batch=[0,1], lhs_contract=[3],
//                                    rhs_contract=[3], out_dtype=f32}       [B,H,T,T]
//   s = mul(s, broadcast(constant f32[] 1/sqrt(Dh), dims=[]))
//   keep = compare(iota i32[T,T] {dim=0}, iota i32[T,T] {dim=1}) {direction=ge}
//                                                    query row >= key column
//   s = select(broadcast(keep, dims=[2,3]) : pred[B,H,T,T], s,
//              broadcast(constant f32[] -inf, dims=[]))
//   p = softmax(s)
//   o = dot_general(cvt(p), cvt(v)) {lhs_batch=[0,1], rhs_batch=[0,1], lhs_contract=[3],
//                                    rhs_contract=[2], out_dtype=f32}       [B,H,T,Dh]
//   o = reshape(transpose(o, [0,2,1,3]), [B,T,H*Dh])
//   out = Linear(o, Wo)
#pragma once

#include <cstdint>

#include "frontends/tensor.h"

namespace kiln {

// y = x · Wᵀ for x [..., in] and weight [out, in] (Hugging Face's layout) -> f32 [..., out]:
// dot_general(cvt(x), cvt(W)) contracting x's last dim with W's dim 1, no batch dims.
Tensor Linear(Tensor x, Tensor weight, DType gemm_dtype, Loc loc = Loc::current());
// The same with the result rounded to result_dtype (the f32 accumulator rounded once).
Tensor Linear(Tensor x, Tensor weight, DType gemm_dtype, DType result_dtype, Loc loc = Loc::current());

// y = x · W + b for x [..., in], weight [in, out] (GPT-2's Conv1D layout, as Hugging Face
// stores it) and bias [out] -> f32 [..., out]: dot_general(cvt(x), cvt(W)) contracting x's
// last dim with W's dim 0, then add(y, broadcast(b)). (A cuBLASLt bias epilogue would fold
// the add into the GEMM: a later optimization; fuse-loops fuses it with its consumers.)
Tensor Conv1D(Tensor x, Tensor weight, Tensor bias, DType gemm_dtype, Loc loc = Loc::current());
// The same with a result_dtype other than f32 as autocast's biased linear computes it: the
// bias rounded to result_dtype, added to the f32 accumulator, the sum rounded once:
// convert(add(y, broadcast(convert(convert(b, result_dtype), f32))), result_dtype), the form
// gemm-bias-epilogue folds into a narrow GEMM with a narrow bias.
Tensor Conv1D(Tensor x, Tensor weight, Tensor bias, DType gemm_dtype, DType result_dtype,
              Loc loc = Loc::current());

// Rows of table [V, D] picked by integer ids [...] -> [..., D] (gather).
Tensor Embedding(Tensor table, Tensor ids, Loc loc = Loc::current());

// x * rsqrt(mean(x², last dim) + eps) * weight, one rms_norm op computed in f32.
Tensor RMSNorm(Tensor x, Tensor weight, double eps, Loc loc = Loc::current());

// Positions 0..T-1 as i32[T] (iota), for RoPE.
Tensor Positions(Graph& graph, int64_t seq_len, Loc loc = Loc::current());

// Rotary embedding of x [B,T,H,Dh] at `positions` i32[T], Hugging Face rotate-half
// convention, frequencies theta^(-2i/Dh).
Tensor RoPE(Tensor x, Tensor positions, double theta, Loc loc = Loc::current());

struct AttentionWeights {
  Tensor q_proj;  // [H*Dh, D]
  Tensor k_proj;  // [KV*Dh, D]
  Tensor v_proj;  // [KV*Dh, D]
  Tensor o_proj;  // [D, H*Dh]
  // Or, instead of q, k and v (PagedSelfAttention only): their rows joined, [(H+2KV)*Dh, D],
  // one GEMM whose result is sliced into q, k and v.
  Tensor qkv_proj;
};

struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;
  double rope_theta = 10000.0;
};

// Causal grouped-query self-attention of x [B,T,D] -> f32 [B,T,D], built exactly as the
// pattern at the top of this file.
Tensor CausalSelfAttention(Tensor x, const AttentionWeights& weights, const AttentionShape& shape,
                           DType gemm_dtype, Loc loc = Loc::current());

// The part of CausalSelfAttention after the projections and RoPE, from the pattern above:
// q [B,H,T,Dh], k and v [B,KV,T,Dh] (KV divides H) -> the GQA repeat, the causal softmax
// attention and o = reshape(transpose(...), [B,T,H*Dh]), f32. GPT-2 (frontends/gpt2.h) feeds
// it q, k, v split from one fused c_attn projection.
Tensor CausalAttentionCore(Tensor q, Tensor k, Tensor v, DType gemm_dtype, Loc loc = Loc::current());

// The paged-KV cache one self-attention reads and writes (inference only; the ops are in
// ir/op_table.h). positions, slots: i32 [B,T] (a token's position in its sequence and the
// flat pool slot its K/V goes to; padding: position -1, slot -1); block_tables i32 [B,M];
// k_pool, v_pool [L, NB, KV, BS, Dh] of the GEMM dtype, replaced by the written pools.
struct PagedKv {
  Tensor positions;
  Tensor slots;
  Tensor block_tables;
  Tensor k_pool;
  Tensor v_pool;
  // The caller's promise that every row holds the first tokens of a prompt none of which is
  // cached: row b's tokens are positions 0, 1, ... of its sequence, its padding after them.
  // Then every key a token attends to is a token of the same call, and the attention is
  // CausalAttentionCore over the call's own q, k and v (select-flash-attention makes it one
  // flash kernel, whose query tiles share each K/V tile, where paged_attention reads a
  // query's keys for that query alone); K and V are still written into the pools for the
  // decode steps after.
  bool fresh_prompts = false;
};

// CausalSelfAttention of x [B,T,D] with the keys and values of earlier tokens in the pools:
// the same projections and RoPE (each token at its own position), K and V of these tokens
// written into layer `layer` of the pools (kv_cache_write), then paged_attention over keys
// 0..position through the block tables (with kv.fresh_prompts, CausalAttentionCore over the
// call's own keys instead). With the pools holding the K/V of every earlier token it computes
// what CausalSelfAttention computes for these rows, to the rounding of the same precision
// policy. -> f32 [B,T,D]
Tensor PagedSelfAttention(Tensor x, const AttentionWeights& weights, const AttentionShape& shape, DType gemm_dtype,
                          int64_t layer, PagedKv& kv, Loc loc = Loc::current());

// silu(x) = x * sigmoid(x).
Tensor Silu(Tensor x, Loc loc = Loc::current());

struct MlpWeights {
  Tensor gate_proj;  // [F, D]
  Tensor up_proj;    // [F, D]
  Tensor down_proj;  // [D, F]
  // Or, instead of gate and up: their rows joined, [2F, D], one GEMM sliced in two.
  Tensor gate_up_proj;
};

// down(silu(gate(x)) * up(x)) for x [..., D] -> f32 [..., D]. Each element of a sliced joint
// projection is the same sum as the separate projection's, so both forms compute the same.
Tensor SwiGLU(Tensor x, const MlpWeights& weights, DType gemm_dtype, Loc loc = Loc::current());

// Logits [B,T,V] in gemm_dtype (bf16 under the bf16 policy, as autocast's) from hidden
// states [B,T,D] and the head weight [V, D] (a Linear).
Tensor LmHead(Tensor x, Tensor weight, DType gemm_dtype, Loc loc = Loc::current());

// Mean token cross-entropy f32[] of logits [B,T,V] against labels [B,T]:
// cross_entropy on [B*T,V] and [B*T], then reduce_sum and mul by 1/(B*T). classes > 0:
// logits' last `V - classes` columns are padding (a vocabulary padded for the GEMMs).
Tensor CrossEntropyLoss(Tensor logits, Tensor labels, int64_t classes = 0, Loc loc = Loc::current());

}  // namespace kiln
