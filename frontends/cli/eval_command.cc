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
  // One compiled forward per distinct batch size: full batches, then the remainder.
  std::map<int64_t, std::unique_ptr<Module>> modules;
  double loss_sum = 0;  // sum over windows of the window's mean token loss
  for (int64_t first = 0; first < windows; first += batch) {
    int64_t rows = std::min(batch, windows - first);
    auto& module = modules[rows];
    if (!module) {
      ASSIGN_OR_RETURN(module, BuildLlamaModule(model.config, {.batch = rows, .seq_len = seq, .precision = precision}));
    }
    TokenBatch b = EvalBatch(data, first, rows, seq);
    std::vector<HostTensor> inputs;
    TensorType ids{DType::kI32, {rows, seq}};
    inputs.push_back(HostTensor::FromValues(ids, std::vector<double>(b.inputs.begin(), b.inputs.end())));
    inputs.push_back(HostTensor::FromValues(ids, std::vector<double>(b.targets.begin(), b.targets.end())));
    inputs.insert(inputs.end(), model.weights.begin(), model.weights.end());
    const Function& forward = *module->FindFunction("forward");
    std::vector<HostTensor> out;
    if (backend.backend == Backend::kCpu) {
      ASSIGN_OR_RETURN(out, EvaluateFunction(forward, inputs));
    } else {
#ifdef KILN_WITH_CUDA
      ASSIGN_OR_RETURN(out, EvaluateOnGpu(forward, inputs, *backend.device));
#endif
    }
    loss_sum += out[0][0] * static_cast<double>(rows);
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
