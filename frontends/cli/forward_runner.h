// @forward(tokens, targets, weights...) -> loss on one backend, the weights bound once:
// what `kiln eval` scores a data file with, and `kiln train --eval-every` its held-out split.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "frontends/cli/backend_flag.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "runtime/training/dataset.h"
#ifdef KILN_WITH_CUDA
#include "runtime/cuda/executable.h"
#endif

namespace kiln::cli {

class ForwardRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ForwardRunner>> Create(std::unique_ptr<Module> module,
                                                               const std::vector<HostTensor>& weights,
                                                               const ResolvedBackend& backend);
  absl::StatusOr<double> Loss(HostTensor tokens, HostTensor targets);

 private:
  ForwardRunner() = default;
  std::unique_ptr<Module> module_;
  std::vector<HostTensor> args_;  // CPU: tokens, targets, weights
#ifdef KILN_WITH_CUDA
  std::unique_ptr<CudaExecutable> gpu_;
#endif
};

// Mean loss over the first `max_windows` evaluation windows of `data` (all of them for -1),
// `batch` windows per forward pass; the second value is the number of windows scored.
absl::StatusOr<std::pair<double, int64_t>> MeanEvalLoss(const ModelConfig& config, const std::vector<HostTensor>& weights,
                                                        const TokenDataset& data, int64_t seq, int64_t batch,
                                                        Precision precision, const ResolvedBackend& backend,
                                                        int64_t max_windows = -1);

}  // namespace kiln::cli
