#include "passes/fp8_policy.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ir/builder.h"
#include "ir/fp8_scaling.h"
#include "ir/shape_inference.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// A linear layer's GEMM under autocast: no batch dims, bf16 operands.
bool IsLinearGemm(const Node& n) {
  if (n.opcode() != Opcode::kDotGeneral) return false;
  absl::StatusOr<std::vector<int64_t>> batch = n.attrs().GetInts("lhs_batch");
  if (!batch.ok() || !batch->empty()) return false;
  return n.operand(0)->type().dtype == DType::kBF16 && n.operand(1)->type().dtype == DType::kBF16 &&
         n.operand(0)->type().rank() >= 1 && n.operand(1)->type().rank() >= 1;
}

Symbol DTypeSymbol(DType t) { return Symbol{std::string(DTypeName(t))}; }

Node* FirstNonParameter(const Function& f) {
  for (const auto& n : f.nodes()) {
    if (n->opcode() != Opcode::kParameter) return n.get();
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Fp8Policy>> Fp8Policy::Create(const Fp8Options& options) {
  if (options.history_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 amax history length must be >= 1, got ", options.history_length));
  }
  if (options.margin < 0 || options.margin > 16) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 margin must be in [0, 16], got ", options.margin));
  }
  if (!IsFp8(options.gradient_format)) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 gradient format must be f8e5m2 or f8e4m3, got ",
                                                   DTypeName(options.gradient_format)));
  }
  std::regex skip;
  try {
    skip = std::regex(options.skip_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 skip regex '", options.skip_regex, "' does not compile: ", e.what()));
  }
  return std::unique_ptr<Fp8Policy>(new Fp8Policy(options, std::move(skip)));
}

absl::Status Fp8Policy::QuantizeMicroBatch(Function& step, int64_t first_node, const Node* loss_seed) {
  std::vector<Node*> nodes;
  for (int64_t i = first_node; i < step.num_nodes(); ++i) nodes.push_back(step.nodes()[i].get());
  // Values derived from the loss gradient: the seed and everything computed from it.
  absl::flat_hash_set<const Node*> gradient;
  for (Node* n : nodes) {
    bool from_seed = n == loss_seed;
    for (const Node* o : n->operands()) from_seed = from_seed || gradient.contains(o);
    if (from_seed) gradient.insert(n);
  }
  const std::string micro_prefix = absl::StrCat("micro", micro_batches_, ".");
  auto stable_name = [&](const Node& v) {
    std::string name = v.name();
    if (absl::StartsWith(name, micro_prefix)) name = name.substr(micro_prefix.size());
    return name;
  };

  absl::flat_hash_map<Node*, Node*> dequantized;  // operand value -> its fp8_dequantize
  size_t next_state = 0;
  for (Node* gemm : nodes) {
    if (!IsLinearGemm(*gemm) || std::regex_search(gemm->scope(), skip_)) continue;
    for (int i = 0; i < 2; ++i) {
      Node* value = gemm->operand(i);
      auto it = dequantized.find(value);
      if (it == dequantized.end()) {
        // A weight's bf16 copy: quantize the f32 master weight itself (one rounding, and no
        // bf16 copy to write). Activations and gradients are quantized as the GEMM read them:
        // their producers write bf16 where every use rounds to it (narrow-activations-bf16,
        // fuse-residual-norm), half the bytes of an f32 source.
        Node* source = value;
        if (value->opcode() == Opcode::kConvert && value->operand(0)->opcode() == Opcode::kParameter &&
            value->operand(0)->type().dtype == DType::kF32) {
          source = value->operand(0);
        }
        const bool is_gradient = gradient.contains(value);
        const DType format = is_gradient ? options_.gradient_format : DType::kF8E4M3;
        const size_t state = next_state++;
        if (micro_batches_ == 0) {
          Fp8Tensor t{.scope = gemm->scope(), .format = format, .num_elements = value->type().num_elements()};
          t.name = source->opcode() == Opcode::kParameter
                       ? source->name()
                       : absl::StrCat(gemm->scope(), is_gradient ? ".grad." : ".act.", stable_name(*value));
          const TensorType state_type{DType::kF32, {options_.history_length + kFp8StateHeader}};
          Node* param = step.InsertNodeBefore(FirstNonParameter(step), Opcode::kParameter, {},
                                              {{"index", static_cast<int64_t>(step.parameters().size())}},
                                              state_type, step.UniqueName(absl::StrCat("fp8.", t.name)), "fp8");
          if (param == nullptr) return absl::InternalError("fp8 policy: could not add a state parameter");
          tensors_.push_back(std::move(t));
          state_params_.push_back(param);
          amaxes_.emplace_back();
        } else if (state >= tensors_.size() || tensors_[state].format != format ||
                   tensors_[state].num_elements != value->type().num_elements()) {
          return absl::InternalError(absl::StrCat("fp8 policy: micro-batch ", micro_batches_,
                                                  "'s GEMM operands differ from micro-batch 0's at %", value->name()));
        }
        AttrMap qattrs{{"out_dtype", DTypeSymbol(format)}};
        std::vector<Node*> qoperands{source, state_params_[state]};
        std::vector<TensorType> operand_types{source->type(), state_params_[state]->type()};
        ASSIGN_OR_RETURN(std::vector<TensorType> qtypes,
                         InferResultTypes(Opcode::kFp8Quantize, operand_types, qattrs, nullptr));
        const std::string base = step.UniqueName(absl::StrCat(value->name(), ".fp8"));
        std::vector<Node*> q = step.AppendMultiResultNode(
            Opcode::kFp8Quantize, qoperands, qattrs, qtypes,
            {base, absl::StrCat(base, ".amax"), absl::StrCat(base, ".scale_inv")}, gemm->scope(), gemm);
        if (q.size() != 3) return absl::InternalError(absl::StrCat("fp8 policy: could not quantize %", value->name()));
        TensorType dq_type = value->type();
        Node* dq = step.InsertNodeBefore(gemm, Opcode::kFp8Dequantize, {q[0], q[2]},
                                         {{"out_dtype", DTypeSymbol(DType::kBF16)}}, dq_type,
                                         step.UniqueName(absl::StrCat(base, ".dq")), gemm->scope());
        if (dq == nullptr) return absl::InternalError(absl::StrCat("fp8 policy: could not dequantize %", value->name()));
        amaxes_[state].push_back(q[1]);
        it = dequantized.emplace(value, dq).first;
      }
      gemm->ReplaceOperand(i, it->second);
    }
  }
  if (micro_batches_ > 0 && next_state != tensors_.size()) {
    return absl::InternalError(absl::StrCat("fp8 policy: micro-batch ", micro_batches_, " has ", next_state,
                                            " FP8 tensors, micro-batch 0 ", tensors_.size()));
  }
  ++micro_batches_;
  return absl::OkStatus();
}

absl::StatusOr<Fp8Policy::Updates> Fp8Policy::AppendScaleUpdates(Function& step) {
  Builder b(&step);
  b.set_scope("fp8");
  Updates updates;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    Node* amax = amaxes_[i][0];
    for (size_t m = 1; m < amaxes_[i].size(); ++m) {
      ASSIGN_OR_RETURN(amax, b.Binary(Opcode::kMax, amax, amaxes_[i][m]));
    }
    AttrMap attrs{{"fp8_format", DTypeSymbol(tensors_[i].format)}, {"margin", options_.margin}};
    ASSIGN_OR_RETURN(Node * next, b.Op(Opcode::kFp8ScaleUpdate, {state_params_[i], amax}, std::move(attrs), nullptr,
                                       absl::StrCat(state_params_[i]->name(), ".new")));
    updates.params.push_back(state_params_[i]);
    updates.outputs.push_back(next);
  }
  return updates;
}

}  // namespace kiln
