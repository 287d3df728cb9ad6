// The GPU's InferenceEngine (frontends/inference_engine.h): one copy of the weights and of
// the K and V pools in device memory, bound (CudaExecutableOptions::bound_parameters) into
// the executable of every @prefill and @decode size, so that all of them read the same
// weights and write the same pool; each executable owns only its arena of activations, and
// is captured as a CUDA graph on its first run and replayed after (one graph per decode
// bucket). A call uploads the four small per-row inputs (staged in page-locked memory),
// replays, and downloads the greedy tokens, and only the logits rows the sampler needs;
// up to two calls are queued on the stream at once (InferenceEngine::Start), so the host
// prepares the next decode step while the GPU runs this one.
#pragma once

#ifdef KILN_WITH_CUDA

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "frontends/inference_engine.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executable.h"

namespace kiln {

// `weights` as for CreateReferenceInferenceEngine; they are uploaded and then dropped.
// `run` is passed to every executable (bound_parameters is the engine's). With `time_calls`,
// CUDA events around each call's run give Rows::gpu_seconds (they cost llama-M's batch-1
// decode call 0.03 ms of 0.85: bench/RESULTS.md, session 22).
absl::StatusOr<std::unique_ptr<InferenceEngine>> CreateCudaInferenceEngine(const ModelConfig& config,
                                                                           const PagedKvLayout& layout,
                                                                           Precision precision,
                                                                           std::vector<HostTensor> weights,
                                                                           CudaDevice& device,
                                                                           const CudaExecutableOptions& run = {},
                                                                           bool time_calls = false);

}  // namespace kiln

#endif  // KILN_WITH_CUDA
