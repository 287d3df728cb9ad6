#include "passes/narrow_activations.h"

#include <algorithm>
#include <vector>

#include "ir/gemm_slots.h"
#include "ir/node_predicates.h"
#include "ir/pattern_match.h"

namespace kiln {
namespace {

namespace m = match;


// Whether every use of `v` rounds it to bf16: a convert to bf16, an attention_delta (whose
// definition rounds both its operands to bf16, ir/op_table.h, so it reads a bf16 value to
// the same Delta), or a reshape or transpose (which move values, so they commute with the
// rounding) every use of which does. The nodes in between are appended to `movers`, the
// converts to `converts`; an attention_delta stays and reads the narrowed value.
bool EveryUseRoundsToBf16(const Node& v, std::vector<Node*>& movers, std::vector<Node*>& converts) {
  if (v.users().empty() || IsFunctionOutput(v)) return false;
  for (Node* u : v.users()) {
    if (u->opcode() == Opcode::kConvert && u->type().dtype == DType::kBF16) {
      converts.push_back(u);
    } else if (u->opcode() == Opcode::kAttentionDelta) {
      continue;
    } else if (u->opcode() == Opcode::kReshape || u->opcode() == Opcode::kTranspose) {
      movers.push_back(u);
      if (!EveryUseRoundsToBf16(*u, movers, converts)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// The bf16 vector whose exact f32 widening is `gemm`'s bias operand, or null (also when the
// gemm has no bias). A narrow D takes a bias of its own dtype only (the gemm's rule, from
// cuBLASLt), and a bf16 value widened to f32 is the same number, so the narrowed gemm reads
// the bf16 vector itself: autocast's biased linear, whose bias is the bf16 copy.
Node* Bf16SourceOfBias(const Node& gemm) {
  absl::StatusOr<GemmSlots> slots = GemmSlotsOf(gemm.attrs());
  if (!slots.ok() || slots->bias < 0) return nullptr;
  const Node* bias = gemm.operand(slots->bias);
  if (bias->opcode() != Opcode::kConvert || bias->operand(0)->type().dtype != DType::kBF16) return nullptr;
  return bias->operand(0);
}

// A gemm that may write bf16 instead of its f32 result.
m::Pattern NarrowableGemm() {
  return m::Op(Opcode::kGemm)
      .WithDType(DType::kF32)
      .WithAttr("beta", 0.0)
      .WithOperand(0, m::Any().WithDType(DType::kBF16))
      .WithOperand(1, m::Any().WithDType(DType::kBF16))
      .Where("a and b only, or a bias that is a widened bf16 vector",
             [](const Node& n) { return n.num_operands() == 2 || (n.num_operands() == 3 && Bf16SourceOfBias(n)); })
      .Where("without FP8 slots", [](const Node& n) { return !HasFp8Slots(n); })
      .Where("read only by converts to bf16 (through reshapes and transposes)", [](const Node& n) {
        std::vector<Node*> movers, converts;
        return EveryUseRoundsToBf16(n, movers, converts);
      });
}

// A cross_entropy_grad that may round its f32 gradient to bf16 on store ({out_dtype=bf16}).
m::Pattern NarrowableCrossEntropyGrad() {
  return m::Op(Opcode::kCrossEntropyGrad)
      .WithDType(DType::kF32)
      .WithOperand(0, m::Any().WithDType(DType::kF32))
      .Where("without out_dtype", [](const Node& n) { return !n.attrs().Has("out_dtype"); })
      .Where("read only by converts to bf16 (through reshapes and transposes)", [](const Node& n) {
        std::vector<Node*> movers, converts;
        return EveryUseRoundsToBf16(n, movers, converts);
      });
}

// A paged_attention that may round its f32 O to bf16 on store ({out_dtype=bf16}): the decode
// step's attention output, read only as the o projection's bf16 operand.
m::Pattern NarrowablePagedAttention() {
  return m::Op(Opcode::kPagedAttention)
      .WithDType(DType::kF32)
      .Where("without out_dtype", [](const Node& n) { return !n.attrs().Has("out_dtype"); })
      .Where("read only by converts to bf16 (through reshapes and transposes)", [](const Node& n) {
        std::vector<Node*> movers, converts;
        return EveryUseRoundsToBf16(n, movers, converts);
      });
}

// An attention that may round its f32 O to bf16 on store ({out_dtype=bf16}): in a training
// step O feeds the o projection as its bf16 operand (through the transpose and reshape that
// join the heads) and attention_delta, which rounds O to bf16 itself. The node has two
// results; O is its get_result 0, the LSE stays f32.
m::Pattern NarrowableAttention() {
  return m::Op(Opcode::kAttention)
      .Where("without out_dtype", [](const Node& n) { return !n.attrs().Has("out_dtype"); })
      .Where("O f32, read only by converts to bf16 (through reshapes and transposes) and attention_delta",
             [](const Node& n) {
               const Node* o = n.result(0);
               std::vector<Node*> movers, converts;
               return o != nullptr && n.result_type(0).dtype == DType::kF32 &&
                      EveryUseRoundsToBf16(*o, movers, converts);
             });
}

void Retype(Node* n, DType dtype) {
  TensorType t = n->type();
  t.dtype = dtype;
  n->set_type(t);
}

}  // namespace

absl::StatusOr<bool> NarrowActivationsPass::RunOnFunction(Function& f) {
  const m::Pattern gemm = NarrowableGemm();
  const m::Pattern cross_entropy_grad = NarrowableCrossEntropyGrad();
  const m::Pattern paged_attention = NarrowablePagedAttention();
  const m::Pattern attention = NarrowableAttention();
  std::vector<Node*> producers;
  for (const auto& n : f.nodes()) {
    if (m::Match(n.get(), gemm) || m::Match(n.get(), cross_entropy_grad) || m::Match(n.get(), paged_attention) ||
        m::Match(n.get(), attention)) {
      producers.push_back(n.get());
    }
  }
  for (Node* producer : producers) {
    // The value narrowed: the producer's result, or attention's O (its get_result 0).
    Node* value = producer->opcode() == Opcode::kAttention ? producer->result(0) : producer;
    std::vector<Node*> movers, converts;
    EveryUseRoundsToBf16(*value, movers, converts);
    // A gemm's result dtype is declared; cross_entropy_grad's, paged_attention's and
    // attention's are inferred, from out_dtype.
    if (producer->opcode() == Opcode::kCrossEntropyGrad || producer->opcode() == Opcode::kPagedAttention ||
        producer->opcode() == Opcode::kAttention) {
      producer->mutable_attrs().Set("out_dtype", Symbol{std::string(DTypeName(DType::kBF16))});
    } else if (Node* bias = Bf16SourceOfBias(*producer)) {
      Node* widened = producer->operand(2);
      producer->ReplaceOperand(2, bias);
      if (widened->users().empty() && !IsFunctionOutput(*widened)) f.RemoveNode(widened);
    }
    if (producer->opcode() == Opcode::kAttention) {
      TensorType o = producer->result_type(0);
      o.dtype = DType::kBF16;
      producer->set_result_type(0, o);
    }
    Retype(value, DType::kBF16);
    for (Node* mover : movers) Retype(mover, DType::kBF16);
    for (Node* convert : converts) {  // each once: a convert has one operand
      convert->ReplaceAllUsesWith(convert->operand(0));
      f.RemoveNode(convert);
    }
  }
  return !producers.empty();
}

}  // namespace kiln
