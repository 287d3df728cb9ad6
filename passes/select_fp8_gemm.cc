#include "passes/select_fp8_gemm.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "ir/fp8_scaling.h"
#include "ir/gemm_slots.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"
#include "passes/fp8_quantize_rebuild.h"

namespace kiln {
namespace {

// An fp8_dequantize(q, scale_inv) of one fp8_quantize's results 0 and 2.
struct Fp8Operand {
  Node* quantize = nullptr;  // the multi-result node
  Node* q = nullptr;
  Node* scale_inv = nullptr;
};

std::optional<Fp8Operand> Fp8OperandOf(Node* v) {
  if (v->opcode() != Opcode::kFp8Dequantize) return std::nullopt;
  Node* q = v->operand(0);
  Node* scale_inv = v->operand(1);
  if (q->opcode() != Opcode::kGetResult || scale_inv->opcode() != Opcode::kGetResult) return std::nullopt;
  Node* quantize = q->operand(0);
  if (quantize->opcode() != Opcode::kFp8Quantize || scale_inv->operand(0) != quantize ||
      q->result_index() != Fp8QuantizeResults::kQ || scale_inv->result_index() != Fp8QuantizeResults::kScaleInv) {
    return std::nullopt;
  }
  return Fp8Operand{quantize, q, scale_inv};
}

// Gives `quantize` its transposed copy ({transposed=1}), rebuilding the node when it has
// none yet; its uses move to the new node's results.
absl::Status WithTransposedCopy(Function& f, Node* quantize) {
  ASSIGN_OR_RETURN(const Fp8QuantizeResults layout, Fp8QuantizeResultsOf(quantize->attrs()));
  if (layout.transposed()) return absl::OkStatus();
  AttrMap attrs = quantize->attrs();
  attrs.Set("transposed", int64_t{1});
  return RebuildFp8Quantize(f, quantize, std::move(attrs)).status();
}

}  // namespace

absl::StatusOr<bool> SelectFp8GemmPass::RunOnFunction(Function& f) {
  std::vector<Node*> gemms;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kGemm && !n->has_multiple_results() && !HasFp8Slots(*n) &&
        Fp8OperandOf(n->operand(0)).has_value() && Fp8OperandOf(n->operand(1)).has_value()) {
      gemms.push_back(n.get());
    }
  }
  bool changed = false;
  Node* one = nullptr;
  for (Node* g : gemms) {
    const std::string label = absl::StrCat("%", g->name(), " in @", f.name());
    ASSIGN_OR_RETURN(GemmSlots slots, GemmSlotsOf(g->attrs()));
    ASSIGN_OR_RETURN(int64_t batch, g->attrs().GetInt("batch"));
    ASSIGN_OR_RETURN(int64_t m, g->attrs().GetInt("m"));
    ASSIGN_OR_RETURN(int64_t n, g->attrs().GetInt("n"));
    ASSIGN_OR_RETURN(int64_t k, g->attrs().GetInt("k"));
    ASSIGN_OR_RETURN(std::string a_layout, g->attrs().GetSymbol("a_layout"));
    ASSIGN_OR_RETURN(std::string b_layout, g->attrs().GetSymbol("b_layout"));
    ASSIGN_OR_RETURN(double beta, g->attrs().GetFloat("beta"));
    Fp8Operand a = *Fp8OperandOf(g->operand(0)), b = *Fp8OperandOf(g->operand(1));
    const bool a_transposed = a_layout == "km", b_transposed = b_layout == "kn";
    if (batch != 1) {
      decisions_.push_back(absl::StrCat(label, ": bf16, a batched gemm (", batch, " matrices)"));
      continue;
    }
    // A K-outer operand reads the quantize's transposed copy, [last dim, rest]: the gemm's
    // M (a) or N (b) must be that last dim.
    if (a_transposed && a.q->type().dims.back() != m) {
      decisions_.push_back(absl::StrCat(label, ": bf16, a (km) has last dim ", a.q->type().dims.back(), ", not m ", m));
      continue;
    }
    if (b_transposed && b.q->type().dims.back() != n) {
      decisions_.push_back(absl::StrCat(label, ": bf16, b (kn) has last dim ", b.q->type().dims.back(), ", not n ", n));
      continue;
    }
    const Fp8GemmShape shape{.m = m, .n = n, .k = k, .a = a.q->type().dtype, .b = b.q->type().dtype,
                             .d = g->type().dtype, .beta = static_cast<float>(beta), .bias = slots.bias >= 0};
    const std::string why = capabilities_ == nullptr ? "no backend capabilities were given"
                                                     : capabilities_->Fp8GemmUnsupportedReason(shape, target_);
    if (!why.empty()) {
      decisions_.push_back(absl::StrCat(label, ": bf16, ", why));
      continue;
    }
    // Rebuilding a quantize with its transposed copy replaces its result nodes, so the
    // operands are read again afterwards (a and b may be one quantize: x x^T).
    if (a_transposed) RETURN_IF_ERROR(WithTransposedCopy(f, a.quantize));
    if (b_transposed) RETURN_IF_ERROR(WithTransposedCopy(f, Fp8OperandOf(g->operand(1))->quantize));
    a = *Fp8OperandOf(g->operand(0));
    b = *Fp8OperandOf(g->operand(1));
    ASSIGN_OR_RETURN(const Fp8QuantizeResults a_results, Fp8QuantizeResultsOf(a.quantize->attrs()));
    ASSIGN_OR_RETURN(const Fp8QuantizeResults b_results, Fp8QuantizeResultsOf(b.quantize->attrs()));
    Node* qa = a_transposed ? a.quantize->result(a_results.q_t) : a.q;
    Node* qb = b_transposed ? b.quantize->result(b_results.q_t) : b.q;
    if (qa == nullptr || qb == nullptr) return absl::InternalError(absl::StrCat(label, ": a transposed copy went missing"));
    // One d_scale for every FP8 gemm of the function (a constant is a kernel of its own),
    // defined before the first, which comes first in definition order.
    if (one == nullptr) {
      one = f.InsertNodeBefore(g, Opcode::kConstant, {}, {{"value", 1.0}}, TensorType{DType::kF32, {}},
                               f.UniqueName("fp8.d_scale"), "fp8");
    }
    std::vector<Node*> operands{qa, qb};
    if (slots.c >= 0) operands.push_back(g->operand(slots.c));
    if (slots.bias >= 0) operands.push_back(g->operand(slots.bias));
    operands.insert(operands.end(), {a.scale_inv, b.scale_inv, one});
    AttrMap attrs = g->attrs();
    attrs.Set("a_layout", Symbol{"mk"});
    attrs.Set("b_layout", Symbol{"nk"});
    attrs.Set("scaled", int64_t{1});
    Node* fp8 = f.InsertNodeBefore(g, Opcode::kGemm, std::move(operands), std::move(attrs), g->type(),
                                   f.UniqueName(absl::StrCat(g->name(), ".fp8")), g->scope());
    if (fp8 == nullptr) return absl::InternalError(absl::StrCat("select-fp8-gemm: cannot rewrite ", label));
    const std::string name = g->name();
    g->ReplaceAllUsesWith(fp8);
    f.RemoveNode(g);
    f.RenameNode(fp8, name);
    decisions_.push_back(absl::StrCat(label, ": fp8, ", DTypeName(shape.a), " x ", DTypeName(shape.b), " -> ",
                                      DTypeName(shape.d), a_transposed ? ", a from its transposed copy" : "",
                                      b_transposed ? ", b from its transposed copy" : ""));
    changed = true;
  }
  // The dequantized copies the FP8 gemms no longer read.
  std::vector<Node*> unread;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kFp8Dequantize && n->users().empty() && !IsFunctionOutput(*n)) unread.push_back(n.get());
  }
  f.RemoveNodes(unread);
  return changed;
}

}  // namespace kiln
