// Trains any model on the CPU reference backend, given only its forward function.
//
// The model is a function @forward whose first `num_batch_inputs` parameters are a step's
// data (inputs, targets: any dtypes and shapes) and whose other parameters are the
// trainable weights (f32); its output 0 is the f32[] loss. The session adds the training
// step to the module (passes/training_step.h: autodiff, global-norm clipping, AdamW) and
// runs it with EvaluateFunction, keeping the weights and AdamW moments between steps.
// frontends/trainer.h does the same for the Llama models over token batches; this is the
// general form, for a model written with frontends/tensor.h and frontends/nn.h:
//
//   Graph g(module->AddFunction("forward"));
//   Tensor x = g.Parameter("x", {DType::kF32, {64, 8}});
//   Tensor y = g.Parameter("y", {DType::kF32, {64, 1}});
//   Tensor w = g.Parameter("w", {DType::kF32, {1, 8}});
//   Tensor err = Linear(x, w, DType::kF32) - y;
//   RETURN_IF_ERROR(g.Finish({ReduceSum(err * err, {0, 1}) / 64.0}));
//   ASSIGN_OR_RETURN(auto session, TrainingSession::Create(std::move(module), {w0}));
//   ASSIGN_OR_RETURN(double loss, session->Step({x0, y0}, /*lr=*/1e-2));
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "frontends/trainer.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "ir/reference_backend.h"
#include "passes/training_step.h"

namespace kiln {

struct TrainingSessionOptions {
  // AdamW, clipping, gradient accumulation (accum_steps micro-batches per Step), and how
  // many of @forward's first parameters are data (num_batch_inputs, 2 by default).
  TrainingStepOptions step;
  ReferenceOptions reference;  // threads of the reference backend
};

class TrainingSession {
 public:
  // `module` must hold @forward as described above; `initial_params` are the weights, in
  // the order @forward takes them (after the data). The AdamW moments start at zero.
  static absl::StatusOr<std::unique_ptr<TrainingSession>> Create(std::unique_ptr<Module> module,
                                                                 std::vector<HostTensor> initial_params,
                                                                 TrainingSessionOptions options = {});

  // One AdamW update over `accum_steps` micro-batches, each one tensor per data parameter of
  // @forward with its type; returns the mean loss before the update.
  absl::StatusOr<double> Step(const std::vector<std::vector<HostTensor>>& micro_batches, double lr);
  // The same for accum_steps == 1. (Not Step({batch}, lr): that braced list would pick this
  // overload again.)
  absl::StatusOr<double> Step(const std::vector<HostTensor>& batch, double lr) {
    return Step(std::vector<std::vector<HostTensor>>{batch}, lr);
  }

  // @forward's outputs on `batch` (one tensor per data parameter) with the current weights.
  absl::StatusOr<std::vector<HostTensor>> Forward(const std::vector<HostTensor>& batch) const;

  const std::vector<HostTensor>& params() const { return state_.params; }
  // Weights, AdamW moments and step count (what a checkpoint would hold).
  const TrainingState& state() const { return state_; }
  int64_t steps_done() const { return state_.step; }
  const Module& module() const { return *module_; }
  const Function& forward() const { return *forward_; }
  const Function& step_function() const { return *step_; }

 private:
  TrainingSession() = default;

  std::unique_ptr<Module> module_;
  const Function* forward_ = nullptr;
  const Function* step_ = nullptr;
  TrainingStepLayout layout_;
  TrainingSessionOptions options_;
  TrainingState state_;
};

}  // namespace kiln
