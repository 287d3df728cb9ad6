#include "frontends/cli/forward_runner.h"

#include <map>

#include "frontends/gpt2.h"
#include "frontends/gpu_compile.h"
#include "ir/status_macros.h"
#include "passes/lower_gemm.h"
#include "ir/reference_backend.h"

namespace kiln::cli {

absl::StatusOr<std::unique_ptr<ForwardRunner>> ForwardRunner::Create(std::unique_ptr<Module> module,
                                                                     const std::vector<HostTensor>& weights,
                                                                     const ResolvedBackend& backend) {
  auto runner = std::unique_ptr<ForwardRunner>(new ForwardRunner());
  runner->module_ = std::move(module);
  if (backend.backend == Backend::kCpu) {
    runner->args_ = {HostTensor(), HostTensor()};  // tokens, targets: set per batch
    runner->args_.insert(runner->args_.end(), weights.begin(), weights.end());
    return runner;
  }
#ifdef KILN_WITH_CUDA
  // The GPU runs GEMMs as the backend's gemm op (what every compile does before codegen).
  Function& forward = *runner->module_->FindFunction("forward");
  RETURN_IF_ERROR(LowerGemmPass().RunOnFunction(forward).status());
  ASSIGN_OR_RETURN(runner->gpu_, CompileForGpu(forward, *backend.device));
  for (size_t i = 0; i < weights.size(); ++i) RETURN_IF_ERROR(runner->gpu_->SetInput(2 + i, weights[i]));
#endif
  return runner;
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

absl::StatusOr<std::pair<double, int64_t>> MeanEvalLoss(const ModelConfig& config, const std::vector<HostTensor>& weights,
                                                        const TokenDataset& data, int64_t seq, int64_t batch,
                                                        Precision precision, const ResolvedBackend& backend,
                                                        int64_t max_windows) {
  int64_t windows = NumEvalWindows(data, seq);
  if (max_windows >= 0) windows = std::min(windows, max_windows);
  // One compiled forward per distinct batch size (full batches, then the remainder), with
  // the weights bound once.
  std::map<int64_t, std::unique_ptr<ForwardRunner>> runners;
  double loss_sum = 0;  // sum over windows of the window's mean token loss
  for (int64_t first = 0; first < windows; first += batch) {
    int64_t rows = std::min(batch, windows - first);
    std::unique_ptr<ForwardRunner>& runner = runners[rows];
    if (!runner) {
      ASSIGN_OR_RETURN(std::unique_ptr<Module> module,
                       BuildModelModule(config, {.batch = rows, .seq_len = seq, .precision = precision}));
      ASSIGN_OR_RETURN(runner, ForwardRunner::Create(std::move(module), weights, backend));
    }
    TokenBatch b = EvalBatch(data, first, rows, seq);
    TensorType ids{DType::kI32, {rows, seq}};
    ASSIGN_OR_RETURN(double loss,
                     runner->Loss(HostTensor::FromValues(ids, std::vector<double>(b.inputs.begin(), b.inputs.end())),
                                  HostTensor::FromValues(ids, std::vector<double>(b.targets.begin(), b.targets.end()))));
    loss_sum += loss * static_cast<double>(rows);
  }
  return std::make_pair(windows > 0 ? loss_sum / static_cast<double>(windows) : 0.0, windows);
}

}  // namespace kiln::cli
