#include "tests/testing/all_ops.h"

#include <set>

#include "ir/builder.h"
#include "passes/fusion.h"
#include "ir/status_macros.h"

namespace kiln::testing {
namespace {

// Unwraps a builder result inside a test helper: a failure here is a bug in this file.
Node* Must(absl::StatusOr<Node*> n) {
  if (!n.ok()) {
    std::fprintf(stderr, "all_ops: %s\n", std::string(n.status().message()).c_str());
    std::abort();
  }
  return *n;
}

std::vector<Node*> Must(absl::StatusOr<std::vector<Node*>> results) {
  if (!results.ok()) {
    std::fprintf(stderr, "all_ops: %s\n", std::string(results.status().message()).c_str());
    std::abort();
  }
  return *results;
}

}  // namespace

std::unique_ptr<Module> BuildAllOpsModule() {
  auto m = std::make_unique<Module>("all_ops");
  Builder b(m->AddFunction("main"));
  const DType f32 = DType::kF32;
  Node* x = Must(b.Parameter("x", {f32, {2, 3, 4}}));
  Node* w = Must(b.Parameter("w", {f32, {4}}));
  Node* ids = Must(b.Parameter("ids", {DType::kI32, {2, 3}}));
  Node* table = Must(b.Parameter("table", {f32, {5, 4}}));
  Node* labels = Must(b.Parameter("labels", {DType::kI32, {6}}));
  Node* pos = Must(b.Parameter("pos", {DType::kI32, {3}}));

  b.set_scope("layers.0.unary");
  Node* u = x;
  for (Opcode op : {Opcode::kNeg, Opcode::kAbs, Opcode::kExp, Opcode::kLog, Opcode::kSqrt, Opcode::kRsqrt,
                    Opcode::kTanh, Opcode::kSigmoid, Opcode::kGelu}) {
    u = Must(b.Unary(op, u));
  }
  b.set_scope("layers.0.binary");
  Node* v = x;
  for (Opcode op : {Opcode::kAdd, Opcode::kSub, Opcode::kMul, Opcode::kDiv, Opcode::kMax, Opcode::kMin}) {
    v = Must(b.Binary(op, v, u));
  }
  Node* half = Must(b.Constant(0.5, {f32, {}}));
  Node* halfb = Must(b.BroadcastScalar(half, {2, 3, 4}));
  Node* pred = Must(b.Compare(v, halfb, "lt"));
  Node* sel = Must(b.Select(pred, v, u));
  Node* dense = Must(b.ConstantValues({1, -2.5, 3e-8, -0.0}, {f32, {4}}));
  Node* dense_b = Must(b.Broadcast(dense, {2}, {2, 3, 4}));
  Node* io = Must(b.Iota({DType::kI32, {2, 3, 4}}, 2));
  Node* iof = Must(b.Convert(io, f32));
  Node* sum0 = Must(b.Add(Must(b.Add(sel, dense_b)), iof));

  b.set_scope("layers.1.shape");
  Node* r = Must(b.Reshape(sum0, {6, 4}));
  Node* t = Must(b.Transpose(r, {1, 0}));
  Node* s = Must(b.Slice(t, {0, 1}, {4, 5}, {1, 2}));
  Node* cat = Must(b.Concatenate({s, s}, 1));
  Node* rs = Must(b.ReduceSum(cat, {1}));
  Node* rm = Must(b.ReduceMax(x, {0, 2}));
  Node* bf = Must(b.Convert(r, DType::kBF16));
  Node* dot = Must(b.DotGeneral(bf, Must(b.Convert(t, DType::kBF16)), {{}, {}, {1}, {0}}, f32));
  Node* bdot = Must(b.DotGeneral(x, x, {{0}, {0}, {2}, {2}}));
  // The backend form of `dot`: bf [6,4] as M x K, and t [4,6] as [K, N] (kn).
  const TensorType dot_type = dot->type();
  Node* gemm = Must(b.Op(Opcode::kGemm, {bf, Must(b.Convert(t, DType::kBF16))},
                         AttrMap{{"batch", int64_t{1}}, {"m", int64_t{6}}, {"n", int64_t{6}}, {"k", int64_t{4}},
                                 {"a_layout", Symbol{"mk"}}, {"b_layout", Symbol{"kn"}}, {"alpha", 1.0},
                                 {"beta", 0.0}, {"epilogue", Symbol{"none"}}},
                         &dot_type));
  dot = Must(b.Add(dot, gemm));

  b.set_scope("layers.1.composite");
  Node* g = Must(b.Gather(table, ids));
  Node* sc = Must(b.ScatterAdd(ids, g, {f32, {5, 4}}));
  Node* ln = Must(b.LayerNorm(x, w, w, 1e-5));  // w as the bias too: no new leaves
  Node* rn = Must(b.RmsNorm(ln, w, 1e-5));
  Node* gi = Must(b.Op(Opcode::kRmsNormGradInput, {x, w, rn}, AttrMap{{"eps", 1e-5}}));
  // The fused residual norms (fuse-residual-norm's), folded into gi's value so that the
  // outputs stay as they were: each form once, narrow results included.
  {
    const AttrMap to_bf16{{"eps", 1e-5}, {"out_dtype", Symbol{"bf16"}}};
    Node* rn_bf16 = Must(b.Op(Opcode::kRmsNorm, {x, w}, to_bf16));
    Node* ln_bf16 = Must(b.Op(Opcode::kLayerNorm, {x, w, w}, to_bf16));
    const std::vector<Node*> arn = Must(b.MultiResultOp(Opcode::kAddRmsNorm, {x, ln, w}, to_bf16));
    const std::vector<Node*> aln =
        Must(b.MultiResultOp(Opcode::kAddLayerNorm, {arn[0], x, w, w}, AttrMap{{"eps", 1e-5}}));
    const std::vector<Node*> dx_and_copy = Must(b.MultiResultOp(
        Opcode::kAddRmsNormGradInput, {aln[0], x, w, aln[1]}, AttrMap{{"eps", 1e-5}, {"copy_dtype", Symbol{"bf16"}}}));
    Node* dx = Must(b.Op(Opcode::kAddRmsNormGradInput, {dx_and_copy[0], x, w, rn}, AttrMap{{"eps", 1e-5}}));
    for (Node* narrow : {rn_bf16, ln_bf16, arn[1], dx_and_copy[1]}) gi = Must(b.Add(gi, Must(b.Convert(narrow, f32))));
    gi = Must(b.Add(gi, dx));
  }
  Node* gw = Must(b.Op(Opcode::kRmsNormGradWeight, {x, w, rn}, AttrMap{{"eps", 1e-5}}));
  // The input gradients with the weight gradient ({weight_grad=1}), folded into gi and gw.
  {
    const std::vector<Node*> dx_dw = Must(b.MultiResultOp(Opcode::kRmsNormGradInput, {x, w, rn},
                                                          AttrMap{{"eps", 1e-5}, {"weight_grad", int64_t{1}}}));
    const std::vector<Node*> dx_copy_dw = Must(
        b.MultiResultOp(Opcode::kAddRmsNormGradInput, {dx_dw[0], x, w, rn},
                        AttrMap{{"eps", 1e-5}, {"copy_dtype", Symbol{"bf16"}}, {"weight_grad", int64_t{1}}}));
    gi = Must(b.Add(gi, Must(b.Convert(dx_copy_dw[1], f32))));
    gi = Must(b.Add(gi, dx_copy_dw[0]));
    gw = Must(b.Add(gw, dx_dw[1]));
    gw = Must(b.Add(gw, dx_copy_dw[2]));
  }
  // layer_norm's fused input gradient (fuse-residual-norm's), with dw and db, and the residual
  // form with its copy, dw and db, folded into gi and gw likewise.
  {
    const std::vector<Node*> lgw = Must(b.MultiResultOp(Opcode::kLayerNormGradInput, {x, w, rn},
                                                        AttrMap{{"eps", 1e-5}, {"weight_grad", int64_t{1}}}));
    Node* lgi = lgw[0];
    gw = Must(b.Add(gw, lgw[1]));
    gw = Must(b.Add(gw, lgw[2]));
    const std::vector<Node*> lg = Must(
        b.MultiResultOp(Opcode::kAddLayerNormGradInput, {lgi, x, w, rn},
                        AttrMap{{"eps", 1e-5}, {"copy_dtype", Symbol{"bf16"}}, {"weight_grad", int64_t{1}}}));
    gi = Must(b.Add(gi, Must(b.Convert(lg[1], f32))));
    gi = Must(b.Add(gi, lg[0]));
    gw = Must(b.Add(gw, lg[2]));
    gw = Must(b.Add(gw, lg[3]));
  }
  Node* sm = Must(b.Softmax(r));
  Node* smg = Must(b.Op(Opcode::kSoftmaxGrad, {sm, r}));
  Node* ce = Must(b.CrossEntropy(smg, labels, /*classes=*/smg->type().dims[1]));
  Node* ceg = Must(b.CrossEntropyGrad(smg, labels, ce, ce->operand(0)->result(1), smg->type().dims[1]));

  // No new leaves or outputs (tests count them): the per-step scalars are one value in
  // (0, 1) computed from w, v = x^2 is >= 0, and the three results feed rope's input.
  b.set_scope("layers.1.optimizer");
  Node* second = Must(b.Mul(x, x));
  Node* scalar = Must(b.Unary(Opcode::kSigmoid, Must(b.ReduceMax(w, {0}))));
  // The clipping factor from a global norm: sigmoid(-sum_of_squares(...)) is in (0, 0.5].
  Node* clip = Must(b.Unary(Opcode::kSigmoid, Must(b.Unary(Opcode::kNeg, Must(b.Op(Opcode::kSumOfSquares, {x, second}))))));
  Node* state = nullptr;
  for (Node* updated : Must(b.MultiResultOp(Opcode::kAdamWUpdate, {x, sel, v, second, scalar, scalar, scalar, clip},
                                            AttrMap{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}}))) {
    state = state == nullptr ? updated : Must(b.Add(state, updated));
  }

  b.set_scope("layers.1.composite");
  Node* x4 = Must(b.Reshape(state, {1, 3, 2, 4}));
  Node* pos_i32 = Must(b.Convert(pos, DType::kI32));
  Node* ro = Must(b.Rope(x4, pos_i32, 10000.0));
  Node* rt = Must(b.Op(Opcode::kRopeTable, {pos_i32},
                       AttrMap{{"theta", 10000.0}, {"head_dim", int64_t{4}}, {"inverse", int64_t{1}}}));
  b.set_scope("");
  absl::Status st = b.Return({rs, rm, dot, bdot, sc, gi, gw, ceg, ro, rt});
  if (!st.ok()) std::abort();

  // The attention family in a function of its own: the flash kernels take head dims 64 and
  // 128 and sequences in multiples of 64 only, shapes @main's small tensors do not have.
  Builder a(m->AddFunction("attention"));
  const DType bf16 = DType::kBF16;
  Node* q = Must(a.Parameter("q", {bf16, {1, 2, 64, 64}}));
  Node* k = Must(a.Parameter("k", {bf16, {1, 1, 64, 64}}));
  Node* kv = Must(a.Parameter("v", {bf16, {1, 1, 64, 64}}));
  Node* dout = Must(a.Parameter("dout", {bf16, {1, 2, 64, 64}}));
  const AttrMap scale{{"scale", 0.125}};
  a.set_scope("layers.0.attn");
  const std::vector<Node*> attention = Must(a.MultiResultOp(Opcode::kAttention, {q, k, kv}, scale, {"o", "lse"}));
  Node* o = attention[0];
  Node* lse = attention[1];
  Node* delta = Must(a.Op(Opcode::kAttentionDelta, {o, dout}));
  std::vector<Node*> outputs = {o, lse, delta};
  for (Node* grad : Must(a.MultiResultOp(Opcode::kAttentionGrad, {q, k, kv, dout, lse, delta}, scale,
                                         {"dq", "dk", "dv"}))) {
    outputs.push_back(grad);
  }
  a.set_scope("");
  if (!a.Return(outputs).ok()) std::abort();

  // Fusion nodes, as fuse-loops makes them: a loop fusion (a broadcast, elementwise ops and a
  // convert) and a reduction fusion (squares summed), each over function inputs.
  Function* fused = m->AddFunction("fusion");
  Builder fb(fused);
  Node* fx = Must(fb.Parameter("x", {f32, {4, 8}}));
  Node* fw = Must(fb.Parameter("w", {f32, {8}}));
  fb.set_scope("layers.0.fused");
  Node* scaled = Must(fb.Mul(fx, Must(fb.Broadcast(fw, {1}, {4, 8}))));
  Node* act = Must(fb.Convert(Must(fb.Unary(Opcode::kTanh, scaled)), DType::kBF16));
  Node* squares = Must(fb.ReduceSum(Must(fb.Mul(fx, fx)), {1}));
  fb.set_scope("");
  if (!fb.Return({act, squares}).ok()) std::abort();
  absl::StatusOr<bool> made = FusionPass().RunOnFunction(*fused);
  if (!made.ok() || !*made) std::abort();

  // The gemm's FP8 slots: E4M3 operands with their scales, the output's scale, and the amax
  // as a second result (what select-fp8-gemm will make), of an fp8 D: the only D whose amax
  // the CUDA backend plans (ir/op_table.h).
  Function* fp8 = m->AddFunction("fp8_gemm");
  Builder gb(fp8);
  Node* qa = Must(gb.Parameter("a", {DType::kF8E4M3, {4, 8}}));
  Node* qb = Must(gb.Parameter("b", {DType::kF8E4M3, {2, 8}}));
  Node* a_scale = Must(gb.Parameter("a_scale", {f32, {}}));
  Node* b_scale = Must(gb.Parameter("b_scale", {f32, {}}));
  Node* d_scale = Must(gb.Parameter("d_scale", {f32, {}}));
  const AttrMap fp8_attrs{{"batch", int64_t{1}},     {"m", int64_t{4}},       {"n", int64_t{2}},
                          {"k", int64_t{8}},         {"a_layout", Symbol{"mk"}}, {"b_layout", Symbol{"nk"}},
                          {"alpha", 1.0},            {"beta", 0.0},           {"epilogue", Symbol{"none"}},
                          {"scaled", int64_t{1}},    {"amax", int64_t{1}}};
  const std::vector<Node*> d_and_amax = fp8->AppendMultiResultNode(
      Opcode::kGemm, {qa, qb, a_scale, b_scale, d_scale}, fp8_attrs,
      {TensorType{DType::kF8E4M3, {4, 2}}, TensorType{f32, {}}}, {"d", "amax"}, "layers.0.fp8");
  if (d_and_amax.size() != 2 || !gb.Return(d_and_amax).ok()) std::abort();

  // Delayed scaling's ops, as the FP8 policy uses them (passes/fp8_policy.h): x quantized with
  // its transposed copy by a state of 4 amaxes of history, the copy dequantized, the state
  // stepped with the amax.
  Builder sb(m->AddFunction("fp8_scaling"));
  Node* sx = Must(sb.Parameter("x", {DType::kBF16, {4, 8}}));
  Node* fp8_state = Must(sb.Parameter("state", {f32, {6}}));
  sb.set_scope("layers.0.fp8");
  const std::vector<Node*> quantized =
      Must(sb.MultiResultOp(Opcode::kFp8Quantize, {sx, fp8_state},
                            AttrMap{{"out_dtype", Symbol{"f8e4m3"}}, {"transposed", int64_t{1}}},
                            {"q", "amax", "scale_inv", "q_t"}));
  Node* dequantized =
      Must(sb.Op(Opcode::kFp8Dequantize, {quantized[3], quantized[2]}, AttrMap{{"out_dtype", Symbol{"bf16"}}}));
  Node* next_state = Must(sb.Op(Opcode::kFp8ScaleUpdate, {fp8_state, quantized[1]},
                                AttrMap{{"fp8_format", Symbol{"f8e4m3"}}, {"margin", int64_t{0}}}));
  // And as fuse-fp8-scale-update leaves them: a quantize that also steps its own state.
  Node* fused_state = Must(sb.Parameter("fused_state", {f32, {6}}));
  const std::vector<Node*> self_stepped = Must(
      sb.MultiResultOp(Opcode::kFp8Quantize, {sx, fused_state},
                       AttrMap{{"out_dtype", Symbol{"f8e5m2"}}, {"update_state", int64_t{1}}, {"margin", int64_t{1}}},
                       {"q5", "amax5", "scale_inv5", "next_fused_state"}));
  sb.set_scope("");
  if (!sb.Return({quantized[0], dequantized, next_state, self_stepped[0], self_stepped[3]}).ok()) std::abort();

  // The paged-KV ops, as the inference functions use them (frontends/llama_inference.h): a
  // pool of 2 layers x 3 blocks x 1 kv head x 4 slots x 8, rows written into layer 1 (slot -1
  // writes nothing), then attention of 2 sequences x 2 queries x 2 heads through block tables
  // (a negative position is a padding row); once in f32 and once with a bf16 pool.
  Builder pb(m->AddFunction("paged_kv"));
  Node* pool = Must(pb.Parameter("pool", {f32, {2, 3, 1, 4, 8}}));
  Node* rows = Must(pb.Parameter("rows", {f32, {3, 1, 8}}));
  Node* queries = Must(pb.Parameter("queries", {f32, {2, 2, 2, 8}}));
  pb.set_scope("layers.1.attn");
  std::vector<Node*> paged_outputs;
  for (DType dtype : {f32, DType::kBF16}) {
    // Each constant used once (tests/ir_dot_test.cc hides single-use constants).
    Node* slots = Must(pb.ConstantValues({5, 0, -1}, {DType::kI32, {3}}));
    Node* tables = Must(pb.ConstantValues({1, 0, 2, 1}, {DType::kI32, {2, 2}}));
    Node* positions = Must(pb.ConstantValues({5, 6, -1, 3}, {DType::kI32, {2, 2}}));
    Node* typed_pool = Must(pb.Convert(pool, dtype));
    Node* written = Must(pb.Op(Opcode::kKvCacheWrite, {typed_pool, rows, slots}, AttrMap{{"layer", int64_t{1}}}));
    Node* typed_q = Must(pb.Convert(queries, dtype));
    paged_outputs.push_back(Must(pb.Op(Opcode::kPagedAttention, {typed_q, written, typed_pool, tables, positions},
                                       AttrMap{{"layer", int64_t{1}}, {"scale", 0.35}})));
  }
  pb.set_scope("");
  if (!pb.Return(paged_outputs).ok()) std::abort();

  // sample_tokens, as the inference functions end: 2 x 3 rows of 50 bf16 logits, the rows
  // greedy, temperature alone, top-k, top-p and both, and one of parameters out of range.
  Builder tb(m->AddFunction("sampling"));
  Node* logits = Must(tb.Parameter("logits", {DType::kBF16, {2, 3, 50}}));
  Node* sampling = Must(tb.ConstantValues({0, 0, 1, 0.8, 0, 1, 1.2, 5, 1, 1, 0, 0.5, 0.7, 10, 0.9, -1, 0, 1},
                                          {f32, {2, 3, 3}}));
  Node* draws = Must(tb.ConstantValues({1, 0, 0, 2, 0, 3, -7, 9, 4, 5, 1, 0, 6, 0, 1, 8, 0, 2}, {DType::kI32, {2, 3, 3}}));
  Node* tokens = Must(tb.Op(Opcode::kSampleTokens, {logits, sampling, draws}, AttrMap{}));
  if (!tb.Return({tokens}).ok()) std::abort();
  return m;
}

std::vector<Opcode> OpsMissingFromAllOpsModule() {
  std::unique_ptr<Module> m = BuildAllOpsModule();
  std::set<Opcode> used;
  for (const auto& f : m->functions()) {
    for (const auto& n : f->nodes()) used.insert(n->opcode());
  }
  std::vector<Opcode> missing;
  for (int i = 0; i < kNumOpcodes; ++i) {
    if (!used.count(static_cast<Opcode>(i))) missing.push_back(static_cast<Opcode>(i));
  }
  return missing;
}

}  // namespace kiln::testing
