// The one table of kiln ops (DESIGN.md principle 1). Adding an op means adding a row here;
// the enum, the printed names, the arity and the category all come from this list, and
// tests/op_table_test.cc fails until the op has shape inference, reference semantics, a VJP
// rule and a lowering.
//
// Columns: X(Enum, "text_name", arity, category, result, results, "attributes")
//   arity     number of operands; kVariadic for one or more (a fusion's: its body's
//             parameters, any number)
//   category  what kind of computation (drives generic passes and codegen)
//   result    kInferred: type follows from operands and attributes;
//             kDeclared: the node's written type is part of its meaning (a parameter's
//             shape, a reshape's target) and inference checks it against the operands.
//   results   how many typed results a node of the op has (kVariableResults: a fusion
//             has one per output of its body, a gemm two when it writes its amax,
//             add_rms_norm_grad_input two when it writes a copy, the rms_norm input
//             gradients one more when they write the weight gradient, the layer_norm ones
//             two more: dw and db, adamw_update three per parameter group). An op with
//             several (AdamW's p', m', v'; attention's output and LSE) is one node whose results are read
//             through get_result nodes that follow it directly, one per result, in order
//             (ir/graph.h); cross_entropy's loss and LSE likewise; the text form writes
//             them as one line,
//               %p2, %m2, %v2 = adamw_update(...) {...} : (f32[..], f32[..], f32[..])
//   attributes every attribute the op takes, comma-separated; the verifier rejects any
//             other (ir/op_attributes.h)
//
// Semantics and attributes (all shapes static; "x" is operand 0):
//   parameter()            {index}                     function input number `index`
//   constant()             {value} or {values=[...]}   splat, or dense row-major values
//   iota()                 {dim}                       element = its index along `dim`
//   neg/abs/exp/log/sqrt/rsqrt/tanh/sigmoid/gelu(x)    float elementwise; gelu is the tanh
//                          approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   add/sub/mul/div/max/min(a, b)                      same types on both sides
//   compare(a, b)          {direction=eq|ne|lt|le|gt|ge}  -> pred
//   select(p, a, b)                                    p ? a : b; p is pred of the same shape
//   convert(x)             result dtype declared; float->narrow rounds to nearest even
//   broadcast(x)           {dims}   operand dim i maps to result dim dims[i] (size equal or 1)
//   reshape(x)             result shape declared, same element count
//   transpose(x)           {perm}   result dim i is operand dim perm[i]
//   slice(x)               {start, limit, stride}
//   concatenate(x, ...)    {dim}
//   reduce_sum/reduce_max(x) {dims}  the listed dims are removed
//   dot_general(a, b)      {lhs_batch, rhs_batch, lhs_contract, rhs_contract, [out_dtype]}
//                          result dims: batch, a's free dims, b's free dims (in order);
//                          out_dtype (default a's dtype) is the result type; a float sum is
//                          the f32 accumulator (rounded to f32), then rounded to a narrower
//                          out_dtype (bf16, f16, fp8) from there, as the gemm below
//   gemm(a, b[, c][, bias])  {batch, m, n, k, a_layout=mk|km, b_layout=nk|kn, alpha, beta,
//                          epilogue=none|bias}  the backend form of dot_general (passes/lower_gemm.h):
//                          for each of `batch` matrices, D = alpha A B + beta C with A M x K
//                          and B K x N, each operand's bytes read as they lie in memory (a as
//                          [batch, M, K] for mk or [batch, K, M] for km, b as [batch, N, K] for
//                          nk or [batch, K, N] for kn), D row-major [batch, M, N] in the
//                          declared result type (any dims of that element count; its dtype f32
//                          or the operands'). c, of the result's type, is given iff beta != 0.
//                          Products summed over K in order, in f32 for narrow operands.
//                          Rounding, exactly as the reference computes it (cuBLASLt's f32
//                          compute and scale type: its epilogue works on the f32 accumulator):
//                            acc = f32(sum);  t = f32(alpha acc);  D = f32(t + f32(beta C))
//                          then D is rounded to the result dtype. So a bf16 result is the f32
//                          result converted (narrow-activations-bf16 relies on it: no double
//                          rounding of its own), and add(gemm(a, b), x) is gemm(a, b, x)
//                          {beta=1} bit for bit (elide-grad-zeroing). cuBLASLt may fuse
//                          alpha acc + beta C into one fma; that agrees with the above whenever
//                          alpha is a power of two or beta is 0, which is all kiln emits.
//                          epilogue=bias (passes/gemm_bias_epilogue.h): an operand bias [n] of the
//                          result's dtype follows c (or b); each row of D gets it added
//                          after the above, D = f32(D + f32(bias[j])) for column j, before the
//                          rounding to the result dtype (cuBLASLt's CUBLASLT_EPILOGUE_BIAS).
//                          Operand positions: ir/gemm_slots.h.
//                          FP8 slots (issue 14 fills them): with {scaled=1}, three f32[]
//                          operands follow (a_scale, b_scale, d_scale), a and b may be fp8
//                          (e4m3/e5m2) and D any float type:
//                            D = d_scale (alpha a_scale b_scale A B + beta C)
//                          (alpha' = f32(alpha a_scale b_scale) takes alpha's place above,
//                          and D = f32(d_scale D) before the result dtype)
//                          (cuBLASLt's scale pointers); with {amax=1} the node has a second
//                          result, f32[]: max |alpha a_scale b_scale A B + beta C|, before
//                          d_scale (cuBLASLt's AMAX_D), what delayed scaling records. The IR
//                          and the reference define it for any D, but the CUDA backend plans
//                          amax=1 for an fp8 D only (cuBLASLt computes AMAX_D for no other;
//                          GemmPlan::CheckSupported refuses it): the amax of a bf16/f16/f32
//                          result must come from the kernel that consumes that result.
//   fp8_quantize(x, state)  {out_dtype=f8e4m3|f8e5m2, [transposed]}  x cast to FP8 with the
//                          delayed scale its state holds (fp8_scale_update below), for an FP8
//                          GEMM (passes/fp8_policy.h): x any float tensor of rank >= 1, state f32
//                          [L + 2]; with e = floor(state[0]) clamped to [-64, 64] the scale is 2^e:
//                            q = out_dtype(x 2^e)  (one rounding, to nearest even, saturating to
//                                the format's largest finite value; NaN stays NaN)
//                            amax = max |x| over every element (NaN if any is; 0 for no element)
//                            scale_inv = 2^-e
//                          results (q, amax, scale_inv[, q_t]), amax and scale_inv f32[]. A power
//                          of two scales exactly, so q 2^-e is x rounded to the format's grid,
//                          and a GEMM of (q, scale_inv) is the GEMM of those values. With
//                          transposed=1 a last result q_t: q of x viewed as [R, C] (C its last
//                          dim) transposed to [C, R], the K-inner copy a TN FP8 GEMM reads
//                          (Hopper's cuBLASLt takes FP8 in TN only), written by the same kernel.
//                          With update_state=1 {margin} a last result next_state: exactly
//                          fp8_scale_update(state, amax) {fp8_format=out_dtype, margin}, the
//                          state's next value computed by the quantize's kernel once it has the
//                          amax (fuse-fp8-scale-update makes it). Results in order: q, amax,
//                          scale_inv, [q_t], [next_state].
//                          Not differentiable (the policy adds it after autodiff).
//   fp8_dequantize(q, scale_inv)  {out_dtype}  q fp8, scale_inv f32[]: out_dtype(q scale_inv),
//                          the float values an fp8_quantize stands for (exact for its power-of-two
//                          scale_inv and a bf16/f16/f32 out_dtype). select-fp8-gemm replaces the
//                          ones its GEMMs read; the rest run as a kernel. Not differentiable.
//   fp8_scale_update(state, amax)  {fp8_format=f8e4m3|f8e5m2, margin}  delayed scaling's step:
//                          state f32[L + 2] holds [e, overflows, amax_1 .. amax_L] (the scale's
//                          exponent, the count of overflowed steps, the L most recent amaxes,
//                          newest first; all zero is the initial state: scale 1, no history),
//                          amax f32[] this step's max |x|. Result: the next state.
//                            amax not finite (an overflow): history kept, overflows + 1,
//                              e - 1 (the scale backs off by half)
//                            else: history shifted with amax first; m = its max; when m > 0,
//                              e = (the largest integer with m 2^e <= the format's max finite
//                              value, 448 or 57344) - margin, clamped to [-64, 64]; else e kept
//                          Not differentiable.
//   gather(table, idx)     rows of table along dim 0: idx.dims ++ table.dims[1:]
//   scatter_add(idx, upd)  declared result [V, ...]: sums upd rows into row idx; the
//                          gradient of gather (indices out of range are dropped)
//   rms_norm(x, w)         {eps, [out_dtype]}  y = x * rsqrt(mean(x^2, last) + eps) * w,
//                          computed in f32. With out_dtype (x must then be f32) y is that f32
//                          result rounded to out_dtype: convert(rms_norm(x, w)) bit for bit
//                          (fuse-residual-norm makes it where every use of y converts it)
//   rms_norm_grad_input(x, w, dy)  {eps, [weight_grad]}  dL/dx. With weight_grad=1 a second
//                          result, rms_norm_grad_weight(x, w, dy) {eps} (w's type), written by
//                          the same kernels, which read x and dy once for both (results
//                          (dx, dw); made by fuse-residual-norm, and then not differentiable).
//                          dx is the same either way; dw is defined as rms_norm_grad_weight's
//                          reference value, and the GPU sums it in another fixed order (per
//                          block of rows, then the blocks in order, in f32), which its
//                          tolerance covers, as it does rms_norm_grad_weight's own kernel's
//   rms_norm_grad_weight(x, w, dy) {eps}  dL/dw, summed over all leading dims
//   layer_norm(x, w, b)    {eps, [out_dtype]}  y = (x - mean) * rsqrt(var + eps) * w + b over
//                          the last dim (var = mean((x - mean)^2), biased), computed in f32;
//                          w, b [D]; out_dtype as rms_norm's. Its VJP is
//                          rms_norm_grad_input/_weight of the centered x (layer_norm(x)
//                          = rms_norm(x - mean(x), w) + b), dx centered again, db a reduce_sum
//                          (fuse-residual-norm makes that decomposition one
//                          layer_norm_grad_input on the finished step)
//   add_rms_norm(h, branch, w)  {eps, [out_dtype]}  a residual add and the norm of its sum in
//                          one kernel; h and branch f32 of one shape; results (sum, y):
//                            sum = f32(h + branch);  y = rms_norm(sum, w) {eps, out_dtype}
//                          so sum is add(h, branch) and y convert(rms_norm(add(h, branch), w))
//                          bit for bit (out_dtype default f32: no convert). Made by
//                          fuse-residual-norm after autodiff; not differentiable.
//   add_layer_norm(h, branch, w, b)  {eps, [out_dtype]}  the same with layer_norm(sum, w, b)
//   add_rms_norm_grad_input(dres, x, w, dy)  {eps, [copy_dtype]}  a residual gradient plus the
//                          norm's input gradient, in one kernel; dres and x f32 of one shape:
//                            dx = f32(dres + rms_norm_grad_input(x, w, dy))
//                          add(dres, rms_norm_grad_input(x, w, dy)) bit for bit. With copy_dtype
//                          a second result, convert(dx) to copy_dtype, written by the same
//                          kernel (the bf16 operand of the GEMMs that read dx). With
//                          weight_grad=1 a last result, rms_norm_grad_weight(x, w, dy) {eps},
//                          as rms_norm_grad_input's: results (dx, [copy,] dw). Made by
//                          fuse-residual-norm; not differentiable.
//   layer_norm_grad_input(x, w, dy)  {eps, [weight_grad]}  dL/dx of layer_norm(x, w, b) in one
//                          row kernel (llm.c's layernorm_backward), per row of length D:
//                            mean = sum(x) / D;  r = (sum((x - mean)^2) / D + eps)^-1/2
//                            xhat = (x - mean) r;  g = w dy
//                            dx = r (g - mean(g) - xhat mean(g xhat))
//                          the value of LayerNormVjp's decomposition (rms_norm_grad_input of the
//                          centered x, centered again) without its intermediates rounded to f32,
//                          so the two agree to f32 rounding, not bit for bit. With weight_grad=1
//                          two more results of w's type: dw = sum over rows of dy xhat
//                          (rms_norm_grad_weight of the centered x) and db = sum over rows of dy
//                          (the bias gradient's reduce_sum), which the GPU sums as
//                          rms_norm_grad_input's dw (per-block partials, folded in block order):
//                          results (dx, dw, db). Made by fuse-residual-norm from that
//                          decomposition; not differentiable.
//   add_layer_norm_grad_input(dres, x, w, dy)  {eps, [copy_dtype], [weight_grad]}  its residual
//                          form, as add_rms_norm_grad_input's:
//                            dx = f32(dres + layer_norm_grad_input(x, w, dy))
//                          a copy of dx with copy_dtype, dw and db with weight_grad=1: results
//                          (dx, [copy,] [dw, db]). Made by fuse-residual-norm; not differentiable.
//   softmax(x)             over the last dim, computed in f32
//   softmax_grad(y, dy)    dL/dx given y = softmax(x)
//   cross_entropy(logits, labels)  {classes}  logits [N, V] of any float dtype (the math is
//                          f32), labels [N]; results (loss, lse), both f32 [N]:
//                            lse = logsumexp(logits[n, :C]);  loss = lse - logits[n, label]
//                          the per-row loss -log softmax(logits)[label] and the log-sum-exp
//                          that cross_entropy_grad takes, so the backward never reduces the
//                          row again. Optional classes C (1 <= C <= V, default V): only the
//                          first C columns are classes (softmax over them, labels in [0, C));
//                          columns C.. are padding that the loss never reads, so a vocabulary
//                          padded for the GEMMs (GPT-2's 50257 -> 50304) needs no slice
//   cross_entropy_grad(logits, labels, dloss, lse)  {classes, [out_dtype]}  dL/dlogits given
//                          each row's lse (f32 [N], cross_entropy's second result):
//                            dlogits = (exp(logits - lse) - onehot(label)) dloss
//                          elementwise, so one pass over the logits; 0 in the padding columns.
//                          Computed in f32 and rounded once to the result dtype: out_dtype,
//                          default the logits' dtype. So with out_dtype it is
//                          convert(cross_entropy_grad(...)) bit for bit when the logits are f32
//                          (narrow-activations-bf16 makes it where every use of the f32
//                          gradient converts it to bf16, the LM head GEMMs' operand). Its VJP
//                          treats lse as the operand it is (the chain through cross_entropy's
//                          lse result adds the softmax's coupling back)
//   rope(x, pos)           {theta, inverse}  x [B,T,H,D], pos i32 [T]; Hugging Face
//                          rotate-half convention; inverse=1 rotates by -angle (the VJP).
//                          With i < D/2, angle = (inverse ? -1 : 1) pos[t] theta^(-2i/D) and
//                          cos, sin computed in double and rounded to f32 (rope_table's
//                          c, s), in f32 (each product and sum rounded, as the mul/sub/add
//                          expand-rope writes it as):  out[i] = x[i] c - x[i + D/2] s;
//                          out[i + D/2] = x[i + D/2] c + x[i] s; then rounded to x's dtype
//   rope_table(pos)        {theta, head_dim, inverse}  f32 [T, head_dim]: row t holds the
//                          f32 cos of rope's angles for frequencies 0..D/2-1, then their
//                          sin (expand-rope's table, read by broadcasts)
//   adamw_update(p, g, m, v, step_size, decay, sqrt_bc2, grad_scale)  {beta1, beta2, eps}
//                          one AdamW step, computed in f32; p, g, m, v share one f32 type,
//                          the last four are f32[] per-step scalars (lr / (1 - beta1^t),
//                          1 - lr wd or 1, sqrt(1 - beta2^t), and the global-norm clipping
//                          factor or 1): with g the f32 product g * grad_scale (the clipped
//                          gradient, scaled as it is read, never stored),
//                            m' = beta1 m + (1 - beta1) g;  v' = beta2 v + (1 - beta2) g^2
//                            p' = p decay - step_size m' / (sqrt(v') / sqrt_bc2 + eps)
//                          results (p', m', v'), written by one kernel in place. Not
//                          differentiable. Grouped (group-optimizer-updates makes it): K >= 1
//                          parameter groups sharing the scalars and attributes,
//                            adamw_update(p_1, g_1, m_1, v_1, ..., p_K, g_K, m_K, v_K,
//                                         step_size, decay, sqrt_bc2, grad_scale)
//                          results (p'_1, m'_1, v'_1, ..., p'_K, m'_K, v'_K): group i is the
//                          update above of its own four tensors (each group its own f32 type),
//                          so result 3i+j is computed element by element from operands 4i..4i+3
//                          alone; one kernel for all groups. K = 1 is the node above.
//   sum_of_squares(x, ...)  the sum of the squares of every element of every operand (floats
//                          of one dtype, any shapes), f32[]: the global gradient norm's square
//                          in one node, read by one multi-tensor kernel instead of a reduction
//                          per gradient. The reference sums in double and rounds once; the
//                          kernel sums f32 partials in a fixed order (deterministic; within
//                          a reduction's tolerance of the reference). Not differentiable.
//   fusion(x, ...)         {kind=loop|reduction}  one generated kernel computing its body, a
//                          function held by the node (ir/fusion.h): the body's parameter i is
//                          operand i, its outputs are the node's results. loop: every body node
//                          an elementwise op, broadcast, reshape, transpose, iota or splat
//                          constant, computed element by element; reduction: the same feeding
//                          one reduce_sum/reduce_max, the body's output. Made by fuse-loops
//                          after autodiff; not differentiable.
//   get_result(x)          {index}  result `index` of the multi-result node x; always placed
//                          right after x, every result of x present once (the verifier checks)
//   attention(q, k, v)     {scale, [out_dtype]}  causal softmax attention under the bf16
//                          policy; q bf16 [B,H,T,D], k and v bf16 [B,Hkv,T,D], H a multiple of
//                          Hkv (query head h reads kv head h / (H/Hkv)); O f32 [B,H,T,D], or
//                          with {out_dtype=bf16} (bf16 only) that f32 O rounded once to bf16,
//                          so convert(O) bit for bit (narrow-activations-bf16 sets it where
//                          every use rounds O to bf16: the o projection's operand and
//                          attention_delta, which rounds it itself; cuDNN and FlashAttention
//                          store bf16 O too). LSE f32 either way:
//                            S = (q kᵀ) scale, key > query masked; P rounded to bf16 before
//                            its normalization (so one pass over the keys computes it):
//                            m_i = ceil(max_j S_ij log2 e), P̃_ij = bf16(2^(S_ij log2 e - m_i)),
//                            l_i = sum_j 2^(S_ij log2 e - m_i) (f32, unrounded terms),
//                            O_i = (sum_j P̃_ij v_j) / l_i, accumulated in f32. bf16 rounding
//                            commutes with powers of 2, so O is sum_j bf16(e^S_ij) v_j /
//                            sum_j e^S_ij whatever whole m_i is chosen: kernels rescaling a
//                            power-of-two running max differ from it by f32 rounding only.
//                            It differs from the decomposed bf16(softmax(S)) v by bf16 noise
//                            of P (relative 2^-9 a term)
//                            LSE = logsumexp of each masked, scaled row of S (the backward's)
//                          (select-flash-attention makes it from the decomposed pattern;
//                          kernels/flash_attention.cuh never stores S or P)
//   attention_delta(o, do) f32 [B,H,T]: Delta_i = sum_d bf16(do_id) bf16(o_id), o f32 or
//                          bf16 and do float [B,H,T,D]; both rounded to bf16 as FlashAttention
//                          and cuDNN compute it from their bf16 O, so an f32 O and the same O
//                          stored bf16 (attention {out_dtype=bf16}) give the same Delta
//   attention_grad(q, k, v, do, lse, delta)  {scale}  with do bf16 [B,H,T,D]; results (dq, dk, dv):
//                            P = exp(S - lse) (f32); dS = P (do vᵀ - delta) scale
//                            dq = bf16(dS) k; dk = bf16(dS)ᵀ q, dv = bf16(P)ᵀ do (summed over the
//                            query heads of each kv head); f32, q's or k's shape. Not
//                            differentiable (the VJP of attention).
//   kv_cache_write(pool, x, slots)  {layer}  the paged KV pool with token rows written in:
//                          pool f32 or bf16 [L, NB, Hkv, BS, D] (layers, blocks, kv heads, block
//                          size, head dim: DESIGN.md's layout), x float [N, Hkv, D], slots i32 [N]
//                          flat slots (block * BS + offset). Result: pool's type, equal to pool
//                          except pool[layer, s / BS, h, s % BS, :] = x[i, h, :] rounded to pool's
//                          dtype for each i with s = slots[i] >= 0 (slot -1: a padding row, writes
//                          nothing). Slots beyond NB * BS and duplicate slots are the caller's
//                          error (the reference reports them; a kernel skips the first and races
//                          on the second). The result is meant to be donated back to the pool's
//                          parameter (Function::output_aliases). Not differentiable.
//   paged_attention(q, k_pool, v_pool, block_tables, positions)  {layer, scale, out_dtype?}  causal
//                          attention of each query over keys 0..its position, the keys and
//                          values read from the pool through the block table: q float [B, T, H,
//                          D], pools of one float type [L, NB, Hkv, BS, D] (H a multiple of Hkv;
//                          query head h reads kv head h / (H/Hkv)), block_tables i32 [B, M],
//                          positions i32 [B, T]; f32 [B, T, H, D], or with {out_dtype} (a float
//                          type) that f32 result rounded once to it. For query (b, t) at p =
//                          positions[b, t] >= 0, key j <= p is at pool[layer, block_tables[b, j /
//                          BS], g, j % BS, :]:
//                            S_j = f32(f32(q . k_j) f32(scale)); P = softmax(S) (f32, not rounded);
//                            O = f32(sum_j P_j v_j)
//                          (QK^T of the pools' dtype with an f32 result, as the forward's; P is
//                          not rounded to the pools' dtype as the forward's PV GEMM rounds it, so
//                          that a decode kernel may split the keys over blocks, each with a softmax
//                          of its own, and differ from this only in the order of f32 sums). A negative p is a padding row: O = 0. A position
//                          beyond M * BS or a block id outside [0, NB) is the caller's error (the
//                          reference reports it). Prefill (T tokens of one sequence, their K/V
//                          written first) and decode (one token per sequence) both use it. Not
//                          differentiable.
//   sample_tokens(logits, sampling, draws)  the next token of each row: logits float [..., V],
//                          sampling f32 [..., 3] (temperature, top_k, top_p), draws i32 [..., 3]
//                          (the seed's low and high 32 bits, the draw index) -> i32 [...]. Each
//                          row's token is ir/token_sampling.h's SampleToken of its logits (in
//                          f32) and parameters: greedy at temperature 0 or top_k 1, else drawn
//                          with the row's (seed, draw) after top-k and top-p; -1 for a row with no
//                          token (a NaN or +inf logit, every logit -inf, parameters out of range,
//                          a top_k that is not a whole number). Not differentiable.
#pragma once

#include "absl/strings/string_view.h"

namespace kiln {

inline constexpr int kVariadic = -1;
inline constexpr int kVariableResults = -1;  // a fusion: one per output of its body; a gemm 1 or 2, the input gradients 1 to 4, adamw_update 3 per group

enum class OpCategory {
  kLeaf,         // parameter, constant, iota
  kUnary,        // float elementwise, one operand
  kBinary,       // elementwise, two operands of one type
  kCompare,      // elementwise, pred result
  kSelect,       // elementwise, three operands
  kConvert,      // elementwise dtype change
  kDataMovement, // broadcast, reshape, transpose, slice, concatenate
  kReduction,    // reduce_*
  kContraction,  // dot_general
  kIndexing,     // gather, scatter_add
  kComposite,    // one kernel is the natural unit: norms, softmax, cross-entropy, RoPE, AdamW
  kResult,       // get_result: one result of a multi-result node, no computation
  kFusion,       // fusion: a body of other ops, computed by one generated kernel
};

enum class ResultRule { kInferred, kDeclared };

#define KILN_OPS(X)                                                                                                       \
  X(kParameter, "parameter", 0, kLeaf, kDeclared, 1, "index")                                                             \
  X(kConstant, "constant", 0, kLeaf, kDeclared, 1, "value,values")                                                        \
  X(kIota, "iota", 0, kLeaf, kDeclared, 1, "dim")                                                                         \
  X(kNeg, "neg", 1, kUnary, kInferred, 1, "")                                                                             \
  X(kAbs, "abs", 1, kUnary, kInferred, 1, "")                                                                             \
  X(kExp, "exp", 1, kUnary, kInferred, 1, "")                                                                             \
  X(kLog, "log", 1, kUnary, kInferred, 1, "")                                                                             \
  X(kSqrt, "sqrt", 1, kUnary, kInferred, 1, "")                                                                           \
  X(kRsqrt, "rsqrt", 1, kUnary, kInferred, 1, "")                                                                         \
  X(kTanh, "tanh", 1, kUnary, kInferred, 1, "")                                                                           \
  X(kSigmoid, "sigmoid", 1, kUnary, kInferred, 1, "")                                                                     \
  X(kGelu, "gelu", 1, kUnary, kInferred, 1, "")                                                                           \
  X(kAdd, "add", 2, kBinary, kInferred, 1, "")                                                                            \
  X(kSub, "sub", 2, kBinary, kInferred, 1, "")                                                                            \
  X(kMul, "mul", 2, kBinary, kInferred, 1, "")                                                                            \
  X(kDiv, "div", 2, kBinary, kInferred, 1, "")                                                                            \
  X(kMax, "max", 2, kBinary, kInferred, 1, "")                                                                            \
  X(kMin, "min", 2, kBinary, kInferred, 1, "")                                                                            \
  X(kCompare, "compare", 2, kCompare, kInferred, 1, "direction")                                                          \
  X(kSelect, "select", 3, kSelect, kInferred, 1, "")                                                                      \
  X(kConvert, "convert", 1, kConvert, kDeclared, 1, "")                                                                   \
  X(kBroadcast, "broadcast", 1, kDataMovement, kDeclared, 1, "dims")                                                      \
  X(kReshape, "reshape", 1, kDataMovement, kDeclared, 1, "")                                                              \
  X(kTranspose, "transpose", 1, kDataMovement, kInferred, 1, "perm")                                                      \
  X(kSlice, "slice", 1, kDataMovement, kInferred, 1, "start,limit,stride")                                                \
  X(kConcatenate, "concatenate", kVariadic, kDataMovement, kInferred, 1, "dim")                                           \
  X(kReduceSum, "reduce_sum", 1, kReduction, kInferred, 1, "dims")                                                        \
  X(kReduceMax, "reduce_max", 1, kReduction, kInferred, 1, "dims")                                                        \
  X(kDotGeneral, "dot_general", 2, kContraction, kInferred, 1, "lhs_batch,rhs_batch,lhs_contract,rhs_contract,out_dtype") \
  X(kGemm, "gemm", kVariadic, kContraction, kDeclared, kVariableResults, "batch,m,n,k,a_layout,b_layout,alpha,beta,epilogue,scaled,amax")            \
  X(kFp8Quantize, "fp8_quantize", 2, kComposite, kInferred, kVariableResults, "out_dtype,transposed,update_state,margin")                \
  X(kFp8Dequantize, "fp8_dequantize", 2, kComposite, kInferred, 1, "out_dtype")                                         \
  X(kFp8ScaleUpdate, "fp8_scale_update", 2, kComposite, kInferred, 1, "fp8_format,margin")                              \
  X(kGather, "gather", 2, kIndexing, kInferred, 1, "")                                                                    \
  X(kScatterAdd, "scatter_add", 2, kIndexing, kDeclared, 1, "")                                                           \
  X(kRmsNorm, "rms_norm", 2, kComposite, kInferred, 1, "eps,out_dtype")                                                   \
  X(kRmsNormGradInput, "rms_norm_grad_input", 3, kComposite, kInferred, kVariableResults, "eps,weight_grad")            \
  X(kRmsNormGradWeight, "rms_norm_grad_weight", 3, kComposite, kInferred, 1, "eps")                                       \
  X(kLayerNorm, "layer_norm", 3, kComposite, kInferred, 1, "eps,out_dtype")                                               \
  X(kAddRmsNorm, "add_rms_norm", 3, kComposite, kInferred, 2, "eps,out_dtype")                                            \
  X(kAddLayerNorm, "add_layer_norm", 4, kComposite, kInferred, 2, "eps,out_dtype")                                        \
  X(kAddRmsNormGradInput, "add_rms_norm_grad_input", 4, kComposite, kInferred, kVariableResults, "eps,copy_dtype,weight_grad") \
  X(kLayerNormGradInput, "layer_norm_grad_input", 3, kComposite, kInferred, kVariableResults, "eps,weight_grad")        \
  X(kAddLayerNormGradInput, "add_layer_norm_grad_input", 4, kComposite, kInferred, kVariableResults, "eps,copy_dtype,weight_grad") \
  X(kSoftmax, "softmax", 1, kComposite, kInferred, 1, "")                                                                 \
  X(kSoftmaxGrad, "softmax_grad", 2, kComposite, kInferred, 1, "")                                                        \
  X(kCrossEntropy, "cross_entropy", 2, kComposite, kInferred, 2, "classes")                                               \
  X(kCrossEntropyGrad, "cross_entropy_grad", 4, kComposite, kInferred, 1, "classes,out_dtype")                            \
  X(kRope, "rope", 2, kComposite, kInferred, 1, "theta,inverse")                                                          \
  X(kRopeTable, "rope_table", 1, kComposite, kInferred, 1, "theta,head_dim,inverse")                                     \
  X(kAdamWUpdate, "adamw_update", kVariadic, kComposite, kInferred, kVariableResults, "beta1,beta2,eps")                \
  X(kSumOfSquares, "sum_of_squares", kVariadic, kComposite, kInferred, 1, "")                                            \
  X(kAttention, "attention", 3, kComposite, kInferred, 2, "scale,out_dtype")                                              \
  X(kAttentionDelta, "attention_delta", 2, kComposite, kInferred, 1, "")                                                  \
  X(kAttentionGrad, "attention_grad", 6, kComposite, kInferred, 3, "scale")                                               \
  X(kKvCacheWrite, "kv_cache_write", 3, kIndexing, kInferred, 1, "layer")                                                 \
  X(kPagedAttention, "paged_attention", 5, kComposite, kInferred, 1, "layer,scale,out_dtype")                                \
  X(kSampleTokens, "sample_tokens", 3, kComposite, kInferred, 1, "")                                                      \
  X(kGetResult, "get_result", 1, kResult, kInferred, 1, "index")                                                          \
  X(kFusion, "fusion", kVariadic, kFusion, kDeclared, kVariableResults, "kind")

enum class Opcode {
#define KILN_OP_ENUM(e, name, arity, cat, rule, results, attrs) e,
  KILN_OPS(KILN_OP_ENUM)
#undef KILN_OP_ENUM
};

#define KILN_OP_COUNT(e, name, arity, cat, rule, results, attrs) +1
inline constexpr int kNumOpcodes = 0 KILN_OPS(KILN_OP_COUNT);
#undef KILN_OP_COUNT

struct OpInfo {
  Opcode opcode;
  absl::string_view name;
  int arity;
  OpCategory category;
  ResultRule result;
  int num_results;  // typed results of a node of this op (see `results` above)
  // The attributes the op takes, comma-separated, required and optional alike (their
  // meaning is in the semantics above); ir/op_attributes.h reads them.
  absl::string_view attributes;
};

const OpInfo& GetOpInfo(Opcode op);
inline absl::string_view OpName(Opcode op) { return GetOpInfo(op).name; }
// nullptr when `name` is not an op.
const OpInfo* FindOpByName(absl::string_view name);
bool IsElementwise(Opcode op);  // unary, binary, compare, select, convert
// Every node of `op` has several results, read through get_result nodes. (A fusion has as
// many as its body returns: ask the node, Node::has_multiple_results.)
inline bool HasMultipleResults(Opcode op) { return GetOpInfo(op).num_results > 1; }

}  // namespace kiln
