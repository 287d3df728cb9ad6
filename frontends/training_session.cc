#include "frontends/training_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "ir/verifier.h"
#include "passes/training_compile.h"

#ifdef KILN_WITH_CUDA
#include "codegen/capabilities.h"
#include "frontends/cuda_trainer.h"
#include "frontends/gpu_compile.h"
#include "runtime/cuda/cuda_status.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executable.h"
#endif

namespace kiln {

// Without CUDA there is no GPU forward; the type exists so that the unique_ptr can be destroyed.
class TrainingSession::GpuForward {
 public:
#ifdef KILN_WITH_CUDA
  std::unique_ptr<CudaExecutable> exe;
  CudaDevice* device = nullptr;
#endif
};

TrainingSession::~TrainingSession() = default;

absl::StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::Create(std::unique_ptr<Module> module,
                                                                         std::vector<HostTensor> initial_params,
                                                                         TrainingSessionOptions options) {
  if (module == nullptr) return absl::InvalidArgumentError("training session: no module");
  const Function* forward = module->FindFunction("forward");
  if (forward == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("training session: module @", module->name(), " has no @forward"));
  }
  RETURN_IF_ERROR(VerifyModule(*module));
  auto session = std::unique_ptr<TrainingSession>(new TrainingSession());
  CudaDevice* device = options.device;
  CompileOptions compile = options.compile;
  if (options.backend == Backend::kCuda) {
    absl::Status usable = CudaBackendAvailable();
    if (!usable.ok()) {
      return absl::Status(usable.code(), absl::StrCat("training session: backend cuda: ", usable.message()));
    }
#ifdef KILN_WITH_CUDA
    if (device == nullptr) {
      ASSIGN_OR_RETURN(session->owned_device_, CudaDevice::Open(0));
      device = session->owned_device_.get();
    }
    // The passes choose implementations for the GPU the step will run on.
    if (!compile.target.has_value()) compile.target = device->target();
#endif
  }
#ifdef KILN_WITH_CUDA
  // As `kiln train`, on both backends: the same passes make the same step.
  if (compile.capabilities == nullptr) compile.capabilities = &CodegenCapabilities();
#endif

  // The weights' names and types, before the passes rename anything.
  const std::vector<Node*> forward_params = forward->parameters();
  const int64_t num_data = options.step.num_batch_inputs;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(num_data, 0)); i < forward_params.size(); ++i) {
    session->weights_.push_back({forward_params[i]->name(), forward_params[i]->type()});
  }
  ASSIGN_OR_RETURN(TrainingCompile training, TrainingCompile::Create(options.step, compile));
  RETURN_IF_ERROR(training.BuildStep(*module));
  const TrainingStepLayout layout = training.layout();
  if (static_cast<int64_t>(initial_params.size()) != layout.num_params) {
    return absl::InvalidArgumentError(absl::StrCat("training session: ", initial_params.size(),
                                                   " initial weights for a @forward with ", layout.num_params,
                                                   " trainable parameters (after ", layout.num_batch_inputs,
                                                   " data inputs)"));
  }
  // Checked before the main pipeline and the GPU compile, which take longer than this (and
  // without building a state: for a large model that would be a second copy of the weights).
  const std::vector<Node*> step_params = training.step()->parameters();
  for (int64_t i = 0; i < layout.num_params; ++i) {
    const Node* p = step_params[layout.first_param() + i];
    if (initial_params[i].type() != p->type()) {
      return absl::InvalidArgumentError(absl::StrCat("training session: initial weight ", i, " %", p->name(),
                                                     " must be ", p->type().ToString(), ", got ",
                                                     initial_params[i].type().ToString()));
    }
  }
  RETURN_IF_ERROR(training.RunMainPipeline(*module));
  session->module_ = module.get();
  session->forward_ = module->FindFunction("forward");
  session->step_ = training.step();
  session->layout_ = layout;
  session->options_ = std::move(options);
  session->options_.device = device;
  if (session->options_.backend == Backend::kCpu) {
    ASSIGN_OR_RETURN(session->trainer_, ReferenceTrainer::Create(std::move(module), session->step_, layout,
                                                                 std::move(initial_params),
                                                                 session->options_.reference));
  } else {
#ifdef KILN_WITH_CUDA
    CudaExecutableOptions run;
    run.cuda_graph = session->options_.cuda_graph;
    ASSIGN_OR_RETURN(session->trainer_, CudaTrainer::Create(std::move(module), session->step_, layout,
                                                            std::move(initial_params), *device, run));
#endif
  }
  return session;
}

absl::StatusOr<double> TrainingSession::Step(const std::vector<std::vector<HostTensor>>& micro_batches, double lr) {
  const int64_t k = options_.step.accum_steps;
  if (static_cast<int64_t>(micro_batches.size()) != k) {
    return absl::InvalidArgumentError(
        absl::StrCat("training session: a step takes ", k, " micro-batches (accum_steps), got ", micro_batches.size()));
  }
  // The step takes each data input with a leading dim k: the micro-batches, stacked.
  std::vector<Node*> step_params = step_->parameters();
  std::vector<Node*> forward_params = forward_->parameters();
  std::vector<HostTensor> stacked;
  for (int64_t i = 0; i < layout_.num_batch_inputs; ++i) {
    HostTensor s(step_params[layout_.first_batch_input() + i]->type());
    const TensorType& want = forward_params[i]->type();
    for (int64_t j = 0; j < k; ++j) {
      const std::vector<HostTensor>& mb = micro_batches[j];
      if (static_cast<int64_t>(mb.size()) != layout_.num_batch_inputs) {
        return absl::InvalidArgumentError(absl::StrCat("training session: micro-batch ", j, " has ", mb.size(),
                                                       " tensors; @forward takes ", layout_.num_batch_inputs,
                                                       " data inputs"));
      }
      if (mb[i].type() != want) {
        return absl::InvalidArgumentError(absl::StrCat("training session: data input ", i, " %",
                                                       forward_params[i]->name(), " must be ", want.ToString(),
                                                       ", got ", mb[i].type().ToString()));
      }
      std::copy(mb[i].values().begin(), mb[i].values().end(), s.mutable_values().begin() + j * mb[i].num_elements());
    }
    stacked.push_back(std::move(s));
  }
  return trainer_->StepTensors(std::move(stacked), lr);
}

absl::StatusOr<std::vector<HostTensor>> TrainingSession::Forward(const std::vector<HostTensor>& batch) {
  std::vector<Node*> params = forward_->parameters();
  if (static_cast<int64_t>(batch.size()) != layout_.num_batch_inputs) {
    return absl::InvalidArgumentError(absl::StrCat("training session: @forward takes ", layout_.num_batch_inputs,
                                                   " data inputs, got ", batch.size()));
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].type() != params[i]->type()) {
      return absl::InvalidArgumentError(absl::StrCat("training session: data input ", i, " %", params[i]->name(),
                                                     " must be ", params[i]->type().ToString(), ", got ",
                                                     batch[i].type().ToString()));
    }
  }
  if (options_.backend == Backend::kCpu) {
    // The reference trainer's state is host memory: read in place, no copy of the moments.
    const auto& reference = static_cast<const ReferenceTrainer&>(*trainer_);
    std::vector<HostTensor> args = batch;
    args.insert(args.end(), reference.state().params.begin(), reference.state().params.end());
    return EvaluateFunction(*forward_, args, options_.reference);
  }
#ifdef KILN_WITH_CUDA
  const auto& cuda = static_cast<const CudaTrainer&>(*trainer_);
  CudaDevice& device = *options_.device;
  if (gpu_forward_ == nullptr) {
    auto f = std::make_unique<GpuForward>();
    CudaExecutableOptions run;
    run.cuda_graph = options_.cuda_graph;
    ASSIGN_OR_RETURN(f->exe, CompileForGpu(*forward_, device, run));
    f->device = &device;
    gpu_forward_ = std::move(f);
  }
  CudaExecutable& exe = *gpu_forward_->exe;
  // The current weights, device to device from the step's buffers.
  RETURN_IF_ERROR(device.MakeCurrent());
  for (int64_t i = 0; i < layout_.num_params; ++i) {
    ASSIGN_OR_RETURN(void* src, cuda.executable().InputAddress(layout_.first_param() + i));
    ASSIGN_OR_RETURN(void* dst, exe.InputAddress(layout_.num_batch_inputs + i));
    KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, src, params[layout_.num_batch_inputs + i]->type().num_bytes(),
                                              cudaMemcpyDeviceToDevice, device.stream()),
                              absl::StrCat("copying weight %", params[layout_.num_batch_inputs + i]->name(),
                                           " to @forward"));
  }
  // SetInput synchronizes the stream, so the copies above are done before the run.
  for (size_t i = 0; i < batch.size(); ++i) RETURN_IF_ERROR(exe.SetInput(static_cast<int64_t>(i), batch[i]));
  RETURN_IF_ERROR(exe.Run());
  std::vector<HostTensor> outputs;
  for (size_t i = 0; i < forward_->outputs().size(); ++i) {
    ASSIGN_OR_RETURN(HostTensor out, exe.Output(static_cast<int>(i)));
    outputs.push_back(std::move(out));
  }
  return outputs;
#else
  return absl::InternalError("unreachable: a CUDA session without CUDA");
#endif
}

absl::StatusOr<TrainingState> TrainingSession::State() const { return trainer_->State(); }

absl::StatusOr<std::vector<HostTensor>> TrainingSession::Params() const {
  ASSIGN_OR_RETURN(TrainingState state, trainer_->State());
  return std::move(state.params);
}

absl::Status TrainingSession::SetState(TrainingState state) { return trainer_->SetState(std::move(state)); }

absl::Status TrainingSession::Save(const std::string& path, const std::map<std::string, std::string>& metadata) const {
  ASSIGN_OR_RETURN(TrainingState state, trainer_->State());
  return SaveSessionCheckpoint(path, weights_, state, metadata);
}

absl::StatusOr<std::map<std::string, std::string>> TrainingSession::Load(const std::string& path) {
  ASSIGN_OR_RETURN(SessionCheckpoint ckpt, LoadSessionCheckpoint(path, weights_));
  RETURN_IF_ERROR(trainer_->SetState(std::move(ckpt.state)));
  return std::move(ckpt.metadata);
}

}  // namespace kiln
