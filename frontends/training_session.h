// Trains any model, given only its forward function, on the CPU reference backend or CUDA.
//
// The model is a function @forward whose first `num_batch_inputs` parameters are a step's
// data (inputs, targets: any dtypes and shapes) and whose other parameters are the
// trainable weights (f32); its output 0 is the f32[] loss. The session compiles the training
// step as `kiln train` does (passes/training_compile.h: the forward pipeline, autodiff,
// global-norm clipping, AdamW, then the default pipeline) and runs it on a Trainer
// (frontends/trainer.h): the reference backend keeps the weights and AdamW moments in host
// memory; CUDA (frontends/cuda_trainer.h) keeps them on the device and replays one CUDA graph
// per step, copying in only the batch and the learning rate and out only the loss.
// frontends/trainer.h's token-batch trainers do the same for the presets; this is the general
// form, for a model written with frontends/tensor.h and frontends/nn.h:
//
//   Graph g(module->AddFunction("forward"));
//   Tensor x = g.Parameter("x", {DType::kF32, {64, 8}});
//   Tensor y = g.Parameter("y", {DType::kF32, {64, 1}});
//   Tensor w = g.Parameter("w", {DType::kF32, {1, 8}});
//   Tensor err = Linear(x, w, DType::kF32) - y;
//   RETURN_IF_ERROR(g.Finish({ReduceSum(err * err, {0, 1}) / 64.0}));
//   TrainingSessionOptions options;
//   options.backend = Backend::kCuda;  // or kCpu (the default)
//   ASSIGN_OR_RETURN(auto session, TrainingSession::Create(std::move(module), {w0}, options));
//   ASSIGN_OR_RETURN(double loss, session->Step({x0, y0}, /*lr=*/1e-2));
//   RETURN_IF_ERROR(session->Save("run.safetensors"));  // weights + AdamW state
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontends/compile.h"
#include "frontends/trainer.h"
#include "frontends/training_checkpoint.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "ir/reference_backend.h"
#include "passes/compile_options.h"
#include "passes/training_step.h"

namespace kiln {

struct TrainingSessionOptions {
  // AdamW, clipping, gradient accumulation (accum_steps micro-batches per Step), and how
  // many of @forward's first parameters are data (num_batch_inputs, 2 by default).
  TrainingStepOptions step;
  Backend backend = Backend::kCpu;
  // The passes' options, as `kiln train`'s flags set them (precision policy, target,
  // disabled passes, dumps). For CUDA an unset target is the device's.
  CompileOptions compile;
  ReferenceOptions reference;  // threads of the reference backend
  // CUDA: the device, which must outlive the session; null opens device 0, owned by it.
  CudaDevice* device = nullptr;
  bool cuda_graph = true;  // false launches the step's kernels one by one (debugging)
};

class TrainingSession {
 public:
  // `module` must hold @forward as described above; `initial_params` are the weights, in
  // the order @forward takes them (after the data). The AdamW moments start at zero.
  // Backend::kCuda where CUDA cannot run is FailedPrecondition, saying why.
  static absl::StatusOr<std::unique_ptr<TrainingSession>> Create(std::unique_ptr<Module> module,
                                                                 std::vector<HostTensor> initial_params,
                                                                 TrainingSessionOptions options = {});
  ~TrainingSession();

  // One AdamW update over `accum_steps` micro-batches, each one tensor per data parameter of
  // @forward with its type; returns the mean loss before the update. A refused step (a
  // batch of the wrong type, say) leaves the session as it was.
  absl::StatusOr<double> Step(const std::vector<std::vector<HostTensor>>& micro_batches, double lr);
  // The same for accum_steps == 1. (Not Step({batch}, lr): that braced list would pick this
  // overload again.)
  absl::StatusOr<double> Step(const std::vector<HostTensor>& batch, double lr) {
    return Step(std::vector<std::vector<HostTensor>>{batch}, lr);
  }

  // @forward's outputs on `batch` (one tensor per data parameter) with the current weights,
  // on the session's backend (CUDA: @forward is compiled on first use, and the weights are
  // copied to it on the device).
  absl::StatusOr<std::vector<HostTensor>> Forward(const std::vector<HostTensor>& batch);

  // Copies of the weights, and of everything a checkpoint holds (weights, AdamW moments,
  // step count); from the device for CUDA.
  absl::StatusOr<std::vector<HostTensor>> Params() const;
  absl::StatusOr<TrainingState> State() const;
  // Replaces the state (shapes checked against the step); the next Step continues from it.
  absl::Status SetState(TrainingState state);

  // The state as one safetensors file (frontends/training_checkpoint.h: the weights under
  // @forward's parameter names, "adamw.m.<name>", "adamw.v.<name>", "adamw.t", the step
  // count), written atomically; `metadata` is stored beside it. Load reads such a file of
  // the same model (names and types checked) into the session, on either backend.
  absl::Status Save(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;
  absl::StatusOr<std::map<std::string, std::string>> Load(const std::string& path);

  Backend backend() const { return options_.backend; }
  int64_t steps_done() const { return trainer_->steps_done(); }
  // The weights' names and types: @forward's parameters after the data.
  const std::vector<NamedWeight>& weights() const { return weights_; }
  const Module& module() const { return *module_; }
  const Function& forward() const { return *forward_; }
  const Function& step_function() const { return *step_; }
  const Trainer& trainer() const { return *trainer_; }

 private:
  TrainingSession() = default;
  class GpuForward;  // @forward compiled for the device, on first use

  // The module, owned by trainer_.
  const Module* module_ = nullptr;
  const Function* forward_ = nullptr;
  const Function* step_ = nullptr;
  TrainingStepLayout layout_;
  TrainingSessionOptions options_;
  std::vector<NamedWeight> weights_;
  // Declared before the trainer, so destroyed after it. A shared_ptr: its deleter is bound
  // where CudaDevice is complete, so builds without CUDA (where it is only declared) compile.
  std::shared_ptr<CudaDevice> owned_device_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<GpuForward> gpu_forward_;
};

}  // namespace kiln
