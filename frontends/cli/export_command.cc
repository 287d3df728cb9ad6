// kiln export-inputs: writes what `kiln train` starts from and feeds, so that another
// framework (bench/torch_llama.py) can train the same model on the same numbers:
//
//   DIR/model.safetensors  the initial weights of `kiln train MODEL --seed S` (f32, Hugging
//   DIR/config.json        Face names and layouts): DIR is a Hugging Face folder
//   DIR/batches.bin        the token rows of steps 1..N: int32 little-endian [N, batch, seq+1],
//                          row r of step n = the T+1 tokens whose first T are the inputs and
//                          last T the targets of `kiln train`'s batch n, row r
//   DIR/inputs.json        shapes, the seed, the learning rate of each step, AdamW's settings
//                          and the parameter counts (what the files mean, for a reader)
//
// The weights come from InitModelWeights and the batches from SampleBatch with the arguments
// `kiln train` passes (train_command.cc), so they are the same numbers, not a copy of the
// recipe. Gradient accumulation is not covered: one micro-batch per step (--accum 1).
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "frontends/cli/commands.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/model_config.h"
#include "frontends/weight_init.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "passes/training_step.h"
#include "runtime/memory_estimate.h"
#include "runtime/training/dataset.h"
#include "runtime/training/lr_schedule.h"

namespace kiln::cli {
namespace {

absl::Status RunExportInputs(const ParsedArgs& args) {
  ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(args.positionals()[0]));
  if (!args.Has("out")) return absl::InvalidArgumentError("--out DIR is required");
  const std::string out = args.Get("out");
  ASSIGN_OR_RETURN(int64_t steps, args.GetInt("steps", 150));
  ASSIGN_OR_RETURN(int64_t batch, args.GetInt("batch", config.batch));
  ASSIGN_OR_RETURN(int64_t seq, args.GetInt("seq", config.seq_len));
  ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 1337));
  ASSIGN_OR_RETURN(double lr, args.GetDouble("lr", 3e-3));
  if (steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  if (batch < 1 || seq < 1) return absl::InvalidArgumentError("--batch and --seq must be >= 1");
  if (seed < 0) return absl::InvalidArgumentError("--seed expects a non-negative integer");
  if (!(lr >= 0)) return absl::InvalidArgumentError("--lr expects a non-negative number");

  // Everything is held in memory before it is written: the batches, and the weights as
  // doubles and as encoded f32.
  const double batch_bytes = static_cast<double>(steps) * static_cast<double>(batch) * static_cast<double>(seq + 1) * 4;
  const double weight_bytes = static_cast<double>(ParameterCount(config)) * (8 + 4);
  const double needed = batch_bytes + weight_bytes;
  RETURN_IF_ERROR(CheckFitsHostMemory(needed >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(needed),
                                      absl::StrCat("exporting ", steps, " batches of ", args.positionals()[0]),
                                      absl::StrCat(FormatBytes(static_cast<int64_t>(std::min(batch_bytes, 9.2e18))),
                                                   " of batches (steps x batch x (seq + 1) int32) and the weights")));

  TokenDataset data = TokenDataset::Default();
  if (args.Has("data")) {
    if (args.Get("data").empty()) return absl::InvalidArgumentError("--data: the file name is empty");
    ASSIGN_OR_RETURN(data, TokenDataset::FromFile(args.Get("data")));
  }
  RETURN_IF_ERROR(data.CheckFits(config.vocab_size, seq));

  std::error_code error;
  std::filesystem::create_directories(out, error);
  if (error || !std::filesystem::is_directory(out)) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the --out folder ", out, ": ", error ? error.message() : "not a folder"));
  }

  // Batches first (small), then the weights, then inputs.json: a folder whose inputs.json
  // is new holds the files that go with it.
  const int64_t row = seq + 1;
  std::string batches(static_cast<size_t>(steps * batch * row) * sizeof(int32_t), '\0');
  for (int64_t step = 0; step < steps; ++step) {
    // As `kiln train` draws micro-batch i of 0-based step `step`: index step * accum + i.
    TokenBatch b = SampleBatch(data, static_cast<uint64_t>(seed), step, batch, seq);
    for (int64_t r = 0; r < batch; ++r) {
      std::vector<int32_t> tokens(b.inputs.begin() + r * seq, b.inputs.begin() + (r + 1) * seq);
      tokens.push_back(b.targets[(r + 1) * seq - 1]);
      // The [seq+1] layout holds a batch only if its targets are its inputs shifted by one.
      for (int64_t t = 0; t < seq; ++t) {
        if (b.targets[r * seq + t] != tokens[t + 1]) {
          return absl::InternalError(absl::StrCat("batch ", step + 1, " row ", r,
                                                  ": targets are not the inputs shifted by one"));
        }
      }
      for (int64_t t = 0; t < row; ++t) {
        const uint32_t v = static_cast<uint32_t>(tokens[t]);
        const unsigned char le[4] = {static_cast<unsigned char>(v), static_cast<unsigned char>(v >> 8),
                                     static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 24)};
        std::memcpy(&batches[((step * batch + r) * row + t) * sizeof(int32_t)], le, sizeof(le));
      }
    }
  }
  const std::string batches_path = (std::filesystem::path(out) / "batches.bin").string();
  RETURN_IF_ERROR(WriteFileAtomically(batches_path, batches));

  RETURN_IF_ERROR(ExportHuggingFaceModel(out, config, InitModelWeights(config, static_cast<uint64_t>(seed))));

  // kiln train's default schedule for --steps N and --lr X (horizon N).
  const LrSchedule schedule = LrSchedule::Default(lr, steps);
  std::vector<double> lrs;
  for (int64_t step = 0; step < steps; ++step) lrs.push_back(schedule.At(step));
  const AdamWConfig adamw;  // kiln train's defaults (--weight-decay 0.1, --clip 1.0)
  const int64_t non_embedding = NonEmbeddingParameterCount(config);
  const nlohmann::ordered_json json = {
      {"format", "kiln-export-inputs-1"},
      {"model", config.name},
      {"config",
       {{"family", config.family == ModelFamily::kGpt2 ? "gpt2" : "llama"},
        {"vocab_size", config.vocab_size},
        {"d_model", config.d_model},
        {"n_layers", config.n_layers},
        {"n_heads", config.n_heads},
        {"n_kv_heads", config.n_kv_heads},
        {"head_dim", config.head_dim},
        {"d_ff", config.d_ff},
        {"rms_eps", config.rms_eps},
        {"rope_theta", config.rope_theta},
        {"tie_embeddings", config.tie_embeddings}}},
      {"seed", seed},
      {"steps", steps},
      {"batch", batch},
      {"seq", seq},
      {"data", data.name()},
      {"weights", {{"file", "model.safetensors"}, {"dtype", "F32"}, {"names", "Hugging Face (config.json beside it)"}}},
      {"batches",
       {{"file", "batches.bin"},
        {"dtype", "int32"},
        {"byte_order", "little"},
        {"shape", {steps, batch, row}},
        {"meaning", "step n, row r: inputs = [:seq], targets = [1:]"}}},
      {"lr", lrs},
      {"lr_schedule",
       {{"peak", schedule.peak_lr},
        {"min", schedule.min_lr},
        {"warmup_steps", schedule.warmup_steps},
        {"total_steps", schedule.total_steps}}},
      {"adamw",
       {{"beta1", adamw.beta1},
        {"beta2", adamw.beta2},
        {"eps", adamw.eps},
        {"weight_decay", adamw.weight_decay},
        {"weight_decay_applies_to", "rank >= 2 (not norm weights)"},
        {"clip_norm", adamw.clip_norm}}},
      {"params", ParameterCount(config)},
      {"non_embedding_params", non_embedding},
      {"flops_per_token", 6 * non_embedding + 12 * config.n_layers * seq * config.d_model},
  };
  RETURN_IF_ERROR(WriteFileAtomically((std::filesystem::path(out) / "inputs.json").string(), json.dump(2) + "\n"));
  std::fprintf(stderr,
               "kiln export-inputs: %s (%.2fM params), seed %lld, %lld batches of %lld x %lld tokens, data: %s -> %s\n",
               config.name.c_str(), ParameterCount(config) / 1e6, static_cast<long long>(seed),
               static_cast<long long>(steps), static_cast<long long>(batch), static_cast<long long>(seq),
               data.name().c_str(), out.c_str());
  return absl::OkStatus();
}

}  // namespace

Command ExportInputsCommand() {
  return {{.name = "export-inputs",
           .usage = "MODEL --out DIR [options]",
           .summary = "write the initial weights and batches of a `kiln train` run (for other frameworks)",
           .details = "Writes into DIR what `kiln train MODEL` with the same --seed, --batch, --seq, --data and\n"
                      "--steps starts from and feeds:\n"
                      "  model.safetensors, config.json  the initial weights, f32, Hugging Face names (DIR is a\n"
                      "                                  Hugging Face folder: `kiln eval DIR` reads it)\n"
                      "  batches.bin   int32 little-endian [steps, batch, seq+1]: step n, row r holds the\n"
                      "                inputs (the first seq tokens) and targets (the last seq) of batch n\n"
                      "  inputs.json   shapes, seed, the learning rate of each step (kiln train's default\n"
                      "                schedule for --steps and --lr), AdamW's settings, parameter counts\n"
                      "One micro-batch per step (kiln train's default --accum 1).",
           .min_positionals = 1,
           .max_positionals = 1,
           .flags = {
               {.name = "out", .value_name = "DIR", .help = "folder to write (created if needed)"},
               {.name = "steps", .value_name = "N", .help = "batches to write (kiln train's --steps)",
                .default_value = "150"},
               {.name = "batch", .value_name = "B", .help = "sequences per batch", .default_value = "the preset's"},
               {.name = "seq", .value_name = "T", .help = "tokens per sequence", .default_value = "the preset's"},
               {.name = "lr", .value_name = "X", .help = "peak learning rate, for inputs.json's schedule",
                .default_value = "3e-3"},
               {.name = "data", .value_name = "FILE", .help = "training data (as kiln train's --data)",
                .default_value = "built-in corpus"},
               {.name = "seed", .value_name = "S", .help = "initial weights and batches", .default_value = "1337"},
           }},
          RunExportInputs};
}

}  // namespace kiln::cli
