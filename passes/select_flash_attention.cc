#include "passes/select_flash_attention.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

bool IsSplat(const Node* n, double* value) {
  if (n->opcode() == Opcode::kBroadcast) n = n->operand(0);
  if (n->opcode() != Opcode::kConstant || n->attrs().Has("values")) return false;
  absl::StatusOr<double> v = n->attrs().GetFloat("value");
  if (!v.ok()) return false;
  *value = *v;
  return true;
}

bool HasInts(const Node* n, absl::string_view attr, const std::vector<int64_t>& want) {
  absl::StatusOr<std::vector<int64_t>> got = n->attrs().GetInts(attr);
  return got.ok() && *got == want;
}

// dot_general with batch dims [0,1] on both sides and the given contracting dims.
bool IsBatchedDot(const Node* n, int64_t lhs_contract, int64_t rhs_contract) {
  return n->opcode() == Opcode::kDotGeneral && HasInts(n, "lhs_batch", {0, 1}) && HasInts(n, "rhs_batch", {0, 1}) &&
         HasInts(n, "lhs_contract", {lhs_contract}) && HasInts(n, "rhs_contract", {rhs_contract});
}

// broadcast(compare(iota dim 0, iota dim 1, ge), dims [2,3]): key <= query.
bool IsCausalMask(const Node* n) {
  if (n->opcode() != Opcode::kBroadcast || !HasInts(n, "dims", {2, 3})) return false;
  const Node* c = n->operand(0);
  if (c->opcode() != Opcode::kCompare) return false;
  absl::StatusOr<std::string> direction = c->attrs().GetSymbol("direction");
  const Node* a = c->operand(0);
  const Node* b = c->operand(1);
  return direction.ok() && *direction == "ge" && a->opcode() == Opcode::kIota && b->opcode() == Opcode::kIota &&
         a->attrs().GetInt("dim").value_or(-1) == 0 && b->attrs().GetInt("dim").value_or(-1) == 1;
}

// x = [convert](reshape(broadcast(x0 [B,Hkv,T,D], dims [0,1,3,4]) [B,Hkv,G,T,D]) [B,H,T,D]):
// x0 converted to bf16; otherwise x itself (bf16 [B,H,T,D]). Inserted before `before`.
Node* UnrepeatedKv(Function& f, Node* x, Node* before) {
  Node* inner = x->opcode() == Opcode::kConvert ? x->operand(0) : x;
  if (inner->opcode() == Opcode::kReshape && inner->operand(0)->opcode() == Opcode::kBroadcast) {
    Node* broadcast = inner->operand(0);
    Node* x0 = broadcast->operand(0);
    if (HasInts(broadcast, "dims", {0, 1, 3, 4}) && x0->type().rank() == 4) {
      if (x0->type().dtype == DType::kBF16) return x0;
      return f.InsertNodeBefore(before, Opcode::kConvert, {x0}, {}, TensorType{DType::kBF16, x0->type().dims},
                                f.UniqueName(absl::StrCat(x0->name(), ".bf16")), x0->scope());
    }
  }
  return x;
}

}  // namespace

absl::StatusOr<bool> SelectFlashAttentionPass::Run(Module& module) {
  decisions_.clear();
  bool changed = false;
  for (const auto& function : module.functions()) {
    Function& f = *function;
    std::vector<Node*> candidates;
    for (const auto& n : f.nodes()) {
      if (IsBatchedDot(n.get(), 3, 2)) candidates.push_back(n.get());
    }
    for (Node* out : candidates) {
      Node* probs_bf16 = out->operand(0);
      Node* v = out->operand(1);
      if (probs_bf16->opcode() != Opcode::kConvert || probs_bf16->type().dtype != DType::kBF16) continue;
      Node* softmax = probs_bf16->operand(0);
      if (softmax->opcode() != Opcode::kSoftmax || softmax->type().dtype != DType::kF32) continue;
      Node* masked = softmax->operand(0);
      double neg_inf = 0;
      if (masked->opcode() != Opcode::kSelect || !IsCausalMask(masked->operand(0)) ||
          !IsSplat(masked->operand(2), &neg_inf) || neg_inf != -INFINITY) {
        continue;
      }
      Node* scaled = masked->operand(1);
      if (scaled->opcode() != Opcode::kMul) continue;
      double scale = 0;
      Node* scores = nullptr;
      if (IsSplat(scaled->operand(1), &scale)) scores = scaled->operand(0);
      else if (IsSplat(scaled->operand(0), &scale)) scores = scaled->operand(1);
      if (scores == nullptr || !IsBatchedDot(scores, 3, 3) || scores->type().dtype != DType::kF32) continue;
      Node* q = scores->operand(0);
      Node* k = scores->operand(1);
      const std::string where = absl::StrCat("%", out->name(), " in @", f.name());
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
      const std::string why =
          capabilities_->AttentionUnsupportedReason({qd[0], qd[1], qd[1], qd[2], qd[3]}, target_);
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
                                        " kv heads, scale ", scale, ": ",
                                        capabilities_->AttentionImplementation(target_)));
      changed = true;
    }
  }
  return changed;
}

}  // namespace kiln
