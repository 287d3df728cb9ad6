// The training driver (it sits in frontends/ because it ties passes/ and runtime/ together).
// Runs a training-step function (passes/training_step.h) step after step on the CPU
// reference backend, keeping the parameters and AdamW state between steps. The step's
// donated outputs (params', m', v', t') become the next step's inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "passes/training_step.h"
#include "runtime/host_tensor.h"
#include "runtime/reference_backend.h"
#include "runtime/training/dataset.h"

namespace kiln {

// Everything a checkpoint holds besides the config.
struct TrainingState {
  std::vector<HostTensor> params, m, v;  // in TrainingStepLayout order
  HostTensor t;                          // f32[]: AdamW updates done
  int64_t step = 0;                      // steps completed
};

class ReferenceTrainer {
 public:
  // `step_function` is a function of `module` built by BuildTrainingStep with `layout`.
  // The AdamW moments start at zero.
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(std::unique_ptr<Module> module,
                                                                  const Function* step_function,
                                                                  TrainingStepLayout layout,
                                                                  std::vector<HostTensor> initial_params,
                                                                  ReferenceOptions options = {});

  // One update over `micro_batches` (one per accumulation step); returns the mean loss.
  absl::StatusOr<double> Step(const std::vector<TokenBatch>& micro_batches, double lr);

  const TrainingState& state() const { return state_; }
  // Replaces the state (resume); shapes must match the step function's parameters.
  absl::Status SetState(TrainingState state);
  const Function& step_function() const { return *step_; }

 private:
  ReferenceTrainer() = default;
  std::unique_ptr<Module> module_;
  const Function* step_ = nullptr;
  TrainingStepLayout layout_;
  ReferenceOptions options_;
  TrainingState state_;
};

}  // namespace kiln
