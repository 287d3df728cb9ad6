#include "passes/training_step.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "ir/builder.h"
#include "ir/status_macros.h"
#include "passes/autodiff.h"
#include "passes/inline_function.h"

namespace kiln {
namespace {

// Elementwise arithmetic on f32 tensors with scalar operands broadcast as needed.
class Arith {
 public:
  explicit Arith(Builder& b) : b_(b) {}

  absl::StatusOr<Node*> Scalar(double v) { return b_.Constant(v, {DType::kF32, {}}); }
  // Broadcasts a scalar node to `like`'s shape (no-op for scalars).
  absl::StatusOr<Node*> Splat(Node* scalar, Node* like) {
    if (like->type().rank() == 0) return scalar;
    return b_.BroadcastScalar(scalar, like->type().dims);
  }
  absl::StatusOr<Node*> MulScalar(Node* x, Node* scalar) {
    ASSIGN_OR_RETURN(Node * s, Splat(scalar, x));
    return b_.Mul(x, s);
  }
  absl::StatusOr<Node*> MulConst(Node* x, double v) {
    ASSIGN_OR_RETURN(Node * s, Scalar(v));
    return MulScalar(x, s);
  }
  absl::StatusOr<Node*> AddConst(Node* x, double v) {
    ASSIGN_OR_RETURN(Node * s, Scalar(v));
    ASSIGN_OR_RETURN(Node * sb, Splat(s, x));
    return b_.Add(x, sb);
  }
  absl::StatusOr<Node*> SumAll(Node* x) {
    std::vector<int64_t> dims;
    for (int i = 0; i < x->type().rank(); ++i) dims.push_back(i);
    if (dims.empty()) return x;
    return b_.ReduceSum(x, dims);
  }

 private:
  Builder& b_;
};

}  // namespace

absl::StatusOr<Function*> BuildTrainingStep(Module& module, const Function& forward,
                                            const TrainingStepOptions& options, TrainingStepLayout* layout_out) {
  if (forward.outputs().empty() || forward.outputs()[0]->type() != TensorType{DType::kF32, {}}) {
    return absl::InvalidArgumentError(
        absl::StrCat("training step: @", forward.name(), "'s output 0 must be the f32[] loss"));
  }
  if (options.accum_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("training step: accum_steps must be >= 1, got ", options.accum_steps));
  }
  std::vector<Node*> fwd_params = forward.parameters();
  const int64_t nb = options.num_batch_inputs;
  if (nb < 0 || nb > static_cast<int64_t>(fwd_params.size())) {
    return absl::InvalidArgumentError("training step: num_batch_inputs exceeds the forward's parameters");
  }
  TrainingStepLayout layout{static_cast<int64_t>(fwd_params.size()) - nb, nb};
  for (int64_t i = nb; i < static_cast<int64_t>(fwd_params.size()); ++i) {
    if (fwd_params[i]->type().dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("training step: trainable parameter %", fwd_params[i]->name(),
                                                     " must be f32 (master weights), got ",
                                                     fwd_params[i]->type().ToString()));
    }
  }
  Function* step = module.AddFunction(options.name);
  if (step == nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("training step: @", options.name, " already exists"));
  }
  Builder b(step);
  Arith a(b);
  const AdamWConfig& h = options.adamw;
  const int64_t k = options.accum_steps;

  // Parameters, in TrainingStepLayout order.
  std::vector<Node*> params, ms, vs, batch;
  for (int64_t i = 0; i < layout.num_params; ++i) {
    Node* p = fwd_params[nb + i];
    ASSIGN_OR_RETURN(Node * param, b.Parameter(p->name(), p->type()));
    params.push_back(param);
  }
  for (int64_t i = 0; i < layout.num_params; ++i) {
    ASSIGN_OR_RETURN(Node * m, b.Parameter(absl::StrCat("adamw.m.", params[i]->name()), params[i]->type()));
    ms.push_back(m);
  }
  for (int64_t i = 0; i < layout.num_params; ++i) {
    ASSIGN_OR_RETURN(Node * v, b.Parameter(absl::StrCat("adamw.v.", params[i]->name()), params[i]->type()));
    vs.push_back(v);
  }
  ASSIGN_OR_RETURN(Node * t, b.Parameter("adamw.t", {DType::kF32, {}}));
  for (int64_t i = 0; i < nb; ++i) {
    TensorType bt = fwd_params[i]->type();
    bt.dims.insert(bt.dims.begin(), k);
    ASSIGN_OR_RETURN(Node * in, b.Parameter(fwd_params[i]->name(), bt));
    batch.push_back(in);
  }
  ASSIGN_OR_RETURN(Node * lr, b.Parameter("lr", {DType::kF32, {}}));

  // Gradient accumulation: the first micro-batch's gradient is the sum so far (never a zeroed
  // buffer plus it: +0 + g is not g when g is -0, so no pass could remove such an add), each
  // later one is added. elide-grad-zeroing (passes/elide_grad_zeroing.h) then folds each add
  // into the GEMM that computes the addend (beta=1).
  std::vector<Node*> grads(layout.num_params, nullptr);
  Node* loss_sum = nullptr;
  std::unique_ptr<Fp8Policy> fp8;
  if (options.fp8.has_value()) {
    ASSIGN_OR_RETURN(fp8, Fp8Policy::Create(*options.fp8));
  }
  for (int64_t micro = 0; micro < k; ++micro) {
    std::vector<Node*> args;
    b.set_scope("");
    for (int64_t i = 0; i < nb; ++i) {
      std::vector<int64_t> start(batch[i]->type().rank(), 0), limit = batch[i]->type().dims;
      start[0] = micro;
      limit[0] = micro + 1;
      ASSIGN_OR_RETURN(Node * s, b.Slice(batch[i], start, limit));
      ASSIGN_OR_RETURN(Node * r, b.Reshape(s, fwd_params[i]->type().dims));
      args.push_back(r);
    }
    args.insert(args.end(), params.begin(), params.end());
    std::string prefix = k == 1 ? "" : absl::StrCat("micro", micro, ".");
    const int64_t first_node = step->num_nodes();
    ASSIGN_OR_RETURN(std::vector<Node*> outs, InlineFunction(*step, forward, args, prefix));
    ASSIGN_OR_RETURN(std::vector<Node*> micro_grads, AppendBackward(*step, outs[0], params));
    if (fp8 != nullptr) {  // autodiff names the loss's cotangent seed "<loss>.grad"
      const Node* seed = step->FindNode(absl::StrCat(outs[0]->name(), ".grad"));
      if (seed == nullptr || seed->opcode() != Opcode::kConstant) {
        return absl::InternalError("training step: the FP8 policy cannot find the backward's seed");
      }
      RETURN_IF_ERROR(fp8->QuantizeMicroBatch(*step, first_node, seed));
    }
    b.set_scope("grad_accum");
    if (micro == 0) {
      loss_sum = outs[0];
    } else {
      ASSIGN_OR_RETURN(loss_sum, b.Add(loss_sum, outs[0]));
    }
    for (int64_t i = 0; i < layout.num_params; ++i) {
      Node* g = micro_grads[i];
      if (k > 1) {
        ASSIGN_OR_RETURN(g, a.MulConst(g, 1.0 / static_cast<double>(k)));
      }
      if (micro == 0) {
        grads[i] = g;
      } else {
        ASSIGN_OR_RETURN(grads[i], b.Add(grads[i], g));
      }
    }
  }
  ASSIGN_OR_RETURN(Node * inv_k, a.Scalar(1.0 / static_cast<double>(k)));
  ASSIGN_OR_RETURN(Node * loss, b.Named("loss").Mul(loss_sum, inv_k));

  // Global-norm clipping: the factor min(1, clip / (norm + 1e-6)), which AdamW applies to
  // each gradient as it reads it (no pass over the gradients to scale them first).
  Node* grad_scale = nullptr;
  if (h.clip_norm > 0) {
    b.set_scope("grad_clip");
    // One node over every gradient (a multi-tensor kernel), not a reduction per gradient.
    Node* sq_sum = nullptr;
    if (grads.empty()) {
      ASSIGN_OR_RETURN(sq_sum, a.Scalar(0.0));
    } else {
      ASSIGN_OR_RETURN(sq_sum, b.Op(Opcode::kSumOfSquares, grads, {}));
    }
    ASSIGN_OR_RETURN(Node * norm, b.Unary(Opcode::kSqrt, sq_sum));
    ASSIGN_OR_RETURN(Node * denom, a.AddConst(norm, 1e-6));
    ASSIGN_OR_RETURN(Node * clip, a.Scalar(h.clip_norm));
    ASSIGN_OR_RETURN(Node * ratio, b.Div(clip, denom));
    ASSIGN_OR_RETURN(Node * one, a.Scalar(1.0));
    ASSIGN_OR_RETURN(Node * scale, b.Binary(Opcode::kMin, ratio, one));
    grad_scale = scale;  // applied by each adamw_update as it reads the gradient
  }
  if (grad_scale == nullptr) {
    ASSIGN_OR_RETURN(grad_scale, a.Scalar(1.0));
  }

  // AdamW.
  b.set_scope("adamw");
  ASSIGN_OR_RETURN(Node * one_step, a.Scalar(1.0));
  ASSIGN_OR_RETURN(Node * t_next, b.Named("adamw.t.new").Add(t, one_step));
  // 1 - beta^t = 1 - exp(t ln beta): the IR has no pow, and t is a runtime value.
  auto bias_correction = [&](double beta) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node * e, a.MulConst(t_next, std::log(beta)));
    ASSIGN_OR_RETURN(Node * p, b.Unary(Opcode::kExp, e));
    ASSIGN_OR_RETURN(Node * neg, a.MulConst(p, -1.0));
    return a.AddConst(neg, 1.0);
  };
  ASSIGN_OR_RETURN(Node * bc1, bias_correction(h.beta1));
  ASSIGN_OR_RETURN(Node * bc2, bias_correction(h.beta2));
  ASSIGN_OR_RETURN(Node * step_size, b.Div(lr, bc1));
  ASSIGN_OR_RETURN(Node * sqrt_bc2, b.Unary(Opcode::kSqrt, bc2));
  ASSIGN_OR_RETURN(Node * lr_wd, a.MulConst(lr, h.weight_decay));
  ASSIGN_OR_RETURN(Node * neg_lr_wd, a.MulConst(lr_wd, -1.0));
  ASSIGN_OR_RETURN(Node * decay, a.AddConst(neg_lr_wd, 1.0));
  ASSIGN_OR_RETURN(Node * no_decay, a.Scalar(1.0));

  // One adamw_update per parameter, its results p', m', v' (one kernel, kernels/adamw.cuh,
  // updating the three in place), sharing the per-step scalars above.
  std::vector<Node*> new_params, new_ms, new_vs;
  for (int64_t i = 0; i < layout.num_params; ++i) {
    Node* p = params[i];
    Node* p_decay = p->type().rank() >= 2 && h.weight_decay != 0 ? decay : no_decay;
    AttrMap attrs{{"beta1", h.beta1}, {"beta2", h.beta2}, {"eps", h.eps}};
    ASSIGN_OR_RETURN(std::vector<Node*> updated,
                     b.MultiResultOp(Opcode::kAdamWUpdate, {p, grads[i], ms[i], vs[i], step_size, p_decay, sqrt_bc2, grad_scale},
                                     std::move(attrs),
                                     {absl::StrCat(p->name(), ".new"), absl::StrCat(ms[i]->name(), ".new"),
                                      absl::StrCat(vs[i]->name(), ".new")}));
    new_params.push_back(updated[0]);
    new_ms.push_back(updated[1]);
    new_vs.push_back(updated[2]);
  }
  b.set_scope("");
  Fp8Policy::Updates fp8_updates;
  if (fp8 != nullptr) {
    ASSIGN_OR_RETURN(fp8_updates, fp8->AppendScaleUpdates(*step));
    layout.fp8_tensors = fp8->tensors();
  }

  std::vector<Node*> outputs{loss};
  std::vector<int64_t> aliases{-1};
  auto add_outputs = [&](const std::vector<Node*>& nodes, int64_t first) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      outputs.push_back(nodes[i]);
      aliases.push_back(first + static_cast<int64_t>(i));
    }
  };
  add_outputs(new_params, layout.first_param());
  add_outputs(new_ms, layout.first_m());
  add_outputs(new_vs, layout.first_v());
  add_outputs({t_next}, layout.t_index());
  add_outputs(fp8_updates.outputs, layout.first_fp8_state());
  RETURN_IF_ERROR(b.Return(outputs, aliases));
  if (layout_out) *layout_out = layout;
  return step;
}

}  // namespace kiln
