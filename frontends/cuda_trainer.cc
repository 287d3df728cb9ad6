#include "frontends/cuda_trainer.h"

#ifdef KILN_WITH_CUDA

#include "absl/strings/str_cat.h"
#include "frontends/gpu_compile.h"
#include "ir/status_macros.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<CudaTrainer>> CudaTrainer::Create(std::unique_ptr<Module> module,
                                                                 const Function* step_function,
                                                                 TrainingStepLayout layout,
                                                                 std::vector<HostTensor> initial_params,
                                                                 CudaDevice& device,
                                                                 const CudaExecutableOptions& options) {
  auto trainer = std::unique_ptr<CudaTrainer>(new CudaTrainer());
  trainer->module_ = std::move(module);
  trainer->step_ = step_function;
  trainer->layout_ = layout;
  ASSIGN_OR_RETURN(trainer->executable_, CompileForGpu(*step_function, device, options));
  // InitialTrainingState's moments and t are zeros: set on the device rather than built and
  // copied from the host (for llama-M, 6.6 GB that would only say "zero").
  // SetInput checks each tensor's type against its parameter.
  if (static_cast<int64_t>(initial_params.size()) != layout.num_params) {
    return absl::InvalidArgumentError(absl::StrCat("initial weights: ", initial_params.size(),
                                                   " tensors for a model of ", layout.num_params));
  }
  for (int64_t i = 0; i < layout.num_params; ++i) {
    RETURN_IF_ERROR(trainer->executable_->SetInput(layout.first_param() + i, initial_params[i]));
    RETURN_IF_ERROR(trainer->executable_->ZeroInput(layout.first_m() + i));
    RETURN_IF_ERROR(trainer->executable_->ZeroInput(layout.first_v() + i));
  }
  RETURN_IF_ERROR(trainer->executable_->ZeroInput(layout.t_index()));
  for (int64_t i = 0; i < layout.num_fp8_states(); ++i) {  // scale 1, no amax history yet
    RETURN_IF_ERROR(trainer->executable_->ZeroInput(layout.first_fp8_state() + i));
  }
  return trainer;
}

absl::Status CudaTrainer::SetState(TrainingState state) {
  RETURN_IF_ERROR(CheckTrainingState(*step_, layout_, state));
  for (int64_t i = 0; i < layout_.num_params; ++i) {
    RETURN_IF_ERROR(executable_->SetInput(layout_.first_param() + i, state.params[i]));
    RETURN_IF_ERROR(executable_->SetInput(layout_.first_m() + i, state.m[i]));
    RETURN_IF_ERROR(executable_->SetInput(layout_.first_v() + i, state.v[i]));
  }
  RETURN_IF_ERROR(executable_->SetInput(layout_.t_index(), state.t));
  for (int64_t i = 0; i < layout_.num_fp8_states(); ++i) {
    const int64_t input = layout_.first_fp8_state() + i;
    RETURN_IF_ERROR(state.fp8.empty() ? executable_->ZeroInput(input) : executable_->SetInput(input, state.fp8[i]));
  }
  steps_done_ = state.step;
  return absl::OkStatus();
}

absl::StatusOr<TrainingState> CudaTrainer::State() const {
  TrainingState state;
  for (int64_t i = 0; i < layout_.num_params; ++i) {
    ASSIGN_OR_RETURN(HostTensor p, executable_->Input(layout_.first_param() + i));
    ASSIGN_OR_RETURN(HostTensor m, executable_->Input(layout_.first_m() + i));
    ASSIGN_OR_RETURN(HostTensor v, executable_->Input(layout_.first_v() + i));
    state.params.push_back(std::move(p));
    state.m.push_back(std::move(m));
    state.v.push_back(std::move(v));
  }
  ASSIGN_OR_RETURN(state.t, executable_->Input(layout_.t_index()));
  for (int64_t i = 0; i < layout_.num_fp8_states(); ++i) {
    ASSIGN_OR_RETURN(HostTensor s, executable_->Input(layout_.first_fp8_state() + i));
    state.fp8.push_back(std::move(s));
  }
  state.step = steps_done_;
  return state;
}

absl::StatusOr<std::vector<HostTensor>> CudaTrainer::Fp8States() const {
  std::vector<HostTensor> states;
  for (int64_t i = 0; i < layout_.num_fp8_states(); ++i) {
    ASSIGN_OR_RETURN(HostTensor s, executable_->Input(layout_.first_fp8_state() + i));
    states.push_back(std::move(s));
  }
  return states;
}

absl::StatusOr<double> CudaTrainer::Step(const std::vector<TokenBatch>& micro_batches, double lr) {
  ASSIGN_OR_RETURN(auto batch, BatchTensors(*step_, layout_, micro_batches));
  std::vector<HostTensor> data;
  data.push_back(std::move(batch.first));
  data.push_back(std::move(batch.second));
  return StepTensors(std::move(data), lr);
}

absl::StatusOr<double> CudaTrainer::StepTensors(std::vector<HostTensor> batch, double lr) {
  if (static_cast<int64_t>(batch.size()) != layout_.num_batch_inputs) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: the step takes ", layout_.num_batch_inputs,
                                                   " batch inputs, got ", batch.size()));
  }
  // SetInput checks each tensor's type against its parameter.
  for (int64_t i = 0; i < layout_.num_batch_inputs; ++i) {
    RETURN_IF_ERROR(executable_->SetInput(layout_.first_batch_input() + i, batch[i]));
  }
  RETURN_IF_ERROR(executable_->SetInput(layout_.lr_index(), HostTensor::FromValues({DType::kF32, {}}, {lr})));
  if (profile_next_) {
    profile_next_ = false;
    ASSIGN_OR_RETURN(last_profile_, executable_->Profile());
  } else {
    RETURN_IF_ERROR(executable_->Run());
  }
  ASSIGN_OR_RETURN(HostTensor loss, executable_->Output(0));
  ++steps_done_;
  return loss[0];
}

}  // namespace kiln

#endif  // KILN_WITH_CUDA
