// Builds the training step from a forward function:
//
//   step(params..., m..., v..., t, batch..., lr) -> (loss, params'..., m'..., v'..., t')
//
// params', m', v' and t' are donated: each output aliases its input, so a backend updates
// them in place. The step is written in the straightforward form on purpose:
//   - k micro-batches (gradient accumulation): the batch inputs gain a leading dim k; one
//     copy of the forward and backward runs per micro-batch, and each gradient buffer is
//     zeroed, then accumulated (g = 0; g += grad_i / k). A later pass (elide-grad-zeroing)
//     removes the zeroing;
//   - global-norm clipping: g *= min(1, clip / (||g||_2 + 1e-6)) over all parameters, the factor
//     applied by each adamw_update as it reads g (its grad_scale operand; 1 without clipping);
//   - AdamW as in torch.optim.AdamW: p <- p (1 - lr wd); m <- b1 m + (1 - b1) g;
//     v <- b2 v + (1 - b2) g^2; p <- p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps),
//     with t counted in the step (t' = t + 1). Weight decay applies to parameters of rank
//     >= 2 (matrices and embeddings), not to norm weights. The per-step scalars
//     (lr / (1 - b1^t), 1 - lr wd, sqrt(1 - b2^t)) are computed once in the IR; each
//     parameter then gets one adamw_update node of three results (p', m', v'), lowered to
//     one kernel of kernels/adamw.cuh, e.g.
//       %w.new, %adamw.m.w.new, %adamw.v.w.new = adamw_update(%w, %g, %adamw.m.w, %adamw.v.w,
//           %step_size, %decay, %sqrt_bc2, %grad_scale) {beta1=0.9, beta2=0.95, eps=1e-08}
//           : (f32[64,64], f32[64,64], f32[64,64])
//     (the default pipeline's group-optimizer-updates then puts up to 72 of those that share
//     their scalars into one grouped node, one kernel).
// The learning rate is an input, so the schedule (warmup + cosine) is the caller's.
// With options.fp8 (the FP8 policy, passes/fp8_policy.h) each micro-batch's linear-layer
// GEMMs read FP8 operands, and the step gains one delayed-scaling state per FP8 tensor:
//   step(..., lr, fp8 states...) -> (..., t', fp8 states'...)
// the states donated like the optimizer's, all zero initially.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "passes/fp8_policy.h"

namespace kiln {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double clip_norm = 1.0;  // 0 disables clipping
};

struct TrainingStepOptions {
  AdamWConfig adamw;
  int64_t accum_steps = 1;      // micro-batches per update
  int64_t num_batch_inputs = 2;  // the forward's first parameters that are per-step data
  std::string name = "train_step";
  std::optional<Fp8Options> fp8;  // the FP8 policy, or bf16's GEMMs
};

// The layout of the step function's parameters and outputs, for the caller that feeds it.
struct TrainingStepLayout {
  int64_t num_params = 0;        // trainable tensors (the forward's parameters after the batch inputs)
  int64_t num_batch_inputs = 0;
  // Parameter indices of the step function.
  int64_t first_param() const { return 0; }
  int64_t first_m() const { return num_params; }
  int64_t first_v() const { return 2 * num_params; }
  int64_t t_index() const { return 3 * num_params; }
  int64_t first_batch_input() const { return 3 * num_params + 1; }
  int64_t lr_index() const { return first_batch_input() + num_batch_inputs; }
  // The FP8 policy's delayed-scaling states (none without it), f32 [L + 2] each.
  std::vector<Fp8Tensor> fp8_tensors;
  int64_t num_fp8_states() const { return static_cast<int64_t>(fp8_tensors.size()); }
  int64_t first_fp8_state() const { return lr_index() + 1; }
  // Outputs: 0 is the loss, then params', m', v', t', fp8 states' in the order of the inputs.
};

// Adds the step function to `module`; `forward` must be a function of `module` whose
// output 0 is a scalar f32 loss.
absl::StatusOr<Function*> BuildTrainingStep(Module& module, const Function& forward,
                                            const TrainingStepOptions& options, TrainingStepLayout* layout = nullptr);

}  // namespace kiln
