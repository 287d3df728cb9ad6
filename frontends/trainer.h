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
#include "ir/host_tensor.h"
#include "ir/reference_backend.h"
#include "runtime/training/dataset.h"

namespace kiln {

// Everything a checkpoint holds besides the config.
struct TrainingState {
  std::vector<HostTensor> params, m, v;  // in TrainingStepLayout order
  HostTensor t;                          // f32[]: AdamW updates done
  // The FP8 policy's delayed-scaling states, in TrainingStepLayout order (f32 [L + 2] each,
  // passes/fp8_policy.h). Empty: all zero, the initial state (a fresh run, or a trainer
  // without the policy).
  std::vector<HostTensor> fp8;
  int64_t step = 0;                      // steps completed
};

// One training step on the CPU reference backend: `step` (a BuildTrainingStep function of
// `layout`) evaluated on the state, the batch's tensors (TrainingStepLayout order, after t)
// and the learning rate. The state moves in and the donated outputs move back, the host-side
// analogue of the step's donated buffers; on an error the state is given back unchanged, so
// the caller stays usable (and checkpointable). Returns the loss.
absl::StatusOr<double> RunReferenceStep(const Function& step, const TrainingStepLayout& layout,
                                        const ReferenceOptions& options, std::vector<HostTensor> batch, double lr,
                                        TrainingState& state);

// A backend that runs training steps. The state lives where the backend keeps it (host
// memory for the reference backend, the device for CUDA); State() copies it out for
// checkpoints, SetState() puts a checkpoint's state back.
class Trainer {
 public:
  virtual ~Trainer() = default;
  virtual absl::string_view backend() const = 0;
  // One update over `micro_batches` (one per accumulation step); returns the mean loss.
  virtual absl::StatusOr<double> Step(const std::vector<TokenBatch>& micro_batches, double lr) = 0;
  // The same for a step whose data is not token batches (frontends/training_session.h): the
  // step's batch inputs (TrainingStepLayout order, after t; each with the leading k of the
  // micro-batches), of the step function's types.
  virtual absl::StatusOr<double> StepTensors(std::vector<HostTensor> batch, double lr) = 0;
  virtual int64_t steps_done() const = 0;
  virtual absl::StatusOr<TrainingState> State() const = 0;
  virtual absl::Status SetState(TrainingState state) = 0;
  // The FP8 policy's scaling states alone (TrainingState::fp8; none without the policy),
  // without copying the rest of the state: what the report reads.
  virtual absl::StatusOr<std::vector<HostTensor>> Fp8States() const = 0;
};

// The step's batch inputs (tokens and targets, i32[k, B, T]) from k micro-batches; the
// error says what the step expects.
absl::StatusOr<std::pair<HostTensor, HostTensor>> BatchTensors(const Function& step_function,
                                                               const TrainingStepLayout& layout,
                                                               const std::vector<TokenBatch>& micro_batches);
// The state before the first step: these weights, zero AdamW moments, t = 0.
TrainingState InitialTrainingState(std::vector<HostTensor> params);
// Checks a state's tensors against the step function's parameters.
absl::Status CheckTrainingState(const Function& step_function, const TrainingStepLayout& layout,
                                const TrainingState& state);

class ReferenceTrainer : public Trainer {
 public:
  // `step_function` is a function of `module` built by BuildTrainingStep with `layout`.
  // The AdamW moments start at zero.
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(std::unique_ptr<Module> module,
                                                                  const Function* step_function,
                                                                  TrainingStepLayout layout,
                                                                  std::vector<HostTensor> initial_params,
                                                                  ReferenceOptions options = {});

  absl::string_view backend() const override { return "cpu"; }
  absl::StatusOr<double> Step(const std::vector<TokenBatch>& micro_batches, double lr) override;
  absl::StatusOr<double> StepTensors(std::vector<HostTensor> batch, double lr) override;
  int64_t steps_done() const override { return state_.step; }
  absl::StatusOr<TrainingState> State() const override { return state_; }
  absl::StatusOr<std::vector<HostTensor>> Fp8States() const override { return state_.fp8; }
  const TrainingState& state() const { return state_; }
  // Replaces the state (resume); shapes must match the step function's parameters.
  absl::Status SetState(TrainingState state) override;
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
