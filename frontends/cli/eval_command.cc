// kiln eval: mean next-token loss of a model's weights over a data file.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "frontends/cli/backend_flag.h"
#include "frontends/cli/commands.h"
#include "frontends/cli/forward_runner.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/gpt2.h"
#include "frontends/model_config.h"
#include "frontends/training_checkpoint.h"
#include "ir/status_macros.h"
#include "runtime/memory_estimate.h"
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
  if (args.Get("data").empty()) return absl::InvalidArgumentError("--data: the file name is empty");
  ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(args.positionals()[0]));
  ASSIGN_OR_RETURN(int64_t seq, args.GetInt("seq", config.seq_len));
  ASSIGN_OR_RETURN(int64_t batch, args.GetInt("batch", config.batch));
  ASSIGN_OR_RETURN(Precision precision, ParsePrecision(args.Get("precision", "bf16")));
  if (precision == Precision::kFp8) {
    return absl::InvalidArgumentError(
        "--precision fp8 is a training policy (FP8 GEMMs in the training step); inference runs fp32 or bf16");
  }
  if (seq < 1 || batch < 1) return absl::InvalidArgumentError("--seq and --batch must be >= 1");
  // Shapes first (cheap, and within the limits), then what they cost, then the weights.
  ASSIGN_OR_RETURN(std::unique_ptr<Module> sized,
                   BuildModelModule(config, {.batch = batch, .seq_len = seq, .precision = precision}));
  RETURN_IF_ERROR(CheckFitsHostMemory(
      SaturatingSum({HostTensorBytes(2.0 * ParameterCount(config)), ReferencePeakBytes(*sized->FindFunction("forward"))}),
      absl::StrCat("evaluating ", args.positionals()[0], " with --batch ", batch, " --seq ", seq),
      "the weights as read and as bound, and one forward pass on the reference backend"));
#ifdef KILN_WITH_CUDA
  if (backend.backend == Backend::kCuda) {
    const int64_t device_bytes = DevicePeakBytes(*sized->FindFunction("forward"));
    if (device_bytes > backend.device->free_bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "evaluating ", args.positionals()[0], " with --batch ", batch, " --seq ", seq, " needs at least ",
          FormatBytes(device_bytes), " of device memory (the forward pass's live values at their peak), but ",
          FormatBytes(backend.device->free_bytes()), " are free on the GPU"));
    }
  }
#endif
  ASSIGN_OR_RETURN(TokenDataset data, TokenDataset::FromFile(args.Get("data")));
  RETURN_IF_ERROR(data.CheckFits(config.vocab_size, seq));
  ASSIGN_OR_RETURN(ModelWithWeights model, LoadModel(args));

  ASSIGN_OR_RETURN(auto scored, MeanEvalLoss(model.config, model.weights, data, seq, batch, precision, backend));
  const auto [loss, windows] = scored;
  std::fprintf(stderr, "kiln eval: %lld windows of %lld tokens from %s, %s, backend %s\n",
               static_cast<long long>(windows), static_cast<long long>(seq), data.name().c_str(),
               std::string(PrecisionName(precision)).c_str(), backend.backend == Backend::kCpu ? "cpu" : "cuda");
  // printf writes a NaN as "nan" or "-nan" by its sign bit, which means nothing here.
  if (std::isnan(loss)) {
    std::printf("loss nan\n");
  } else {
    std::printf("loss %.6f\n", loss);
  }
  if (!std::isfinite(loss)) {
    return absl::InternalError(absl::StrCat("the loss is ", loss, ": the weights of '", args.positionals()[0],
                                            "' give non-finite values on this data"));
  }
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
