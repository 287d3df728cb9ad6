// @forward(tokens, targets, weights...) -> loss on one backend, the weights bound once:
// what `kiln eval` scores a data file with, and `kiln train --eval-every` its held-out split.
#pragma once

#include <map>
#include <memory>
#include <utility>
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

// Where a forward's weights come from: host tensors, set into the runner (the CPU's
// arguments, or copied to the GPU), or on CUDA the device buffers that already hold them (a
// training run's parameters), bound in place: nothing is copied, and each run reads what the
// buffers hold then.
struct ForwardWeights {
  std::vector<HostTensor> host;
  std::vector<void*> device;  // CUDA only; when set, `host` is unused
};

class ForwardRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ForwardRunner>> Create(std::unique_ptr<Module> module,
                                                               const ForwardWeights& weights,
                                                               const ResolvedBackend& backend);
  // New host weights for the next runs (a runner created with host weights).
  absl::Status SetWeights(const std::vector<HostTensor>& weights);
  absl::StatusOr<double> Loss(HostTensor tokens, HostTensor targets);

 private:
  ForwardRunner() = default;
  std::unique_ptr<Module> module_;
  std::vector<HostTensor> args_;  // CPU: tokens, targets, weights
#ifdef KILN_WITH_CUDA
  std::unique_ptr<CudaExecutable> gpu_;
#endif
};

// The mean loss over the first `max_windows` evaluation windows of `data` (all for -1),
// `batch` windows per forward pass, scored again and again (`kiln train --eval-every`): the
// compiled forwards (one per distinct batch size: full batches, then the remainder) are made
// at the first Score and kept, so a later Score only runs them. `data` and `backend` must
// outlive the scorer.
class EvalScorer {
 public:
  EvalScorer(ModelConfig config, const TokenDataset& data, int64_t seq, int64_t batch, Precision precision,
             const ResolvedBackend& backend, int64_t max_windows = -1)
      : config_(std::move(config)), data_(data), seq_(seq), batch_(batch), precision_(precision), backend_(backend),
        max_windows_(max_windows) {}
  // The mean loss and the number of windows scored. Device-bound weights must be the same
  // buffers at every call (they are bound when the forwards are made).
  absl::StatusOr<std::pair<double, int64_t>> Score(const ForwardWeights& weights);

 private:
  ModelConfig config_;
  const TokenDataset& data_;
  int64_t seq_, batch_;
  Precision precision_;
  const ResolvedBackend& backend_;
  int64_t max_windows_;
  std::map<int64_t, std::unique_ptr<ForwardRunner>> runners_;
  std::vector<void*> bound_;  // the device weights the runners were made with
};

// Mean loss over the first `max_windows` evaluation windows of `data` (all of them for -1),
// `batch` windows per forward pass; the second value is the number of windows scored.
absl::StatusOr<std::pair<double, int64_t>> MeanEvalLoss(const ModelConfig& config, const std::vector<HostTensor>& weights,
                                                        const TokenDataset& data, int64_t seq, int64_t batch,
                                                        Precision precision, const ResolvedBackend& backend,
                                                        int64_t max_windows = -1);

}  // namespace kiln::cli
