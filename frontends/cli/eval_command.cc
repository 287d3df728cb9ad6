// kiln eval: mean next-token loss of a model's weights over a data file.
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "frontends/cli/backend_flag.h"
#include "frontends/cli/commands.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "frontends/training_checkpoint.h"
#include "ir/status_macros.h"
#include "passes/lower_gemm.h"
#include "runtime/reference_backend.h"
#ifdef KILN_WITH_CUDA
#include "runtime/cuda/executable.h"
#endif
#include "runtime/training/dataset.h"

namespace kiln::cli {
namespace {

struct ModelWithWeights {
  ModelConfig config;
  std::vector<HostTensor> weights;
};

// MODEL with --weights CKPT (a kiln training checkpoint), or an HF folder that holds its
// own weights (model.safetensors).
absl::StatusOr<ModelWithWeights> LoadModel(const ParsedArgs& args) {
  const std::string& model = args.positionals()[0];
  if (args.Has("weights")) {
    ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(model));
    ASSIGN_OR_RETURN(TrainingCheckpoint ckpt, LoadTrainingCheckpoint(args.Get("weights")));
    if (HuggingFaceConfigJson(ckpt.config) != HuggingFaceConfigJson(config)) {
      return absl::InvalidArgumentError(
          absl::StrCat(args.Get("weights"), " holds weights for a different model than '", model, "'"));
    }
    return ModelWithWeights{config, std::move(ckpt.state.params)};
  }
  std::error_code ec;
  if (std::filesystem::is_directory(model, ec)) {
    ASSIGN_OR_RETURN(HuggingFaceModel hf, LoadHuggingFaceModel(model));
    return ModelWithWeights{hf.config, std::move(hf.weights)};
  }
  return absl::InvalidArgumentError(absl::StrCat("no weights for '", model,
                                                 "': pass --weights CKPT, or a Hugging Face folder holding "
                                                 "config.json and model.safetensors"));
}

// @forward(tokens, targets, weights...) -> loss on one backend, the weights bound once.
class ForwardRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ForwardRunner>> Create(std::unique_ptr<Module> module,
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
    ASSIGN_OR_RETURN(runner->gpu_, CudaExecutable::Create(forward, *backend.device));
    for (size_t i = 0; i < weights.size(); ++i) RETURN_IF_ERROR(runner->gpu_->SetInput(2 + i, weights[i]));
#endif
    return runner;
  }

  absl::StatusOr<double> Loss(HostTensor tokens, HostTensor targets) {
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

 private:
  ForwardRunner() = default;
  std::unique_ptr<Module> module_;
  std::vector<HostTensor> args_;  // CPU: tokens, targets, weights
#ifdef KILN_WITH_CUDA
  std::unique_ptr<CudaExecutable> gpu_;
#endif
};

absl::Status RunEval(const ParsedArgs& args) {
  ASSIGN_OR_RETURN(ResolvedBackend backend, ResolveBackend(args.Get("backend", "auto")));
  if (!args.Has("data")) return absl::InvalidArgumentError("--data FILE is required");
  ASSIGN_OR_RETURN(ModelWithWeights model, LoadModel(args));
  ASSIGN_OR_RETURN(int64_t seq, args.GetInt("seq", model.config.seq_len));
  ASSIGN_OR_RETURN(int64_t batch, args.GetInt("batch", model.config.batch));
  ASSIGN_OR_RETURN(Precision precision, ParsePrecision(args.Get("precision", "bf16")));
  if (seq < 1 || batch < 1) return absl::InvalidArgumentError("--seq and --batch must be >= 1");
  ASSIGN_OR_RETURN(TokenDataset data, TokenDataset::FromFile(args.Get("data")));
  RETURN_IF_ERROR(data.CheckFits(model.config.vocab_size, seq));

  const int64_t windows = NumEvalWindows(data, seq);
  // One compiled forward per distinct batch size (full batches, then the remainder), with
  // the weights bound once.
  std::map<int64_t, std::unique_ptr<ForwardRunner>> runners;
  double loss_sum = 0;  // sum over windows of the window's mean token loss
  for (int64_t first = 0; first < windows; first += batch) {
    int64_t rows = std::min(batch, windows - first);
    std::unique_ptr<ForwardRunner>& runner = runners[rows];
    if (!runner) {
      ASSIGN_OR_RETURN(std::unique_ptr<Module> module,
                       BuildLlamaModule(model.config, {.batch = rows, .seq_len = seq, .precision = precision}));
      ASSIGN_OR_RETURN(runner, ForwardRunner::Create(std::move(module), model.weights, backend));
    }
    TokenBatch b = EvalBatch(data, first, rows, seq);
    TensorType ids{DType::kI32, {rows, seq}};
    ASSIGN_OR_RETURN(double loss,
                     runner->Loss(HostTensor::FromValues(ids, std::vector<double>(b.inputs.begin(), b.inputs.end())),
                                  HostTensor::FromValues(ids, std::vector<double>(b.targets.begin(), b.targets.end()))));
    loss_sum += loss * static_cast<double>(rows);
  }
  std::fprintf(stderr, "kiln eval: %lld windows of %lld tokens from %s, %s, backend %s\n",
               static_cast<long long>(windows), static_cast<long long>(seq), data.name().c_str(),
               std::string(PrecisionName(precision)).c_str(), backend.backend == Backend::kCpu ? "cpu" : "cuda");
  std::printf("loss %.6f\n", loss_sum / static_cast<double>(windows));
  return absl::OkStatus();
}

}  // namespace

Command EvalCommand() {
  return {{.name = "eval",
           .usage = "MODEL --data FILE [options]",
           .summary = "mean next-token loss over a data file",
           .details = "Reads FILE as stride-T windows of T+1 tokens (inputs: the first T, targets: the last T)\n"
                      "and prints the mean loss over all full windows as 'loss X'. MODEL is a preset or HF\n"
                      "config with --weights CKPT (from kiln train --save), or a Hugging Face folder holding\n"
                      "config.json and model.safetensors. FILE is read as for 'kiln train --data'.",
           .min_positionals = 1,
           .max_positionals = 1,
           .flags = {
               {.name = "data", .value_name = "FILE", .help = "the text or .bin token file to score"},
               {.name = "weights", .value_name = "CKPT", .help = "a kiln training checkpoint"},
               {.name = "seq", .value_name = "T", .help = "window length", .default_value = "the model's"},
               {.name = "batch", .value_name = "B", .help = "windows per forward pass", .default_value = "the model's"},
               {.name = "backend", .value_name = "B", .help = "cpu, cuda or auto", .default_value = "auto"},
               {.name = "precision", .value_name = "P", .help = "fp32 or bf16", .default_value = "bf16"},
           }},
          RunEval};
}

}  // namespace kiln::cli
