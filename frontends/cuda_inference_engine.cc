#include "frontends/cuda_inference_engine.h"

#ifdef KILN_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "frontends/gpu_compile.h"
#include "frontends/llama.h"
#include "ir/status_macros.h"
#include "runtime/cuda/cuda_status.h"
#include "runtime/tensor_bytes.h"

namespace kiln {
namespace {

class CudaInferenceEngine : public InferenceEngine {
 public:
  CudaInferenceEngine(const ModelConfig& config, const PagedKvLayout& layout, CudaDevice& device,
                      const CudaExecutableOptions& run)
      : config_(config), layout_(layout), device_(&device), run_(run) {}

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
    ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutable> exe, CompileForGpu(f, *device_, run_));
    executables_.emplace(&f, std::move(exe));
    return absl::OkStatus();
  }

  absl::StatusOr<Rows> Run(const Function& f, Inputs inputs, absl::Span<const int64_t> rows, bool with_logits,
                           std::vector<StepTiming>* profile) override {
    RETURN_IF_ERROR(Load(f));
    CudaExecutable& exe = *executables_.at(&f);
    RETURN_IF_ERROR(device_->MakeCurrent());
    const cudaStream_t stream = device_->stream();
    // The four inputs go up together and the run waits for them on the stream: one
    // synchronization per call, at the end (Run's).
    const HostTensor* per_row[] = {&inputs.tokens, &inputs.positions, &inputs.slots, &inputs.block_tables};
    for (int i = 0; i < 4; ++i) {
      const Node* p = f.parameters()[i];
      if (per_row[i]->type() != p->type()) {
        return absl::InvalidArgumentError(absl::StrCat("@", f.name(), " parameter %", p->name(), " is ",
                                                       p->type().ToString(), ", given ",
                                                       per_row[i]->type().ToString()));
      }
      staged_[i] = EncodeTensorBytes(*per_row[i]);
      ASSIGN_OR_RETURN(void* dst, exe.InputAddress(i));
      KILN_RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(dst, staged_[i].data(), staged_[i].size(), cudaMemcpyHostToDevice, stream),
          absl::StrCat("uploading %", p->name(), " of @", f.name()));
    }
    if (profile != nullptr) {
      ASSIGN_OR_RETURN(*profile, exe.Profile());
    } else {
      RETURN_IF_ERROR(exe.Run());
    }
    const double gpu_seconds = profile != nullptr ? 0.0 : exe.last_run_gpu_seconds();
    const Node* out = f.outputs()[0];
    const int64_t vocab = config_.vocab_size;
    const int64_t num_rows = out->type().num_elements() / vocab;
    for (int64_t row : rows) {
      if (row < 0 || row >= num_rows) {
        return absl::InvalidArgumentError(absl::StrCat("logits row ", row, " of @", f.name(), "'s ",
                                                       out->type().ToString()));
      }
    }
    Rows picked;
    picked.gpu_seconds = gpu_seconds;
    picked.greedy.resize(rows.size());
    ASSIGN_OR_RETURN(const void* greedy, exe.OutputAddress(kInferenceGreedyOutput));
    RETURN_IF_ERROR(CopyRows(greedy, sizeof(int32_t), rows, picked.greedy.data(), absl::StrCat("@", f.name())));
    if (with_logits) {
      // The logits as the pipeline left them: f32, or bf16 where the LM head's GEMM writes
      // its output rounded (the reference backend holds the same rounded values).
      const DType dtype = out->type().dtype;
      if (dtype != DType::kF32 && dtype != DType::kBF16) {
        return absl::InternalError(absl::StrCat("@", f.name(), "'s logits are ", out->type().ToString(),
                                                ", not f32 or bf16"));
      }
      const int64_t element = DTypeBytes(dtype);
      ASSIGN_OR_RETURN(const void* logits, exe.OutputAddress(0));
      std::string bytes(rows.size() * vocab * element, '\0');
      RETURN_IF_ERROR(CopyRows(logits, vocab * element, rows, bytes.data(), absl::StrCat("@", f.name())));
      picked.logits.resize(rows.size() * vocab);
      if (dtype == DType::kF32) {
        std::memcpy(picked.logits.data(), bytes.data(), bytes.size());
      } else {
        for (size_t i = 0; i < picked.logits.size(); ++i) {
          uint16_t bits;
          std::memcpy(&bits, bytes.data() + 2 * i, 2);
          const uint32_t wide = static_cast<uint32_t>(bits) << 16;
          std::memcpy(&picked.logits[i], &wide, 4);
        }
      }
    }
    return picked;
  }

  // `rows` of `row_bytes` each from device memory `src` to host `dst`, consecutive rows (a
  // decode batch's) in one copy; then waits for them.
  absl::Status CopyRows(const void* src, int64_t row_bytes, absl::Span<const int64_t> rows, void* dst,
                        const std::string& what) {
    const cudaStream_t stream = device_->stream();
    for (size_t r = 0; r < rows.size();) {
      size_t run = 1;
      while (r + run < rows.size() && rows[r + run] == rows[r] + static_cast<int64_t>(run)) ++run;
      KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(static_cast<char*>(dst) + r * row_bytes,
                                                static_cast<const char*>(src) + rows[r] * row_bytes, run * row_bytes,
                                                cudaMemcpyDeviceToHost, stream),
                                absl::StrCat("reading the outputs of ", what));
      r += run;
    }
    KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), absl::StrCat("reading the outputs of ", what));
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
  std::string staged_[4];  // the last call's inputs, alive until its copies have run
};

}  // namespace

absl::StatusOr<std::unique_ptr<InferenceEngine>> CreateCudaInferenceEngine(const ModelConfig& config,
                                                                           const PagedKvLayout& layout,
                                                                           Precision precision,
                                                                           std::vector<HostTensor> weights,
                                                                           CudaDevice& device,
                                                                           const CudaExecutableOptions& run) {
  auto engine = std::make_unique<CudaInferenceEngine>(config, layout, device, run);
  RETURN_IF_ERROR(engine->Init(precision, std::move(weights)));
  return engine;
}

}  // namespace kiln

#endif  // KILN_WITH_CUDA
