#include "frontends/cli/forward_runner.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

#include "frontends/gpt2.h"
#include "frontends/gpu_compile.h"
#include "ir/status_macros.h"
#include "passes/lower_gemm.h"
#include "ir/reference_backend.h"

namespace kiln::cli {

absl::StatusOr<std::unique_ptr<ForwardRunner>> ForwardRunner::Create(std::unique_ptr<Module> module,
                                                                     const ForwardWeights& weights,
                                                                     const ResolvedBackend& backend) {
  auto runner = std::unique_ptr<ForwardRunner>(new ForwardRunner());
  runner->module_ = std::move(module);
  if (backend.backend == Backend::kCpu) {
    if (!weights.device.empty()) return absl::InvalidArgumentError("the CPU backend takes host weights");
    runner->args_ = {HostTensor(), HostTensor()};  // tokens, targets: set per batch
    runner->args_.insert(runner->args_.end(), weights.host.begin(), weights.host.end());
    return runner;
  }
#ifdef KILN_WITH_CUDA
  // The GPU runs GEMMs as the backend's gemm op (what every compile does before codegen).
  Function& forward = *runner->module_->FindFunction("forward");
  RETURN_IF_ERROR(LowerGemmPass().RunOnFunction(forward).status());
  CudaExecutableOptions options;
  for (size_t i = 0; i < weights.device.size(); ++i) options.bound_parameters[2 + static_cast<int64_t>(i)] = weights.device[i];
  ASSIGN_OR_RETURN(runner->gpu_, CompileForGpu(forward, *backend.device, options));
  if (weights.device.empty()) RETURN_IF_ERROR(runner->SetWeights(weights.host));
#endif
  return runner;
}

absl::Status ForwardRunner::SetWeights(const std::vector<HostTensor>& weights) {
#ifdef KILN_WITH_CUDA
  if (gpu_) {
    for (size_t i = 0; i < weights.size(); ++i) RETURN_IF_ERROR(gpu_->SetInput(2 + static_cast<int64_t>(i), weights[i]));
    return absl::OkStatus();
  }
#endif
  if (args_.size() != weights.size() + 2) {
    return absl::InvalidArgumentError(absl::StrCat("forward takes ", args_.size() - 2, " weights, got ", weights.size()));
  }
  std::copy(weights.begin(), weights.end(), args_.begin() + 2);
  return absl::OkStatus();
}

absl::StatusOr<double> ForwardRunner::Loss(HostTensor tokens, HostTensor targets) {
#ifdef KILN_WITH_CUDA
  if (gpu_) {
    RETURN_IF_ERROR(gpu_->SetInput(0, tokens));
    RETURN_IF_ERROR(gpu_->SetInput(1, targets));
    RETURN_IF_ERROR(gpu_->Run());
    ASSIGN_OR_RETURN(HostTensor loss, gpu_->Output(0));
    return loss[0];
  }
#endif
  args_[0] = std::move(tokens);
  args_[1] = std::move(targets);
  ASSIGN_OR_RETURN(std::vector<HostTensor> out, EvaluateFunction(*module_->FindFunction("forward"), args_));
  return out[0][0];
}

absl::StatusOr<std::pair<double, int64_t>> EvalScorer::Score(const ForwardWeights& weights) {
  if (!runners_.empty() && weights.device != bound_) {
    return absl::InvalidArgumentError("EvalScorer: device weights must be the buffers of the first Score");
  }
  bound_ = weights.device;
  int64_t windows = NumEvalWindows(data_, seq_);
  if (max_windows_ >= 0) windows = std::min(windows, max_windows_);
  double loss_sum = 0;  // sum over windows of the window's mean token loss
  std::map<int64_t, bool> weights_set;  // host weights go into each runner once per Score
  for (int64_t first = 0; first < windows; first += batch_) {
    const int64_t rows = std::min(batch_, windows - first);
    std::unique_ptr<ForwardRunner>& runner = runners_[rows];
    if (!runner) {
      ASSIGN_OR_RETURN(std::unique_ptr<Module> module,
                       BuildModelModule(config_, {.batch = rows, .seq_len = seq_, .precision = precision_}));
      ASSIGN_OR_RETURN(runner, ForwardRunner::Create(std::move(module), weights, backend_));
      weights_set[rows] = true;
    } else if (weights.device.empty() && !weights_set[rows]) {
      RETURN_IF_ERROR(runner->SetWeights(weights.host));
      weights_set[rows] = true;
    }
    TokenBatch b = EvalBatch(data_, first, rows, seq_);
    TensorType ids{DType::kI32, {rows, seq_}};
    ASSIGN_OR_RETURN(double loss,
                     runner->Loss(HostTensor::FromValues(ids, std::vector<double>(b.inputs.begin(), b.inputs.end())),
                                  HostTensor::FromValues(ids, std::vector<double>(b.targets.begin(), b.targets.end()))));
    loss_sum += loss * static_cast<double>(rows);
  }
  return std::make_pair(windows > 0 ? loss_sum / static_cast<double>(windows) : 0.0, windows);
}

absl::StatusOr<std::pair<double, int64_t>> MeanEvalLoss(const ModelConfig& config, const std::vector<HostTensor>& weights,
                                                        const TokenDataset& data, int64_t seq, int64_t batch,
                                                        Precision precision, const ResolvedBackend& backend,
                                                        int64_t max_windows) {
  return EvalScorer(config, data, seq, batch, precision, backend, max_windows).Score({.host = weights});
}

}  // namespace kiln::cli
