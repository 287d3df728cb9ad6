// Training steps on the GPU: the step function compiled once into a CudaExecutable
// (runtime/cuda/executable.h). Parameters and AdamW state stay on the device between steps
// (the step's donated outputs are written back into their input buffers); each step copies
// only the batch and the learning rate in, and the loss out.
#pragma once

#ifdef KILN_WITH_CUDA

#include <memory>
#include <vector>

#include "frontends/trainer.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executable.h"

namespace kiln {

class CudaTrainer : public Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<CudaTrainer>> Create(std::unique_ptr<Module> module,
                                                             const Function* step_function, TrainingStepLayout layout,
                                                             std::vector<HostTensor> initial_params, CudaDevice& device,
                                                             const CudaExecutableOptions& options = {});

  absl::string_view backend() const override { return "cuda"; }
  absl::StatusOr<double> Step(const std::vector<TokenBatch>& micro_batches, double lr) override;
  absl::StatusOr<double> StepTensors(std::vector<HostTensor> batch, double lr) override;
  int64_t steps_done() const override { return steps_done_; }
  absl::StatusOr<TrainingState> State() const override;
  absl::StatusOr<std::vector<HostTensor>> Fp8States() const override;
  absl::Status SetState(TrainingState state) override;
  const CudaExecutable& executable() const { return *executable_; }
  // The next Step runs through CudaExecutable::Profile (same results; timed in its CUDA graph,
  // or launched one by one with CUDA events); its timings are then in last_profile().
  void ProfileNextStep() { profile_next_ = true; }
  const std::vector<StepTiming>& last_profile() const { return last_profile_; }

 private:
  CudaTrainer() = default;
  std::unique_ptr<Module> module_;
  const Function* step_ = nullptr;
  TrainingStepLayout layout_;
  std::unique_ptr<CudaExecutable> executable_;
  int64_t steps_done_ = 0;
  bool profile_next_ = false;
  std::vector<StepTiming> last_profile_;
};

}  // namespace kiln

#endif  // KILN_WITH_CUDA
