#include "frontends/cuda_inference_engine.h"

#ifdef KILN_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "frontends/gpu_compile.h"
#include "frontends/llama.h"
#include "ir/status_macros.h"
#include "ir/thread_pool.h"
#include "runtime/cuda/cuda_status.h"
#include "runtime/tensor_bytes.h"

namespace kiln {
namespace {

class CudaInferenceEngine : public InferenceEngine {
 public:
  CudaInferenceEngine(const ModelConfig& config, const PagedKvLayout& layout, CudaDevice& device,
                      const CudaExecutableOptions& run, bool time_calls)
      : config_(config), layout_(layout), device_(&device), run_(run), timed_(time_calls) {}
  // A call in flight still copies into the staging memory: it ends before that is freed.
  ~CudaInferenceEngine() override {
    if (!in_flight_.empty()) cudaStreamSynchronize(device_->stream());
  }

  absl::string_view backend() const override { return "cuda"; }

  // Device memory of `type` for parameter `index`, bound into every executable.
  absl::Status AllocateBound(int64_t index, const TensorType& type, absl::string_view what) {
    ASSIGN_OR_RETURN(void* p, device_->Allocate(std::max<int64_t>(type.num_bytes(), 1), what));
    memory_.emplace_back(p);
    run_.bound_parameters[index] = p;
    return absl::OkStatus();
  }

  absl::Status Upload(int64_t index, const HostTensor& value, absl::string_view what) {
    const std::string bytes = EncodeTensorBytes(value);
    KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(run_.bound_parameters.at(index), bytes.data(), bytes.size(),
                                              cudaMemcpyHostToDevice, device_->stream()),
                              what);
    KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device_->stream()), what);
    return absl::OkStatus();
  }

  absl::Status Load(const Function& f) override {
    if (executables_.contains(&f)) return absl::OkStatus();
    // The inference functions write each row's KV at its own position's slot and nowhere else
    // (frontends/llama_inference.cc): the blocks before it are the earlier steps'.
    GpuCompileOptions compile;
    compile.paged_attention.complete_blocks_step_invariant = true;
    ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutable> exe, CompileForGpu(f, *device_, run_, compile));
    // The graph captured now, with the compile: a prompt's prefill call (often the only call
    // of its shape) then replays, its time its own.
    RETURN_IF_ERROR(exe->Prepare());
    executables_.emplace(&f, std::move(exe));
    return absl::OkStatus();
  }

  absl::Status Start(const Function& f, Inputs inputs, absl::Span<const int64_t> rows, bool with_logits,
                     int64_t feed_rows) override {
    if (in_flight_.size() >= kMaxCallsInFlight) {
      return absl::FailedPreconditionError(
          absl::StrCat("@", f.name(), ": ", kMaxCallsInFlight, " calls are in flight already (Finish one first)"));
    }
    RETURN_IF_ERROR(Load(f));
    CudaExecutable& exe = *executables_.at(&f);
    RETURN_IF_ERROR(device_->MakeCurrent());
    const cudaStream_t stream = device_->stream();
    const std::string what = absl::StrCat("@", f.name());
    const Node* out = f.outputs()[0];
    const int64_t num_rows = out->type().num_elements() / config_.vocab_size;
    for (int64_t row : rows) {
      if (row < 0 || row >= num_rows) {
        return absl::InvalidArgumentError(absl::StrCat("logits row ", row, " of ", what, "'s ",
                                                       out->type().ToString()));
      }
    }
    if (feed_rows > 0 && (feed_rows > last_tokens_rows_ || feed_rows > inputs.tokens.type().num_elements())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": feeding ", feed_rows, " tokens of a call that had ",
                                                     last_tokens_rows_, " into ",
                                                     inputs.tokens.type().num_elements(), " token rows"));
    }
    // The inputs are staged in page-locked memory of the call's own (the copies read it
    // when the stream reaches them, after Start has returned), then the rows' next tokens
    // land there: the host waits for nothing before Finish.
    const HostTensor* per_row[] = {&inputs.tokens,       &inputs.positions, &inputs.slots,
                                   &inputs.block_tables, &inputs.sampling,  &inputs.draws};
    constexpr int kPerRow = 6;
    static_assert(kInferenceSamplingParameter == 4 && kInferenceDrawsParameter == 5, "per_row is parameters 0-5");
    std::string staged[kPerRow];
    int64_t bytes = static_cast<int64_t>(rows.size() * sizeof(int32_t));
    for (int i = 0; i < kPerRow; ++i) {
      const Node* p = f.parameters()[i];
      if (per_row[i]->type() != p->type()) {
        return absl::InvalidArgumentError(absl::StrCat(what, " parameter %", p->name(), " is ",
                                                       p->type().ToString(), ", given ", per_row[i]->type().ToString()));
      }
      staged[i] = EncodeTensorBytes(*per_row[i]);
      bytes += static_cast<int64_t>(staged[i].size());
    }
    // The logits (a call that wants them) land after the token rows, in the same page-locked
    // memory: a copy at the link's speed, into memory nothing has to zero first.
    const int64_t logits_element = DTypeBytes(out->type().dtype);
    const int64_t logits_bytes = with_logits ? static_cast<int64_t>(rows.size()) * config_.vocab_size * logits_element : 0;
    Staging& staging = staging_[next_staging_];
    RETURN_IF_ERROR(staging.Reserve(*device_, bytes + logits_bytes, timed_));
    char* host = static_cast<char*>(staging.memory.get());
    for (int i = 0; i < kPerRow; ++i) {
      std::memcpy(host, staged[i].data(), staged[i].size());
      ASSIGN_OR_RETURN(void* dst, exe.InputAddress(i));
      KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, host, staged[i].size(), cudaMemcpyHostToDevice, stream),
                                absl::StrCat("uploading %", f.parameters()[i]->name(), " of ", what));
      host += staged[i].size();
    }
    if (feed_rows > 0) {
      ASSIGN_OR_RETURN(void* tokens, exe.InputAddress(0));
      KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(tokens, last_tokens_, feed_rows * sizeof(int32_t),
                                                cudaMemcpyDeviceToDevice, stream),
                                absl::StrCat("feeding the last call's tokens to ", what));
    }
    if (timed_) KILN_RETURN_IF_CUDA_ERROR(cudaEventRecord(staging.start, stream), what);
    RETURN_IF_ERROR(exe.Enqueue());
    if (timed_) KILN_RETURN_IF_CUDA_ERROR(cudaEventRecord(staging.end, stream), what);
    ASSIGN_OR_RETURN(const void* next_tokens, exe.OutputAddress(kInferenceTokenOutput));
    RETURN_IF_ERROR(EnqueueRowCopies(next_tokens, sizeof(int32_t), rows, host, what));
    last_tokens_ = next_tokens;
    last_tokens_rows_ = num_rows;
    Call call{.staging = next_staging_, .num_rows = static_cast<int64_t>(rows.size()), .function = &f};
    if (with_logits) {
      // The logits as the pipeline left them: f32, or bf16 where the LM head's GEMM writes
      // its output rounded (the reference backend holds the same rounded values). The host
      // waits for them here, which a call that wants its logits does anyway.
      const DType dtype = out->type().dtype;
      if (dtype != DType::kF32 && dtype != DType::kBF16) {
        return absl::InternalError(absl::StrCat(what, "'s logits are ", out->type().ToString(), ", not f32 or bf16"));
      }
      const int64_t vocab = config_.vocab_size;
      ASSIGN_OR_RETURN(const void* logits, exe.OutputAddress(0));
      char* raw = host + rows.size() * sizeof(int32_t);  // after the token rows
      RETURN_IF_ERROR(EnqueueRowCopies(logits, vocab * logits_element, rows, raw, what));
      KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), absl::StrCat("reading the logits of ", what));
      call.logits.resize(rows.size() * vocab);
      if (dtype == DType::kF32) {
        std::memcpy(call.logits.data(), raw, logits_bytes);
      } else {  // widened on every core: a million logits at batch 32 are ~0.5 ms on one
        float* wide_logits = call.logits.data();
        ThreadPool::Shared(0).ParallelFor(static_cast<int64_t>(call.logits.size()), int64_t{1} << 16,
                                          [&](int64_t begin, int64_t end) {
                                            for (int64_t i = begin; i < end; ++i) {
                                              uint16_t bits;
                                              std::memcpy(&bits, raw + 2 * i, 2);
                                              const uint32_t wide = static_cast<uint32_t>(bits) << 16;
                                              std::memcpy(wide_logits + i, &wide, 4);
                                            }
                                          });
      }
    }
    KILN_RETURN_IF_CUDA_ERROR(cudaEventRecord(staging.done, stream), what);
    staging.tokens = reinterpret_cast<const int32_t*>(host);
    next_staging_ = (next_staging_ + 1) % kMaxCallsInFlight;
    in_flight_.push_back(std::move(call));
    return absl::OkStatus();
  }

  absl::StatusOr<Rows> Finish() override {
    if (in_flight_.empty()) return absl::FailedPreconditionError("no inference call is in flight");
    Call call = std::move(in_flight_.front());
    in_flight_.pop_front();
    const Staging& staging = staging_[call.staging];
    KILN_RETURN_IF_CUDA_ERROR(
        cudaEventSynchronize(staging.done),
        absl::StrCat("running @", call.function->name(), " (an asynchronous error of some step; --no-cuda-graph with "
                     "CudaExecutableOptions::check_each_step names it)"));
    Rows picked;
    picked.tokens.assign(staging.tokens, staging.tokens + call.num_rows);
    picked.logits = std::move(call.logits);
    if (timed_) {
      float ms = 0;
      KILN_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, staging.start, staging.end),
                                absl::StrCat("timing @", call.function->name()));
      picked.gpu_seconds = ms / 1e3;
    }
    return picked;
  }

  int64_t calls_in_flight() const override { return static_cast<int64_t>(in_flight_.size()); }

  absl::StatusOr<Rows> Run(const Function& f, Inputs inputs, absl::Span<const int64_t> rows, bool with_logits,
                           std::vector<StepTiming>* profile) override {
    if (!in_flight_.empty()) return absl::FailedPreconditionError("Run with an inference call in flight");
    if (profile == nullptr) {
      RETURN_IF_ERROR(Start(f, std::move(inputs), rows, with_logits, /*feed_rows=*/0));
      return Finish();
    }
    // Profiled: the inputs through Start's path, then the graph once more under the trace
    // (a decode call writes only its own slots, so running it twice changes nothing).
    RETURN_IF_ERROR(Start(f, inputs, rows, with_logits, /*feed_rows=*/0));
    ASSIGN_OR_RETURN(Rows picked, Finish());
    ASSIGN_OR_RETURN(*profile, executables_.at(&f)->Profile());
    picked.gpu_seconds = 0;
    return picked;
  }

  // `rows` of `row_bytes` each from device memory `src` to host `dst` queued on the stream,
  // consecutive rows (a decode batch's) in one copy.
  absl::Status EnqueueRowCopies(const void* src, int64_t row_bytes, absl::Span<const int64_t> rows, void* dst,
                                const std::string& what) {
    for (size_t r = 0; r < rows.size();) {
      size_t run = 1;
      while (r + run < rows.size() && rows[r + run] == rows[r] + static_cast<int64_t>(run)) ++run;
      KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(static_cast<char*>(dst) + r * row_bytes,
                                                static_cast<const char*>(src) + rows[r] * row_bytes, run * row_bytes,
                                                cudaMemcpyDeviceToHost, device_->stream()),
                                absl::StrCat("reading the outputs of ", what));
      r += run;
    }
    return absl::OkStatus();
  }

  absl::Status CopyBlocks(absl::Span<const inference::BlockCopy> copies) override {
    if (copies.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(device_->MakeCurrent());
    // Pool [L, NB, KV, BS, D]: for one layer and block, the KV heads are rows BS * D apart,
    // of which a copy takes the first num_tokens * D elements.
    const int64_t element = DTypeBytes(pool_type_.dtype);
    const int64_t row = layout_.block_size * config_.head_dim * element;
    const int64_t block = config_.n_kv_heads * row;
    for (int p : {kInferenceKPoolParameter, kInferenceVPoolParameter}) {
      char* pool = static_cast<char*>(run_.bound_parameters.at(p));
      for (const inference::BlockCopy& c : copies) {
        for (int64_t layer = 0; layer < config_.n_layers; ++layer) {
          const int64_t layer_offset = layer * layout_.num_blocks * block;
          KILN_RETURN_IF_CUDA_ERROR(
              cudaMemcpy2DAsync(pool + layer_offset + c.dst * block, row, pool + layer_offset + c.src * block, row,
                                c.num_tokens * config_.head_dim * element, config_.n_kv_heads,
                                cudaMemcpyDeviceToDevice, device_->stream()),
              absl::StrCat("copying KV block ", c.src, " to ", c.dst));
        }
      }
    }
    KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device_->stream()), "copying KV blocks");
    return absl::OkStatus();
  }

  // The pools (zeroed) and the weights (uploaded) in device memory of their own.
  absl::Status Init(Precision precision, std::vector<HostTensor> weights) {
    RETURN_IF_ERROR(device_->MakeCurrent());
    pool_type_ = KvPoolType(config_, layout_, precision);
    for (int p : {kInferenceKPoolParameter, kInferenceVPoolParameter}) {
      const std::string what =
          absl::StrCat(p == kInferenceKPoolParameter ? "the K pool " : "the V pool ", pool_type_.ToString());
      RETURN_IF_ERROR(AllocateBound(p, pool_type_, what));
      // A slot is read only below its sequence's length, so never before it is written; a
      // pool of zeros still keeps a stray read finite.
      KILN_RETURN_IF_CUDA_ERROR(
          cudaMemsetAsync(run_.bound_parameters.at(p), 0, pool_type_.num_bytes(), device_->stream()), what);
    }
    const std::vector<InferenceWeight> specs = LlamaInferenceWeights(config_);
    if (weights.size() != specs.size()) {
      return absl::InvalidArgumentError(absl::StrCat("model '", config_.name, "' takes ", specs.size(),
                                                     " inference weights, got ", weights.size()));
    }
    for (size_t i = 0; i < weights.size(); ++i) {
      const int64_t index = kInferenceFirstWeightParameter + static_cast<int64_t>(i);
      const TensorType want = InferenceWeightType(specs[i].spec, precision);
      if (weights[i].type() != want) {
        return absl::InvalidArgumentError(absl::StrCat("weight ", specs[i].spec.name, " must be ", want.ToString(),
                                                       ", got ", weights[i].type().ToString()));
      }
      const std::string what = absl::StrCat("weight ", specs[i].spec.name, " ", weights[i].type().ToString());
      RETURN_IF_ERROR(AllocateBound(index, weights[i].type(), what));
      RETURN_IF_ERROR(Upload(index, weights[i], what));
      weights[i] = HostTensor();  // the host copy is not needed again
    }
    return absl::OkStatus();
  }

 private:
  TensorType pool_type_;
  ModelConfig config_;
  PagedKvLayout layout_;
  CudaDevice* device_;
  CudaExecutableOptions run_;
  std::vector<DeviceMemory> memory_;  // the pools and the weights
  absl::flat_hash_map<const Function*, std::unique_ptr<CudaExecutable>> executables_;

  // Page-locked memory for one call in flight: its staged inputs, then its token rows (and
  // logits, for a call that wants them); an event when both copies are done, and two around
  // the run when calls are timed.
  struct Staging {
    PinnedMemory memory;
    int64_t bytes = 0;
    const int32_t* tokens = nullptr;
    cudaEvent_t done = nullptr, start = nullptr, end = nullptr;

    absl::Status Reserve(CudaDevice& device, int64_t want, bool timed) {
      if (done == nullptr) {
        KILN_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "an inference call's event");
      }
      if (timed && start == nullptr) {
        KILN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&start), "an inference call's timing events");
        KILN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&end), "an inference call's timing events");
      }
      if (want <= bytes) return absl::OkStatus();
      memory.reset();
      ASSIGN_OR_RETURN(void* p, device.AllocatePinned(want, "an inference call's inputs, next tokens and logits"));
      memory.reset(p);
      bytes = want;
      return absl::OkStatus();
    }
    ~Staging() {
      for (cudaEvent_t e : {done, start, end}) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
  };
  struct Call {
    int staging = 0;
    int64_t num_rows = 0;
    const Function* function = nullptr;  // for error messages
    std::vector<float> logits;
  };
  bool timed_ = false;
  Staging staging_[kMaxCallsInFlight];
  int next_staging_ = 0;
  std::deque<Call> in_flight_;
  // The token output of the last call started (until the next one of its executable), for
  // Start's feed_rows.
  const void* last_tokens_ = nullptr;
  int64_t last_tokens_rows_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<InferenceEngine>> CreateCudaInferenceEngine(const ModelConfig& config,
                                                                           const PagedKvLayout& layout,
                                                                           Precision precision,
                                                                           std::vector<HostTensor> weights,
                                                                           CudaDevice& device,
                                                                           const CudaExecutableOptions& run,
                                                                           bool time_calls) {
  auto engine = std::make_unique<CudaInferenceEngine>(config, layout, device, run, time_calls);
  RETURN_IF_ERROR(engine->Init(precision, std::move(weights)));
  return engine;
}

}  // namespace kiln

#endif  // KILN_WITH_CUDA
