// Where a Generator's @prefill and @decode functions run (frontends/generator.h): the CPU
// reference backend (here), or a GPU (frontends/cuda_inference_engine.h). An engine holds
// one copy of the weights and the KV pools, which every function it runs shares; the
// Generator owns the functions, the scheduler and the sampler, and is the same on both.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "runtime/inference/inference_types.h"
#include "runtime/step_profile.h"

namespace kiln {

class InferenceEngine {
 public:
  // A call's per-row inputs: parameters 0-5 of every function (frontends/llama_inference.h).
  struct Inputs {
    HostTensor tokens, positions, slots, block_tables, sampling, draws;
  };

  virtual ~InferenceEngine() = default;
  virtual absl::string_view backend() const = 0;
  // Makes `f` (@prefill or @decode from BuildLlamaInferenceModule, through its pipelines;
  // it outlives the engine) ready to run: nothing on the CPU, the compile and load on a GPU.
  virtual absl::Status Load(const Function& f) = 0;
  // What a call hands back for its `rows` (indices into [B * T]), row after row: the next
  // token of each as the function drew it (output kInferenceTokenOutput; -1 where none could
  // be drawn), and, when asked for, their logits.
  struct Rows {
    std::vector<int32_t> tokens;  // one per row
    std::vector<float> logits;    // rows x V, or empty
    // A GPU's time for the run, from its start on the stream to its end (the inputs' copies
    // included, the host's work around it not), when the engine times calls (CUDA events,
    // GeneratorOptions::time_decode_calls); 0 otherwise, on the CPU and for a profiled run.
    double gpu_seconds = 0;
  };

  // Starts `f` on `inputs`, the pools and the weights, and returns without waiting for it
  // (a GPU queues it behind the calls started before; the CPU computes it at once). Finish
  // hands back the rows of the oldest started call; at most kMaxCallsInFlight calls are
  // started and not finished. A GPU copies the logits off the device only when
  // `with_logits` (a batch of 32 rows of 32,000 is 2 MB, and picking on the host took 1.6 ms
  // of a 4.8 ms llama-M step), and then waits for them here.
  //
  // With feed_rows > 0, rows [0, feed_rows) of inputs.tokens are replaced by the next tokens
  // of rows [0, feed_rows) of the call started just before this one, on the device: the next
  // decode step starts before the host has read this one's tokens (the Generator's decode
  // lookahead). A "token" of -1 (a row of NaN logits) is fed as is on a GPU (its embedding
  // row reads as zeros) and as 0 on the CPU; the host refuses that token when it reads it, so
  // a call fed with it is never used.
  static constexpr int kMaxCallsInFlight = 2;
  virtual absl::Status Start(const Function& f, Inputs inputs, absl::Span<const int64_t> rows, bool with_logits,
                             int64_t feed_rows = 0) = 0;
  virtual absl::StatusOr<Rows> Finish() = 0;
  virtual int64_t calls_in_flight() const = 0;

  // Start and Finish, with no other call in flight. With `profile`, a GPU launches the run
  // one by one with CUDA events around each launch, or replays its graph under CUPTI (same
  // results), and stores where the time went; the CPU leaves it empty.
  virtual absl::StatusOr<Rows> Run(const Function& f, Inputs inputs, absl::Span<const int64_t> rows, bool with_logits,
                                   std::vector<StepTiming>* profile = nullptr) = 0;
  // For each copy, K and V of every layer: the first num_tokens slots of block src into
  // block dst (copy-on-write of a shared block).
  virtual absl::Status CopyBlocks(absl::Span<const inference::BlockCopy> copies) = 0;
};

// `weights` as InferenceWeightsFromModel gives them: LlamaInferenceWeights order, each of
// InferenceWeightType(spec, precision).
absl::StatusOr<std::unique_ptr<InferenceEngine>> CreateReferenceInferenceEngine(const ModelConfig& config,
                                                                                const PagedKvLayout& layout,
                                                                                Precision precision,
                                                                                std::vector<HostTensor> weights);

}  // namespace kiln
