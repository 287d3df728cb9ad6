#include "tests/testing/random_graph.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/builder.h"
#include "ir/status_macros.h"

namespace kiln::testing {
namespace {

constexpr DType kF32 = DType::kF32;

class GraphGenerator {
 public:
  GraphGenerator(uint64_t seed, Function* f) : rng_(seed), b_(f) {}

  absl::Status Build(const RandomGraphOptions& options);

 private:
  using Step = absl::StatusOr<Node*> (GraphGenerator::*)();

  // Randomness through rng_() % n only: std distributions differ between standard libraries.
  int64_t Uniform(int64_t n) { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(n)); }
  bool Coin() { return Uniform(2) == 0; }
  void Shuffle(std::vector<int64_t>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Uniform(i)]);
  }
  int64_t SmallDim() { return 2 + Uniform(3); }

  // A float value from the pool, recent ones favoured so chains grow deep.
  Node* Pick(const std::function<bool(const Node*)>& ok = nullptr);
  // Another pool value of x's type, or x itself.
  Node* Partner(Node* x);
  Node* Remember(Node* n) {
    pool_.push_back(n);
    return n;
  }
  absl::StatusOr<Node*> Scalar(double v) { return b_.Constant(v, {kF32, {}}); }
  absl::StatusOr<Node*> Splat(double v, const std::vector<int64_t>& dims) {
    ASSIGN_OR_RETURN(Node * s, Scalar(v));
    return b_.BroadcastScalar(s, dims);
  }

  // Steps: each adds one pattern and returns a new float value for the pool.
  absl::StatusOr<Node*> UnaryStep();
  absl::StatusOr<Node*> BinaryStep();
  absl::StatusOr<Node*> CompareSelectStep();
  absl::StatusOr<Node*> ConvertStep();
  absl::StatusOr<Node*> BroadcastStep();
  absl::StatusOr<Node*> ReshapeStep();
  absl::StatusOr<Node*> TransposeStep();
  absl::StatusOr<Node*> SliceStep();
  absl::StatusOr<Node*> ConcatenateStep();
  absl::StatusOr<Node*> ReduceStep();
  absl::StatusOr<Node*> DotStep();
  absl::StatusOr<Node*> IndexingStep();
  absl::StatusOr<Node*> NormStep();
  absl::StatusOr<Node*> FusedNormStep(Node* x, Node* w);
  absl::StatusOr<Node*> SoftmaxStep();
  absl::StatusOr<Node*> CrossEntropyStep();
  absl::StatusOr<Node*> RopeStep();
  absl::StatusOr<Node*> AdamWStep();
  absl::StatusOr<Node*> AttentionStep();
  absl::StatusOr<Node*> PagedKvStep();
  absl::StatusOr<Node*> Fp8Step();
  absl::StatusOr<Node*> SampleTokensStep();
  absl::StatusOr<Node*> IotaStep();
  absl::StatusOr<Node*> DuplicateStep();
  absl::StatusOr<Node*> IdentityArithmeticStep();
  absl::StatusOr<Node*> ConstantSubgraphStep();

  std::mt19937_64 rng_;
  Builder b_;
  std::vector<Node*> pool_;  // f32 values
  Node* ids_ = nullptr;      // i32[n], indexes rows of any pool value
  Node* x0_ = nullptr;       // the first parameter, f32[a, c]
  Node* labels_ = nullptr;   // i32[rows], class labels for rank-2 logits of `rows` rows
  Node* rope_x_ = nullptr;   // f32[1,T,2,4]
  Node* positions_ = nullptr;  // i32[T]
  Node* fp8_state_ = nullptr;  // f32[4]: a delayed-scaling state with an amax history of 2
};

Node* GraphGenerator::Pick(const std::function<bool(const Node*)>& ok) {
  std::vector<Node*> candidates;
  for (Node* n : pool_) {
    if (!ok || ok(n)) candidates.push_back(n);
  }
  if (candidates.empty()) return pool_.front();  // callers only ask for what x0 satisfies
  const size_t recent = std::min<size_t>(candidates.size(), 6);
  if (Coin()) return candidates[candidates.size() - 1 - Uniform(recent)];
  return candidates[Uniform(candidates.size())];
}

Node* GraphGenerator::Partner(Node* x) {
  if (Uniform(4) == 0) return x;
  return Pick([&](const Node* n) { return n->type() == x->type(); });
}

absl::StatusOr<Node*> GraphGenerator::UnaryStep() {
  static constexpr Opcode kOps[] = {Opcode::kNeg,  Opcode::kAbs,  Opcode::kExp,  Opcode::kLog,
                                    Opcode::kSqrt, Opcode::kRsqrt, Opcode::kTanh, Opcode::kSigmoid,
                                    Opcode::kGelu};
  const Opcode op = kOps[Uniform(9)];
  Node* x = Pick();
  // Keep log/sqrt/rsqrt mostly in their domain so the graph's values stay informative.
  if (op == Opcode::kLog || op == Opcode::kSqrt || op == Opcode::kRsqrt) {
    ASSIGN_OR_RETURN(x, b_.Unary(Opcode::kAbs, x));
  }
  if (op == Opcode::kExp) {
    ASSIGN_OR_RETURN(x, b_.Unary(Opcode::kTanh, x));
  }
  return b_.Unary(op, x);
}

absl::StatusOr<Node*> GraphGenerator::BinaryStep() {
  static constexpr Opcode kOps[] = {Opcode::kAdd, Opcode::kSub, Opcode::kMul,
                                    Opcode::kDiv, Opcode::kMax, Opcode::kMin};
  Node* a = Pick();
  return b_.Binary(kOps[Uniform(6)], a, Partner(a));
}

absl::StatusOr<Node*> GraphGenerator::CompareSelectStep() {
  static const char* kDirections[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  Node* a = Pick();
  Node* c = Partner(a);
  ASSIGN_OR_RETURN(Node * p, b_.Compare(a, c, kDirections[Uniform(6)]));
  return b_.Select(p, a, c);
}

// bf16 -> f32 -> bf16 is an identity (canonicalize removes it), f32 -> bf16 -> f32 rounds
// (it must stay), and f32 -> f32 does nothing.
absl::StatusOr<Node*> GraphGenerator::ConvertStep() {
  Node* x = Pick();
  ASSIGN_OR_RETURN(Node * narrow, b_.Convert(x, DType::kBF16));
  ASSIGN_OR_RETURN(Node * wide, b_.Convert(narrow, kF32));
  ASSIGN_OR_RETURN(Node * narrow_again, b_.Convert(wide, DType::kBF16));
  ASSIGN_OR_RETURN(Node * back, b_.Convert(narrow_again, kF32));
  if (Coin()) return b_.Convert(back, kF32);
  return back;
}

// A broadcast of a broadcast (and of a scalar), reduced back to the operand's shape.
absl::StatusOr<Node*> GraphGenerator::BroadcastStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() <= 2; });
  const std::vector<int64_t>& d = x->type().dims;
  std::vector<int64_t> mid_shape = d, mid_dims(d.size());
  std::iota(mid_dims.begin(), mid_dims.end(), 0);
  mid_shape.push_back(SmallDim());  // a new last dim
  ASSIGN_OR_RETURN(Node * mid, b_.Broadcast(x, mid_dims, mid_shape));
  std::vector<int64_t> out_shape = {SmallDim()};
  out_shape.insert(out_shape.end(), mid_shape.begin(), mid_shape.end());
  std::vector<int64_t> out_dims(mid_shape.size());
  std::iota(out_dims.begin(), out_dims.end(), 1);
  ASSIGN_OR_RETURN(Node * out, b_.Broadcast(mid, out_dims, out_shape));
  ASSIGN_OR_RETURN(Node * ones, Splat(1.0, out_shape));
  ASSIGN_OR_RETURN(out, b_.Mul(out, ones));
  // An identity broadcast too, then back to x's shape.
  std::vector<int64_t> identity(out_shape.size());
  std::iota(identity.begin(), identity.end(), 0);
  ASSIGN_OR_RETURN(out, b_.Broadcast(out, identity, out_shape));
  return b_.ReduceSum(out, {0, static_cast<int64_t>(out_shape.size()) - 1});
}

absl::StatusOr<Node*> GraphGenerator::ReshapeStep() {
  Node* x = Pick();
  const TensorType& t = x->type();
  ASSIGN_OR_RETURN(Node * flat, b_.Reshape(x, {t.num_elements()}));
  if (Coin() && t.num_elements() % 2 == 0) {
    ASSIGN_OR_RETURN(flat, b_.Reshape(flat, {2, t.num_elements() / 2}));
  }
  return b_.Reshape(flat, t.dims);
}

absl::StatusOr<Node*> GraphGenerator::TransposeStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 2; });
  std::vector<int64_t> perm(x->type().rank());
  std::iota(perm.begin(), perm.end(), 0);
  Shuffle(perm);
  ASSIGN_OR_RETURN(Node * t, b_.Transpose(x, perm));
  std::vector<int64_t> second(perm.size());
  if (Coin()) {
    for (size_t i = 0; i < perm.size(); ++i) second[perm[i]] = i;  // the inverse: back to x
  } else {
    std::iota(second.begin(), second.end(), 0);
    Shuffle(second);
  }
  return b_.Transpose(t, second);
}

absl::StatusOr<Node*> GraphGenerator::SliceStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 1; });
  std::vector<int64_t> start, limit, stride;
  const bool full = Uniform(4) == 0;  // a slice that keeps everything
  for (int64_t d : x->type().dims) {
    start.push_back(full ? 0 : Uniform(d));
    limit.push_back(full ? d : start.back() + 1 + Uniform(d - start.back()));
    stride.push_back(full ? 1 : 1 + Uniform(2));
  }
  return b_.Slice(x, start, limit, stride);
}

absl::StatusOr<Node*> GraphGenerator::ConcatenateStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 1 && n->type().num_elements() <= 64; });
  if (Uniform(4) == 0) return b_.Concatenate({x}, 0);
  return b_.Concatenate({x, Partner(x)}, Uniform(x->type().rank()));
}

absl::StatusOr<Node*> GraphGenerator::ReduceStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 1; });
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x->type().rank(); ++i) {
    if (Coin()) dims.push_back(i);
  }
  if (dims.empty()) dims.push_back(Uniform(x->type().rank()));
  return Coin() ? b_.ReduceSum(x, dims) : b_.ReduceMax(x, dims);
}

// a @ bᵀ over the last dim, batched over the first for rank 3; sometimes with bf16 operands
// and f32 accumulation, as autocast GEMMs are.
absl::StatusOr<Node*> GraphGenerator::DotStep() {
  Node* a = Pick([](const Node* n) { return n->type().rank() == 2 || n->type().rank() == 3; });
  Node* c = Partner(a);
  const int64_t last = a->type().rank() - 1;
  DotDims dims{{}, {}, {last}, {last}};
  if (last == 2) dims.lhs_batch = dims.rhs_batch = {0};
  if (Coin()) {
    ASSIGN_OR_RETURN(Node * a16, b_.Convert(a, DType::kBF16));
    ASSIGN_OR_RETURN(Node * c16, b_.Convert(c, DType::kBF16));
    return b_.DotGeneral(a16, c16, dims, kF32);
  }
  if (Coin()) {  // the backend form, as lower-gemm writes it: a [batch, M, K] · c [batch, N, K]ᵀ
    const std::vector<int64_t>& d = a->type().dims;
    const int64_t batch = last == 2 ? d[0] : 1, m = d[last - 1], k = d[last];
    std::vector<int64_t> out = d;
    out[last] = m;
    const TensorType type{a->type().dtype, out};
    return b_.Op(Opcode::kGemm, {a, c},
                 AttrMap{{"batch", batch}, {"m", m}, {"n", m}, {"k", k}, {"a_layout", Symbol{"mk"}},
                         {"b_layout", Symbol{"nk"}}, {"alpha", 1.0}, {"beta", 0.0}, {"epilogue", Symbol{"none"}}},
                 &type);
  }
  return b_.DotGeneral(a, c, dims);
}

// gather rows (ids are in [0, 2), and every dim is at least 2), and their scatter_add back.
absl::StatusOr<Node*> GraphGenerator::IndexingStep() {
  Node* table = Pick([](const Node* n) { return n->type().rank() == 2 && n->type().dims[0] >= 2; });
  ASSIGN_OR_RETURN(Node * rows, b_.Gather(table, ids_));
  if (Coin()) return rows;
  return b_.ScatterAdd(ids_, rows, table->type());
}

absl::StatusOr<Node*> GraphGenerator::NormStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 2; });
  const int64_t rank = x->type().rank();
  std::vector<int64_t> leading(rank - 1);
  std::iota(leading.begin(), leading.end(), 0);
  ASSIGN_OR_RETURN(Node * w, b_.ReduceMax(x, leading));  // a weight of the last dim's size
  ASSIGN_OR_RETURN(Node * y, b_.RmsNorm(x, w, 1e-5));
  switch (Uniform(5)) {
    case 0: return x->type().dtype == DType::kF32 && Coin() ? FusedNormStep(x, w) : y;
    case 3: return b_.LayerNorm(x, w, w, 1e-5);  // w as the bias too
    case 4: {  // layer_norm's fused backward (fuse-residual-norm's), dw and db folded into dx
      const bool residual = x->type().dtype == DType::kF32 && Coin();
      std::vector<Node*> operands = {x, w, Partner(x)};
      if (residual) operands.insert(operands.begin(), Partner(x));
      const Opcode op = residual ? Opcode::kAddLayerNormGradInput : Opcode::kLayerNormGradInput;
      if (Coin()) return b_.Op(op, operands, AttrMap{{"eps", 1e-5}});
      ASSIGN_OR_RETURN(std::vector<Node*> g,
                       b_.MultiResultOp(op, operands, AttrMap{{"eps", 1e-5}, {"weight_grad", int64_t{1}}}));
      ASSIGN_OR_RETURN(Node * dwb, b_.Add(g[1], g[2]));
      ASSIGN_OR_RETURN(Node * dwb_rows, b_.Broadcast(dwb, {rank - 1}, x->type().dims));
      return b_.Add(g[0], dwb_rows);
    }
    case 1: {
      Node* dy = Partner(x);
      ASSIGN_OR_RETURN(Node * gi, b_.Op(Opcode::kRmsNormGradInput, {x, w, dy}, AttrMap{{"eps", 1e-5}}));
      if (Coin()) return gi;
      // Both gradients of one norm (fuse-residual-norm merges them: {weight_grad=1}).
      ASSIGN_OR_RETURN(Node * gw, b_.Op(Opcode::kRmsNormGradWeight, {x, w, dy}, AttrMap{{"eps", 1e-5}}));
      ASSIGN_OR_RETURN(Node * gw_rows, b_.Broadcast(gw, {rank - 1}, x->type().dims));
      return b_.Add(gi, gw_rows);
    }
    default: {
      ASSIGN_OR_RETURN(Node * gw, b_.Op(Opcode::kRmsNormGradWeight, {x, w, Partner(x)}, AttrMap{{"eps", 1e-5}}));
      return b_.Add(gw, w);
    }
  }
}

// fuse-residual-norm's forms (x is f32): a norm written bf16, the residual add with its norm
// (one result returned, the other left unread), the residual gradient with or without its
// bf16 copy. Narrow results are converted back, so later steps see f32.
absl::StatusOr<Node*> GraphGenerator::FusedNormStep(Node* x, Node* w) {
  const AttrMap to_bf16{{"eps", 1e-5}, {"out_dtype", Symbol{"bf16"}}};
  const AttrMap plain{{"eps", 1e-5}};
  switch (Uniform(4)) {
    case 0: {
      ASSIGN_OR_RETURN(Node * y, Coin() ? b_.Op(Opcode::kRmsNorm, {x, w}, to_bf16)
                                        : b_.Op(Opcode::kLayerNorm, {x, w, w}, to_bf16));
      return b_.Convert(y, DType::kF32);
    }
    case 1:
    case 2: {
      std::vector<Node*> operands = {x, Partner(x), w};
      if (Coin()) operands.push_back(w);  // add_layer_norm, w as the bias too
      const Opcode op = operands.size() == 4 ? Opcode::kAddLayerNorm : Opcode::kAddRmsNorm;
      ASSIGN_OR_RETURN(std::vector<Node*> sum_and_y, b_.MultiResultOp(op, operands, Coin() ? to_bf16 : plain));
      if (Coin()) return sum_and_y[0];
      return sum_and_y[1]->type().dtype == DType::kF32 ? sum_and_y[1] : b_.Convert(sum_and_y[1], DType::kF32);
    }
    default: {
      const std::vector<Node*> operands = {Partner(x), x, w, Partner(x)};
      if (Coin() && Coin()) {  // with the weight gradient (and maybe the copy)
        AttrMap attrs{{"eps", 1e-5}, {"weight_grad", int64_t{1}}};
        const bool copy = Coin();
        if (copy) attrs.Set("copy_dtype", Symbol{"bf16"});
        ASSIGN_OR_RETURN(std::vector<Node*> results, b_.MultiResultOp(Opcode::kAddRmsNormGradInput, operands, attrs));
        ASSIGN_OR_RETURN(Node * dw_rows, b_.Broadcast(results.back(), {x->type().rank() - 1}, x->type().dims));
        Node* dx = results[0];
        if (copy) {
          ASSIGN_OR_RETURN(dx, b_.Convert(results[1], DType::kF32));
        }
        return b_.Add(dx, dw_rows);
      }
      if (Coin()) return b_.Op(Opcode::kAddRmsNormGradInput, operands, plain);
      ASSIGN_OR_RETURN(std::vector<Node*> dx_and_copy,
                       b_.MultiResultOp(Opcode::kAddRmsNormGradInput, operands,
                                        AttrMap{{"eps", 1e-5}, {"copy_dtype", Symbol{"bf16"}}}));
      if (Coin()) return dx_and_copy[0];
      return b_.Convert(dx_and_copy[1], DType::kF32);
    }
  }
}

absl::StatusOr<Node*> GraphGenerator::SoftmaxStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 1; });
  ASSIGN_OR_RETURN(Node * y, b_.Softmax(x));
  if (Coin()) return y;
  return b_.Op(Opcode::kSoftmaxGrad, {y, Partner(x)});
}

absl::StatusOr<Node*> GraphGenerator::CrossEntropyStep() {
  const int64_t rows = labels_->type().dims[0];
  Node* logits = Pick([&](const Node* n) { return n->type().rank() == 2 && n->type().dims[0] == rows && n->type().dims[1] >= 2;
  });
  ASSIGN_OR_RETURN(Node * loss, b_.CrossEntropy(logits, labels_));
  if (Coin()) return loss;
  return b_.CrossEntropyGrad(logits, labels_, loss, loss->operand(0)->result(1));
}

absl::StatusOr<Node*> GraphGenerator::RopeStep() {
  Node* x = Pick([&](const Node* n) { return n->type() == rope_x_->type(); });
  if (x->type() != rope_x_->type()) x = rope_x_;
  if (Uniform(4) == 0) {  // x scaled by its positions' cos/sin table (expand-rope's rope_table)
    const std::vector<int64_t>& dims = x->type().dims;
    ASSIGN_OR_RETURN(Node * table, b_.Op(Opcode::kRopeTable, {positions_},
                                         AttrMap{{"theta", 10000.0}, {"head_dim", dims[3]}, {"inverse", int64_t{Coin()}}}));
    ASSIGN_OR_RETURN(Node * wide, b_.Broadcast(table, {1, 3}, dims));
    if (wide->type().dtype != x->type().dtype) {
      ASSIGN_OR_RETURN(wide, b_.Convert(wide, x->type().dtype));
    }
    return b_.Mul(x, wide);
  }
  return b_.Rope(x, positions_, 10000.0, /*inverse=*/Coin());
}

// One AdamW update of a pool value; the second moment is m^2 (>= 0, as in training) and the
// per-step scalars are constants of the ranges a training step computes.
absl::StatusOr<Node*> GraphGenerator::AdamWStep() {
  Node* p = Pick();
  Node* g = Partner(p);
  Node* m = Partner(p);
  ASSIGN_OR_RETURN(Node * v, b_.Mul(m, m));
  ASSIGN_OR_RETURN(Node * step_size, Scalar(0.01 * static_cast<double>(1 + Uniform(4))));
  ASSIGN_OR_RETURN(Node * decay, Scalar(Coin() ? 1.0 : 0.999));
  ASSIGN_OR_RETURN(Node * sqrt_bc2, Scalar(0.25 * static_cast<double>(1 + Uniform(4))));
  // The clipping factor as a training step computes it from the gradients' global norm
  // (here 1 / (1 + |g|^2 + |m|^2), in (0, 1]), or a constant.
  Node* grad_scale = sqrt_bc2;
  if (Coin()) {
    ASSIGN_OR_RETURN(Node * squares, b_.Op(Opcode::kSumOfSquares, {g, m}));
    ASSIGN_OR_RETURN(Node * one, Scalar(1.0));
    ASSIGN_OR_RETURN(Node * denominator, b_.Add(squares, one));
    ASSIGN_OR_RETURN(grad_scale, b_.Div(one, denominator));
  }
  ASSIGN_OR_RETURN(std::vector<Node*> results,
                   b_.MultiResultOp(Opcode::kAdamWUpdate, {p, g, m, v, step_size, decay, sqrt_bc2, grad_scale},
                                    AttrMap{{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}}));
  return results[Uniform(3)];
}

// The attention family on the rope-shaped value [B,T,H,D] seen as [B,H,T,D] (one kv head
// per query head): the forward, its statistics and the three backward results, summed back
// into one [B,T,H,D] value.
absl::StatusOr<Node*> GraphGenerator::AttentionStep() {
  const std::vector<int64_t> swap = {0, 2, 1, 3};
  auto as_bf16_heads = [&](Node* x) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * t, b_.Transpose(x, swap));
    return b_.Convert(t, DType::kBF16);
  };
  ASSIGN_OR_RETURN(Node * q, as_bf16_heads(rope_x_));
  ASSIGN_OR_RETURN(Node * k, as_bf16_heads(Partner(rope_x_)));
  ASSIGN_OR_RETURN(Node * v, as_bf16_heads(Partner(rope_x_)));
  ASSIGN_OR_RETURN(Node * dout, as_bf16_heads(Partner(rope_x_)));
  const double scale = 0.25 * static_cast<double>(1 + Uniform(4));
  ASSIGN_OR_RETURN(std::vector<Node*> attention,
                   b_.MultiResultOp(Opcode::kAttention, {q, k, v}, AttrMap{{"scale", scale}}));
  Node* o = attention[0];
  Node* lse = attention[1];
  ASSIGN_OR_RETURN(Node * delta, b_.Op(Opcode::kAttentionDelta, {o, dout}));
  ASSIGN_OR_RETURN(std::vector<Node*> grads, b_.MultiResultOp(Opcode::kAttentionGrad, {q, k, v, dout, lse, delta},
                                                              AttrMap{{"scale", scale}}));
  Node* g = grads[Uniform(3)];
  ASSIGN_OR_RETURN(Node * rows, b_.Add(lse, delta));
  ASSIGN_OR_RETURN(Node * rows_b, b_.Broadcast(rows, {0, 1, 2}, o->type().dims));
  ASSIGN_OR_RETURN(Node * og, b_.Add(o, g));
  ASSIGN_OR_RETURN(Node * sum, b_.Add(og, rows_b));
  return b_.Transpose(sum, swap);
}

// The FP8 ops on a pool value of rank >= 1 (fp8_quantize takes no scalar): quantized with the
// state's scale (maybe with the transposed copy), dequantized back, and the state updated
// with its amax, all summed into one value.
absl::StatusOr<Node*> GraphGenerator::Fp8Step() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 1; });
  const DType format = Coin() ? DType::kF8E4M3 : DType::kF8E5M2;
  const bool transposed = Coin();
  AttrMap attrs{{"out_dtype", Symbol{std::string(DTypeName(format))}}};
  if (transposed) attrs.Set("transposed", int64_t{1});
  ASSIGN_OR_RETURN(std::vector<Node*> q, b_.MultiResultOp(Opcode::kFp8Quantize, {x, fp8_state_}, std::move(attrs)));
  const Symbol f32{std::string(DTypeName(kF32))};
  ASSIGN_OR_RETURN(Node * dq, b_.Op(Opcode::kFp8Dequantize, {q[0], q[2]}, AttrMap{{"out_dtype", f32}}));
  ASSIGN_OR_RETURN(Node * next, b_.Op(Opcode::kFp8ScaleUpdate, {fp8_state_, q[1]},
                                      AttrMap{{"fp8_format", Symbol{std::string(DTypeName(format))}},
                                              {"margin", static_cast<int64_t>(Uniform(2))}}));
  ASSIGN_OR_RETURN(Node * total, b_.ReduceSum(next, {0}));
  if (transposed) {
    ASSIGN_OR_RETURN(Node * dqt, b_.Op(Opcode::kFp8Dequantize, {q[3], q[2]}, AttrMap{{"out_dtype", f32}}));
    ASSIGN_OR_RETURN(Node * t, b_.ReduceSum(dqt, {0, 1}));
    ASSIGN_OR_RETURN(total, b_.Add(total, t));
  }
  ASSIGN_OR_RETURN(Node * wide, b_.BroadcastScalar(total, dq->type().dims));
  return b_.Add(dq, wide);
}

// The paged-KV ops on the rope-shaped value [1,T,2,4]: its rows written into one block of T
// slots of a splat pool (K) and of a partner-filled pool (V), then each token attending
// over the tokens before it through a one-entry block table.
absl::StatusOr<Node*> GraphGenerator::PagedKvStep() {
  const int64_t t = rope_x_->type().dims[1];
  const std::vector<int64_t> pool_dims = {1, 1, 2, t, 4};
  ASSIGN_OR_RETURN(Node * empty_pool, Splat(0.25 * static_cast<double>(Uniform(4)), pool_dims));
  ASSIGN_OR_RETURN(Node * slots, b_.Iota({DType::kI32, {t}}, 0));
  ASSIGN_OR_RETURN(Node * k_rows, b_.Reshape(Partner(rope_x_), {t, 2, 4}));
  ASSIGN_OR_RETURN(Node * v_rows, b_.Reshape(Partner(rope_x_), {t, 2, 4}));
  const AttrMap layer{{"layer", int64_t{0}}};
  ASSIGN_OR_RETURN(Node * k_pool, b_.Op(Opcode::kKvCacheWrite, {empty_pool, k_rows, slots}, layer));
  ASSIGN_OR_RETURN(Node * v_pool, b_.Op(Opcode::kKvCacheWrite, {empty_pool, v_rows, slots}, layer));
  ASSIGN_OR_RETURN(Node * tables, b_.Constant(0, {DType::kI32, {1, 1}}));
  ASSIGN_OR_RETURN(Node * positions, b_.Iota({DType::kI32, {1, t}}, 1));
  return b_.Op(Opcode::kPagedAttention, {rope_x_, k_pool, v_pool, tables, positions},
               AttrMap{{"layer", int64_t{0}}, {"scale", 0.25 * static_cast<double>(1 + Uniform(4))}});
}

// A token of each row of the parameter x0 (a parameter: no pass changes its values, so the
// draws cannot flip on a rounding), greedy or sampled, added to x0 as f32.
absl::StatusOr<Node*> GraphGenerator::SampleTokensStep() {
  const int64_t rows = x0_->type().dims[0];
  std::vector<double> sampling, draws;
  for (int64_t r = 0; r < rows; ++r) {
    sampling.insert(sampling.end(), {0.5 * static_cast<double>(Uniform(3)), static_cast<double>(Uniform(3)),
                                     Coin() ? 1.0 : 0.5});
    draws.insert(draws.end(), {static_cast<double>(Uniform(1000)), 0, static_cast<double>(Uniform(50))});
  }
  ASSIGN_OR_RETURN(Node * sampling_node, b_.ConstantValues(sampling, {kF32, {rows, 3}}));
  ASSIGN_OR_RETURN(Node * draws_node, b_.ConstantValues(draws, {DType::kI32, {rows, 3}}));
  ASSIGN_OR_RETURN(Node * tokens, b_.Op(Opcode::kSampleTokens, {x0_, sampling_node, draws_node}, AttrMap{}));
  ASSIGN_OR_RETURN(Node * as_float, b_.Convert(tokens, kF32));
  ASSIGN_OR_RETURN(Node * wide, b_.Broadcast(as_float, {0}, x0_->type().dims));
  return b_.Add(x0_, wide);
}

absl::StatusOr<Node*> GraphGenerator::IotaStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 1; });
  ASSIGN_OR_RETURN(Node * io, b_.Iota({DType::kI32, x->type().dims}, Uniform(x->type().rank())));
  ASSIGN_OR_RETURN(Node * iof, b_.Convert(io, kF32));
  return b_.Add(x, iof);
}

// The same node again: CSE merges it.
absl::StatusOr<Node*> GraphGenerator::DuplicateStep() {
  Node* x = Pick([](const Node* n) { return n->opcode() != Opcode::kParameter; });
  if (x->opcode() == Opcode::kParameter) return BinaryStep();
  if (x->opcode() == Opcode::kGetResult) {  // the whole multi-result node again, and the same result of it
    const Node* multi = x->operand(0);
    ASSIGN_OR_RETURN(std::vector<Node*> results, b_.MultiResultOp(multi->opcode(), multi->operands(), multi->attrs()));
    return results[x->result_index()];
  }
  const TensorType type = x->type();
  return b_.Op(x->opcode(), x->operands(), x->attrs(), &type);
}

// x*1, 1*x, x/1, x + -0.0, x - 0.0 (identities) and x + 0.0 (not one: it turns -0 into +0).
absl::StatusOr<Node*> GraphGenerator::IdentityArithmeticStep() {
  Node* x = Pick();
  const std::vector<int64_t>& dims = x->type().dims;
  switch (Uniform(6)) {
    case 0: {
      ASSIGN_OR_RETURN(Node * one, Splat(1.0, dims));
      return b_.Mul(x, one);
    }
    case 1: {
      ASSIGN_OR_RETURN(Node * one, Splat(1.0, dims));
      return b_.Mul(one, x);
    }
    case 2: {
      ASSIGN_OR_RETURN(Node * one, b_.Constant(1.0, x->type()));
      return b_.Div(x, one);
    }
    case 3: {
      ASSIGN_OR_RETURN(Node * zero, Splat(-0.0, dims));
      return b_.Add(zero, x);
    }
    case 4: {
      ASSIGN_OR_RETURN(Node * zero, Splat(0.0, dims));
      return b_.Sub(x, zero);
    }
    default: {
      ASSIGN_OR_RETURN(Node * zero, Splat(0.0, dims));
      return b_.Add(x, zero);
    }
  }
}

// Arithmetic on constants only (canonicalize folds it), applied to a pool value.
absl::StatusOr<Node*> GraphGenerator::ConstantSubgraphStep() {
  Node* x = Pick([](const Node* n) { return n->type().rank() >= 1; });
  const int64_t n = x->type().dims.back();
  std::vector<double> values;
  for (int64_t i = 0; i < n; ++i) values.push_back(static_cast<double>(Uniform(9)) / 4 - 1);
  ASSIGN_OR_RETURN(Node * dense, b_.ConstantValues(values, {kF32, {n}}));
  ASSIGN_OR_RETURN(Node * s, Scalar(0.5 + Uniform(4)));
  ASSIGN_OR_RETURN(Node * sb, b_.BroadcastScalar(s, {n}));
  ASSIGN_OR_RETURN(Node * c, b_.Mul(dense, sb));
  ASSIGN_OR_RETURN(c, b_.Unary(Opcode::kExp, c));
  ASSIGN_OR_RETURN(Node * cb, b_.Broadcast(c, {x->type().rank() - 1}, x->type().dims));
  return b_.Add(x, cb);
}

absl::Status GraphGenerator::Build(const RandomGraphOptions& options) {
  const int64_t a = SmallDim(), c = SmallDim(), d = SmallDim(), t = SmallDim();
  ASSIGN_OR_RETURN(Node * x0, b_.Parameter("x0", {kF32, {a, c}}));
  x0_ = x0;
  ASSIGN_OR_RETURN(Node * x1, b_.Parameter("x1", {kF32, {a, c}}));
  ASSIGN_OR_RETURN(Node * x2, b_.Parameter("x2", {kF32, {a, c, d}}));
  ASSIGN_OR_RETURN(ids_, b_.Parameter("ids", {DType::kI32, {SmallDim()}}));
  ASSIGN_OR_RETURN(labels_, b_.Parameter("labels", {DType::kI32, {a}}));
  ASSIGN_OR_RETURN(rope_x_, b_.Parameter("q", {kF32, {1, t, 2, 4}}));
  ASSIGN_OR_RETURN(positions_, b_.Parameter("positions", {DType::kI32, {t}}));
  ASSIGN_OR_RETURN(fp8_state_, b_.Parameter("fp8_state", {kF32, {4}}));
  pool_ = {x0, x1, x2, rope_x_};

  static constexpr Step kSteps[] = {
      &GraphGenerator::UnaryStep,        &GraphGenerator::BinaryStep,       &GraphGenerator::CompareSelectStep,
      &GraphGenerator::ConvertStep,      &GraphGenerator::BroadcastStep,    &GraphGenerator::ReshapeStep,
      &GraphGenerator::TransposeStep,    &GraphGenerator::SliceStep,        &GraphGenerator::ConcatenateStep,
      &GraphGenerator::ReduceStep,       &GraphGenerator::DotStep,          &GraphGenerator::IndexingStep,
      &GraphGenerator::NormStep,         &GraphGenerator::SoftmaxStep,      &GraphGenerator::CrossEntropyStep,
      &GraphGenerator::RopeStep,         &GraphGenerator::IotaStep,         &GraphGenerator::DuplicateStep,
      &GraphGenerator::DuplicateStep,    &GraphGenerator::IdentityArithmeticStep,
      &GraphGenerator::ConstantSubgraphStep, &GraphGenerator::AdamWStep,      &GraphGenerator::AttentionStep, &GraphGenerator::PagedKvStep,
      &GraphGenerator::Fp8Step,          &GraphGenerator::SampleTokensStep,
  };
  constexpr int kNumSteps = sizeof(kSteps) / sizeof(kSteps[0]);
  for (int i = 0; i < options.num_steps; ++i) {
    ASSIGN_OR_RETURN(Node * value, (this->*kSteps[Uniform(kNumSteps)])());
    Remember(value);
  }
  // The last value and a few others; the rest (and parameters such as x1 or ids) may end up
  // unused, which is what dce is for.
  std::vector<Node*> outputs = {pool_.back()};
  for (int i = 1; i < options.num_outputs; ++i) {
    Node* n = Pick();
    if (std::find(outputs.begin(), outputs.end(), n) == outputs.end()) outputs.push_back(n);
  }
  return b_.Return(outputs);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Module>> BuildRandomGraph(uint64_t seed, const RandomGraphOptions& options) {
  auto module = std::make_unique<Module>(absl::StrCat("random_", seed));
  GraphGenerator generator(seed, module->AddFunction("main"));
  RETURN_IF_ERROR(generator.Build(options));
  return module;
}

}  // namespace kiln::testing
