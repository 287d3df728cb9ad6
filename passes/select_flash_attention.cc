#include "passes/select_flash_attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "ir/pattern_match.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

namespace m = match;

// dot_general with batch dims [0,1] on both sides and the given contracting dims.
m::Pattern BatchedDot(int64_t lhs_contract, int64_t rhs_contract) {
  return m::Op(Opcode::kDotGeneral)
      .WithInts("lhs_batch", {0, 1})
      .WithInts("rhs_batch", {0, 1})
      .WithInts("lhs_contract", {lhs_contract})
      .WithInts("rhs_contract", {rhs_contract});
}

// broadcast(compare(iota dim 0, iota dim 1, ge), dims [2,3]): key <= query.
m::Pattern CausalMask() {
  return m::Op(Opcode::kBroadcast, {m::Op(Opcode::kCompare, {m::Op(Opcode::kIota).WithInt("dim", 0),
                                                             m::Op(Opcode::kIota).WithInt("dim", 1)})
                                        .WithSymbol("direction", "ge")})
      .WithInts("dims", {2, 3});
}

// The decomposed causal attention of frontends/nn.cc, rooted at its ·V GEMM (see the header):
//   dot_general(convert_bf16(softmax_f32(select(mask, mul(q kᵀ, scale), -inf))), v)
m::Pattern DecomposedAttention(Node** q, Node** k, Node** v, double* scale) {
  const m::Pattern scores = BatchedDot(3, 3).WithDType(DType::kF32).WithOperands({m::Any(q), m::Any(k)});
  const m::Pattern masked =
      m::Op(Opcode::kSelect, {CausalMask(), m::AnyOrder(Opcode::kMul, scores, m::Splat(scale)), m::SplatOf(-INFINITY)});
  const m::Pattern probs_bf16 =
      m::Op(Opcode::kConvert, {m::Op(Opcode::kSoftmax, {masked}).WithDType(DType::kF32)}).WithDType(DType::kBF16);
  return BatchedDot(3, 2).WithOperands({probs_bf16, m::Any(v)});
}

// x = [convert](reshape(broadcast(x0 [B,Hkv,T,D], dims [0,1,3,4]) [B,Hkv,G,T,D]) [B,H,T,D]):
// x0 converted to bf16; otherwise x itself (bf16 [B,H,T,D]). Inserted before `before`.
Node* UnrepeatedKv(Function& f, Node* x, Node* before) {
  Node* x0 = nullptr;
  const m::Pattern repeat =
      m::Op(Opcode::kReshape, {m::Op(Opcode::kBroadcast, {m::Any(&x0).WithRank(4)}).WithInts("dims", {0, 1, 3, 4})});
  if (!m::Match(x, m::AnyOf({m::Op(Opcode::kConvert, {repeat}), repeat}))) return x;
  if (x0->type().dtype == DType::kBF16) return x0;
  return f.InsertNodeBefore(before, Opcode::kConvert, {x0}, {}, TensorType{DType::kBF16, x0->type().dims},
                            f.UniqueName(absl::StrCat(x0->name(), ".bf16")), x0->scope());
}

}  // namespace

void SelectFlashAttentionPass::StartRun() { decisions_.clear(); }

absl::StatusOr<bool> SelectFlashAttentionPass::RunOnFunction(Function& f) {
  bool changed = false;
  // Every P·V-shaped GEMM is a candidate; the ones that are not the whole pattern say why.
  std::vector<Node*> candidates;
  for (const auto& n : f.nodes()) {
    if (m::Match(n.get(), BatchedDot(3, 2))) candidates.push_back(n.get());
  }
  for (Node* out : candidates) {
    const std::string where = absl::StrCat("%", out->name(), " in @", f.name());
    Node *q = nullptr, *k = nullptr, *v = nullptr;
    double scale = 0;
    std::string why_not;
    if (!m::Match(out, DecomposedAttention(&q, &k, &v, &scale), &why_not)) {
      decisions_.push_back(absl::StrCat(where, ": not the decomposed attention: ", why_not));
      continue;
    }
    if (q->type().dtype != DType::kBF16 || k->type().dtype != DType::kBF16 || v->type().dtype != DType::kBF16 ||
        out->type().dtype != DType::kF32) {
      decisions_.push_back(absl::StrCat(where, ": not selected: q, k, v must be bf16 and the output f32"));
      continue;
    }
    const std::vector<int64_t>& qd = q->type().dims;
    if (capabilities_ == nullptr) {
      decisions_.push_back(absl::StrCat(where, ": not selected: no backend capabilities were given to the compile"));
      continue;
    }
    const std::string why = capabilities_->AttentionUnsupportedReason({qd[0], qd[1], qd[1], qd[2], qd[3]}, target_);
    if (!why.empty()) {
      decisions_.push_back(absl::StrCat(where, ": not selected: ", why));
      continue;
    }
    Node* k0 = UnrepeatedKv(f, k, out);
    Node* v0 = UnrepeatedKv(f, v, out);
    if (k0->type() != v0->type()) {  // one repeated and not the other: keep both whole
      k0 = k;
      v0 = v;
    }
    AttrMap attrs;
    attrs.Set("scale", scale);
    // Results: the output, and the LSE that the backward reads (the kernel computes it anyway).
    const TensorType lse{DType::kF32, {qd[0], qd[1], qd[2]}};
    const std::vector<Node*> results = f.AppendMultiResultNode(
        Opcode::kAttention, {q, k0, v0}, attrs, {out->type(), lse},
        {f.UniqueName(absl::StrCat(out->name(), ".flash")), f.UniqueName(absl::StrCat(out->name(), ".lse"))},
        out->scope(), out);
    KILN_CHECK(!results.empty());
    out->ReplaceAllUsesWith(results[0]);
    decisions_.push_back(absl::StrCat(where, ": attention, ", qd[1], " query heads on ", k0->type().dims[1],
                                      " kv heads, scale ", scale, ": ", capabilities_->AttentionImplementation(target_)));
    changed = true;
  }
  return changed;
}

}  // namespace kiln
