// kiln train: train a model on the built-in corpus or a file, with checkpoints and resume.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "codegen/capabilities.h"
#include "frontends/cli/backend_flag.h"
#include "frontends/cli/commands.h"
#include "frontends/cli/forward_runner.h"
#include "frontends/cli/model_source.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/gpt2.h"
#include "frontends/model_config.h"
#include "frontends/cuda_trainer.h"
#include "frontends/fp8_report.h"
#include "frontends/trainer.h"
#include "frontends/training_checkpoint.h"
#include "frontends/weight_init.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "passes/elide_grad_zeroing.h"
#include "passes/fusion.h"
#include "passes/select_fp8_gemm.h"
#include "passes/training_compile.h"
#include "passes/training_step.h"
#include "runtime/memory_estimate.h"
#ifdef KILN_WITH_CUDA
#include "runtime/distributed/nccl.h"
#endif
#include "runtime/step_profile.h"
#include "runtime/training/dataset.h"
#include "runtime/training/lr_schedule.h"

namespace kiln {
class CudaTrainer;  // frontends/cuda_trainer.h, in builds with CUDA
}  // namespace kiln

namespace kiln::cli {
namespace {

// The flags a run is made of. A checkpoint stores them, so that a resumed run continues
// exactly as an uninterrupted run would have.
// The shape of the run: a resume that changed one would not be a continuation.
const char* const kFixedOnResume[] = {"batch", "seq", "accum", "seed", "precision"};
// The schedule and the optimizer: a resume may set these anew (the horizon above all, when
// a run is extended), and says so.
const char* const kScheduleSettings[] = {"lr", "min-lr", "warmup", "lr-decay-steps", "weight-decay", "clip"};
// Recorded beside the settings: where the batches come from, and the --steps of the run.
constexpr char kDataSetting[] = "data";
constexpr char kStepsSetting[] = "steps";
constexpr char kBuiltInData[] = "built-in";
// "true" when the run trained on the data less its held-out last tenth (--eval-every).
constexpr char kHeldOutSetting[] = "held-out";

struct RunSettings {
  int64_t batch = 0, seq = 0, accum = 1, warmup = 0, lr_decay_steps = 0;
  uint64_t seed = 0;
  Precision precision = Precision::kBf16;
  double lr = 0, min_lr = 0, weight_decay = 0, clip = 0;
};

bool SameSetting(const std::string& a, const std::string& b) {
  double x, y;
  if (absl::SimpleAtod(a, &x) && absl::SimpleAtod(b, &y)) return x == y;
  return a == b;
}

std::string ExactText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// Settings by flag name, with where each value came from, so that an error about a value
// names its source: "--lr" for a flag, "CKPT's saved 'lr'" for a checkpoint's.
struct ResolvedSettings {
  std::map<std::string, std::string> values;
  std::map<std::string, std::string> origins;
  std::vector<std::string> changes;  // on resume: each setting that differs from the saved run
};

// From the checkpoint when resuming (a run-shape flag that disagrees is an error; a
// schedule flag that disagrees replaces the saved value and is reported), else from the
// flags, else the defaults.
absl::StatusOr<ResolvedSettings> ResolveRunSettings(const ParsedArgs& args, const ModelConfig& config, int64_t steps,
                                                    const TrainingCheckpoint* resume) {
  ResolvedSettings r;
  if (resume) {
    const std::string ckpt = args.Get("resume");
    auto saved = [&](const char* flag) -> absl::StatusOr<std::string> {
      auto it = resume->settings.find(flag);
      if (it == resume->settings.end()) {
        return absl::InvalidArgumentError(absl::StrCat(ckpt, ": no '", flag, "' setting saved"));
      }
      return it->second;
    };
    for (const char* flag : kFixedOnResume) {
      ASSIGN_OR_RETURN(std::string value, saved(flag));
      if (args.Has(flag) && !SameSetting(args.Get(flag), value)) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", args.Get(flag), " differs from the checkpoint's ",
                                                       value, " (", ckpt, "); a resumed run keeps the saved ", flag,
                                                       ": drop the flag"));
      }
      r.values[flag] = value;
      r.origins[flag] = absl::StrCat(ckpt, "'s saved '", flag, "'");
    }
    for (const char* flag : kScheduleSettings) {
      ASSIGN_OR_RETURN(std::string value, saved(flag));
      if (args.Has(flag) && !SameSetting(args.Get(flag), value)) {
        r.changes.push_back(absl::StrCat("--", flag, " ", args.Get(flag), " (the saved run had ", value, ")"));
        r.values[flag] = args.Get(flag);
        r.origins[flag] = absl::StrCat("--", flag);
      } else {
        r.values[flag] = value;
        r.origins[flag] = absl::StrCat(ckpt, "'s saved '", flag, "'");
      }
    }
    auto saved_steps = resume->settings.find(kStepsSetting);
    if (saved_steps != resume->settings.end() && !SameSetting(saved_steps->second, absl::StrCat(steps))) {
      r.changes.push_back(absl::StrCat("--steps ", steps, " (the saved run had ", saved_steps->second, ")"));
    }
    int64_t horizon = 0;
    if (!args.Has("lr-decay-steps") && absl::SimpleAtoi(r.values["lr-decay-steps"], &horizon) && steps > horizon) {
      r.changes.push_back(absl::StrCat("--steps ", steps, " runs past the saved schedule's horizon (--lr-decay-steps ",
                                       horizon, "): steps ", horizon + 1, "..", steps, " run at --min-lr ",
                                       r.values["min-lr"], "; pass --lr-decay-steps ", steps,
                                       " to stretch the cosine to the new end"));
    }
    return r;
  }
  auto set = [&](const char* flag, std::string fallback) {
    r.values[flag] = args.Has(flag) ? args.Get(flag) : fallback;
    r.origins[flag] = args.Has(flag) ? absl::StrCat("--", flag) : absl::StrCat("the default --", flag);
  };
  set("batch", absl::StrCat(config.batch));
  set("seq", absl::StrCat(config.seq_len));
  set("accum", "1");
  set("seed", "1337");
  set("precision", "bf16");
  set("lr", "0.003");
  double lr = 0;
  if (!absl::SimpleAtod(r.values["lr"], &lr)) {
    return absl::InvalidArgumentError(absl::StrCat("--lr expects a number, got '", r.values["lr"], "'"));
  }
  set("min-lr", ExactText(LrSchedule::Default(lr, steps).min_lr));
  set("lr-decay-steps", absl::StrCat(steps));
  int64_t horizon = 0;
  if (!absl::SimpleAtoi(r.values["lr-decay-steps"], &horizon)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr-decay-steps expects an integer, got '", r.values["lr-decay-steps"], "'"));
  }
  set("warmup", absl::StrCat(LrSchedule::Default(lr, horizon).warmup_steps));
  set("weight-decay", "0.1");
  set("clip", "1.0");
  return r;
}

absl::StatusOr<RunSettings> ParseRunSettings(const ResolvedSettings& r) {
  RunSettings s;
  // "--lr expects ..." for a flag, "ck.st's saved 'lr' is 'x', expected ..." for a checkpoint's.
  auto invalid = [&](const char* flag, absl::string_view expected) {
    const std::string& origin = r.origins.at(flag);
    if (absl::StartsWith(origin, "--")) {
      return absl::InvalidArgumentError(absl::StrCat(origin, " expects ", expected, ", got '", r.values.at(flag), "'"));
    }
    return absl::InvalidArgumentError(absl::StrCat(origin, " is '", r.values.at(flag), "', expected ", expected));
  };
  auto integer = [&](const char* flag, int64_t& out, int64_t min) -> absl::Status {
    if (!absl::SimpleAtoi(r.values.at(flag), &out) || out < min) {
      return invalid(flag, min == 0 ? "a non-negative integer" : absl::StrCat("an integer >= ", min));
    }
    return absl::OkStatus();
  };
  auto number = [&](const char* flag, double& out) -> absl::Status {
    if (!absl::SimpleAtod(r.values.at(flag), &out) || !(out >= 0) || !std::isfinite(out)) {
      return invalid(flag, "a finite non-negative number");
    }
    return absl::OkStatus();
  };
  int64_t seed = 0;
  RETURN_IF_ERROR(integer("batch", s.batch, 1));
  RETURN_IF_ERROR(integer("seq", s.seq, 1));
  RETURN_IF_ERROR(integer("accum", s.accum, 1));
  RETURN_IF_ERROR(integer("seed", seed, 0));
  RETURN_IF_ERROR(integer("warmup", s.warmup, 0));
  RETURN_IF_ERROR(integer("lr-decay-steps", s.lr_decay_steps, 1));
  RETURN_IF_ERROR(number("lr", s.lr));
  RETURN_IF_ERROR(number("min-lr", s.min_lr));
  RETURN_IF_ERROR(number("weight-decay", s.weight_decay));
  RETURN_IF_ERROR(number("clip", s.clip));
  if (s.min_lr > s.lr) {
    return absl::InvalidArgumentError(absl::StrCat("the final learning rate (", r.origins.at("min-lr"), " = ",
                                                   r.values.at("min-lr"), ") is above the peak (", r.origins.at("lr"),
                                                   " = ", r.values.at("lr"), "): the schedule decays from --lr to "
                                                   "--min-lr"));
  }
  s.seed = static_cast<uint64_t>(seed);
  absl::StatusOr<Precision> precision = ParsePrecision(r.values.at("precision"));
  if (!precision.ok()) return invalid("precision", "fp32, bf16 or fp8");
  s.precision = *precision;
  return s;
}

// The training data: --data FILE, else (resuming) the saved run's, else the built-in
// corpus. `recorded` is what the checkpoint will hold: "built-in" or an absolute path.
struct TrainingData {
  TokenDataset data;
  std::string recorded;
  std::string note;  // why this data, when it is not what the flags say
};

absl::StatusOr<TrainingData> ResolveTrainingData(const ParsedArgs& args, const TrainingCheckpoint* resume) {
  std::string saved;
  if (resume) {
    auto it = resume->settings.find(kDataSetting);
    if (it != resume->settings.end()) saved = it->second;
  }
  auto from_file = [](const std::string& path) -> absl::StatusOr<TrainingData> {
    ASSIGN_OR_RETURN(TokenDataset data, TokenDataset::FromFile(path));
    std::error_code ec;
    std::filesystem::path absolute = std::filesystem::absolute(path, ec);
    return TrainingData{std::move(data), ec ? path : absolute.lexically_normal().string(), ""};
  };
  if (args.Has("data")) {
    if (args.Get("data").empty()) return absl::InvalidArgumentError("--data: the file name is empty");
    ASSIGN_OR_RETURN(TrainingData d, from_file(args.Get("data")));
    if (resume && !saved.empty() && saved != d.recorded) {
      d.note = absl::StrCat("--data ", args.Get("data"), " (the saved run trained on ",
                            saved == kBuiltInData ? "the built-in corpus" : saved, ")");
    }
    return d;
  }
  if (resume && !saved.empty() && saved != kBuiltInData) {
    absl::StatusOr<TrainingData> d = from_file(saved);
    if (!d.ok()) {
      return absl::Status(d.status().code(),
                          absl::StrCat(args.Get("resume"), " was trained on ", saved,
                                       ", which cannot be read now (", d.status().message(),
                                       "); pass --data to choose the data"));
    }
    d->note = absl::StrCat("data from the checkpoint: ", saved);
    return d;
  }
  TrainingData d{TokenDataset::Default(), kBuiltInData, ""};
  if (resume && saved.empty()) {
    d.note = "the checkpoint does not record its data (it predates kiln recording it): training on the built-in "
             "corpus; pass --data to choose";
  }
  return d;
}

// Every output the run will write, checked before any work, so that a typo in a path costs
// a second, not a training run. Changes nothing on disk.
absl::Status CheckOutputs(const ParsedArgs& args) {
  for (const char* flag : {"save", "trace"}) {
    if (args.Has(flag)) RETURN_IF_ERROR(CheckOutputPath(args.Get(flag), absl::StrCat("--", flag)));
  }
  return absl::OkStatus();
}

// Where the first step's weights come from: a checkpoint (resume), the model.safetensors of
// a Hugging Face folder, or the seeded initializer.
struct InitialWeights {
  std::vector<HostTensor> params;
  std::string source;  // for the run's first line
};

bool FolderHasWeights(const std::string& folder) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(folder) / "model.safetensors", ec) ||
         std::filesystem::exists(std::filesystem::path(folder) / "model.safetensors.index.json", ec);
}

absl::StatusOr<InitialWeights> LoadInitialWeights(const ParsedArgs& args, const ModelConfig& config, uint64_t seed,
                                                  const TrainingCheckpoint* resume) {
  if (resume) {
    return InitialWeights{resume->state.params,  // the trainer starts from them; SetState adds m, v, t
                          absl::StrCat("checkpoint ", args.Get("resume"), " (step ", resume->state.step, ")")};
  }
  const std::string& model = args.positionals()[0];
  std::error_code ec;
  if (std::filesystem::is_directory(model, ec) && FolderHasWeights(model)) {
    ASSIGN_OR_RETURN(HuggingFaceModel hf, LoadHuggingFaceModel(model));
    if (HuggingFaceConfigJson(hf.config) != HuggingFaceConfigJson(config)) {
      return absl::InternalError(absl::StrCat(model, ": the weights were read for another config than the model's"));
    }
    return InitialWeights{std::move(hf.weights), absl::StrCat((std::filesystem::path(model) / "").string(),
                                                              "model.safetensors")};
  }
  return InitialWeights{InitModelWeights(config, seed), absl::StrCat("random init (seed ", seed, ")")};
}

// "step 12/150  loss 4.8123  tok/s 9120  elapsed 3.1s": a line per step when stdout is not
// a terminal (logs stay diffable: the same run prints the same losses), a bar on a terminal.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(int64_t total) : total_(total), tty_(::isatty(STDOUT_FILENO)) {}
  void Report(int64_t step, double loss, double tok_per_s, double elapsed_s) {
    std::string text = absl::StrCat("step ", step, "/", total_, "  loss ", Fixed(loss, 4), "  tok/s ",
                                    static_cast<int64_t>(std::llround(tok_per_s)), "  elapsed ", Fixed(elapsed_s, 1),
                                    "s");
    if (!tty_) {
      std::printf("%s\n", text.c_str());
    } else {
      const int width = 30;
      int filled = static_cast<int>(width * step / std::max<int64_t>(total_, 1));
      std::printf("\r[%s%s] %s\x1b[K", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                  text.c_str());
      if (step == total_) std::printf("\n");
    }
    std::fflush(stdout);
  }

 private:
  static std::string Fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
    return buf;
  }
  int64_t total_;
  bool tty_;
};

// --report: where the time to the first step went.
// `phases` are the driver's own (model build, passes, weights, ...), `cuda`'s executable's
// follow (codegen, NVRTC, plans, capture), then the first step itself.
void PrintPhases(const std::vector<std::pair<std::string, double>>& phases, const CudaTrainer* cuda,
                 double first_step_seconds) {
  std::fprintf(stderr, "kiln train: phases before the first step\n");
  auto row = [](const std::string& phase, double seconds) {
    std::fprintf(stderr, "  %-72s %7.2f s\n", phase.c_str(), seconds);
  };
  for (const auto& [phase, seconds] : phases) row(phase, seconds);
#ifdef KILN_WITH_CUDA
  if (cuda != nullptr) {
    for (const auto& [phase, seconds] : cuda->executable().stats().phases) row(phase, seconds);
  }
#endif
  row("the first step (its CUDA graph capture included above)", first_step_seconds);
}

#ifdef KILN_WITH_CUDA
// --report: what autotuning each distinct GEMM found (the heuristic's first choice against the
// one kept), the calls of a step that share it, and the time a step saves by it.
void PrintGemmTuning(const std::vector<CudaExecutable::Stats::GemmTuningRecord>& records) {
  if (records.empty()) {
    std::fprintf(stderr, "kiln train: cuBLASLt autotuning: off (--no-gemm-autotune) or no GEMM to tune\n");
    return;
  }
  double saved_us = 0;
  int changed = 0, cached = 0;
  for (const auto& r : records) {
    saved_us += r.calls * (r.tuning.first_us - r.tuning.best_us);
    changed += r.tuning.chosen != 0;
    cached += r.from_cache;
  }
  std::fprintf(stderr,
               "kiln train: cuBLASLt autotuning: %zu distinct GEMMs (%d choices from an earlier run's cache), %d run "
               "another algorithm than the heuristic's first; those timed now save %.2f ms a step (min of 5 calls)\n"
               "  calls  heuristic us   kept us  rank/of  gemm\n",
               records.size(), cached, changed, saved_us / 1000.0);
  for (const auto& r : records) {
    if (r.from_cache) {
      std::fprintf(stderr, "  %5lld  %12s  %8s  %3d      %s\n", static_cast<long long>(r.calls), "cached", "",
                   r.tuning.chosen, r.gemm.c_str());
    } else {
      std::fprintf(stderr, "  %5lld  %12.1f  %8.1f  %3d/%-3d  %s\n", static_cast<long long>(r.calls),
                   r.tuning.first_us, r.tuning.best_us, r.tuning.chosen, r.tuning.candidates, r.gemm.c_str());
    }
  }
}

// --trace writes the profiled (last) step as a Chrome trace; --report prints where its time
// went and what the memory plan holds.
absl::Status ReportProfile(const ParsedArgs& args, const CudaTrainer& cuda, int64_t steps) {
  const CudaExecutable& exe = cuda.executable();
  const std::vector<StepTiming>& timings = cuda.last_profile();
  if (args.Has("trace")) {
    RETURN_IF_ERROR(WriteFileAtomically(args.Get("trace"),
                                        ChromeTraceJson(timings, absl::StrCat("kiln train, step ", steps))));
    std::fprintf(stderr, "kiln train: wrote step %lld's %zu launches to %s (open it in ui.perfetto.dev)\n",
                 static_cast<long long>(steps), timings.size(), args.Get("trace").c_str());
  }
  if (args.Has("report")) {
    std::fprintf(stderr, "kiln train: GPU time of step %lld by kernel group, %s%s\n%s", static_cast<long long>(steps),
                 TimingMethod(timings).c_str(),
                 exe.profile_fallback().empty() ? "" : absl::StrCat(" (", exe.profile_fallback(), ")").c_str(),
                 FormatGroupTable(timings, 15).c_str());
    std::fprintf(stderr, "kiln train: the step's 20 launches of most exposed time\n%s",
                 FormatSlowestLaunches(timings, 20).c_str());
    std::fprintf(stderr, "kiln train: memory plan: %s\nlargest buffers:\n%s", exe.buffer_plan().Summary().c_str(),
                 exe.buffer_plan().LargestBuffers(exe.function(), 10).c_str());
    std::fprintf(stderr, "kiln train: CUDA graph: %lld nodes\n", static_cast<long long>(exe.stats().graph_nodes));
    PrintGemmTuning(exe.stats().gemm_tuning);
  }
  return absl::OkStatus();
}
#endif

// What the run holds at its peak, estimated from the step function before anything big is
// allocated; refuses when that cannot fit. On the CPU every value is a double: the state
// (weights, m, v) as the trainer keeps it, plus one evaluation of the step, whose arguments
// are that state moved in and whose outputs are the next state.
absl::Status CheckRunFits(const ParsedArgs& args, const ModelConfig& config, const RunSettings& s,
                          const Function& step_fn, const ResolvedBackend& backend) {
  const std::string what = absl::StrCat("training ", args.positionals()[0], " (batch ", s.batch, " x seq ", s.seq,
                                        " x accum ", s.accum, ")");
  const int64_t initial_weights = HostTensorBytes(static_cast<double>(ParameterCount(config)));
  if (backend.backend == Backend::kCpu) {
    return CheckFitsHostMemory(SaturatingSum({initial_weights, ReferencePeakBytes(step_fn)}),
                               absl::StrCat(what, " on the CPU"),
                               "the initial weights, then one training step on the reference backend, "
                               "8 bytes per value");
  }
  RETURN_IF_ERROR(CheckFitsHostMemory(SaturatingSum({initial_weights, initial_weights}), what,
                                      "the initial weights and their encoding for the upload"));
#ifdef KILN_WITH_CUDA
  const int64_t device_bytes = DevicePeakBytes(step_fn);
  if (device_bytes > backend.device->free_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " needs at least ", FormatBytes(device_bytes),
                                                     " of device memory (the step's live values at their peak), but ",
                                                     FormatBytes(backend.device->free_bytes()), " are free on the GPU"));
  }
#endif
  return absl::OkStatus();
}

// --save-every N writes PATH's stem + "-stepN" + extension; --keep-last K removes this
// run's older ones. Each is written as --save is: atomically.
class PeriodicCheckpoints {
 public:
  PeriodicCheckpoints(std::string save_path, int64_t every, int64_t keep_last)
      : save_path_(std::move(save_path)), every_(every), keep_last_(keep_last) {}

  bool Due(int64_t steps_done, int64_t total) const {
    return every_ > 0 && steps_done % every_ == 0 && steps_done != total;
  }

  absl::Status Save(const TrainingCheckpoint& checkpoint) {
    const std::filesystem::path base = save_path_;
    const std::string path =
        (base.parent_path() / absl::StrCat(base.stem().string(), "-step", checkpoint.state.step,
                                           base.extension().string()))
            .string();
    RETURN_IF_ERROR(SaveTrainingCheckpoint(path, checkpoint));
    std::fprintf(stderr, "kiln train: saved step %lld to %s\n", static_cast<long long>(checkpoint.state.step),
                 path.c_str());
    written_.push_back(path);
    while (keep_last_ > 0 && static_cast<int64_t>(written_.size()) > keep_last_) {
      std::error_code ec;
      std::filesystem::remove(written_.front(), ec);
      written_.erase(written_.begin());
    }
    return absl::OkStatus();
  }

 private:
  std::string save_path_;
  int64_t every_, keep_last_;
  std::vector<std::string> written_;
};

// --eval-every: the last tenth of the data is held out (the run trains on the rest), and
// its loss is measured on up to kHeldOutWindows windows of --seq tokens.
constexpr int64_t kHeldOutWindows = 64;
struct DataSplit {
  TokenDataset train;
  std::optional<TokenDataset> held_out;
};

absl::StatusOr<DataSplit> SplitForEvaluation(const TokenDataset& data, int64_t seq, bool hold_out) {
  if (!hold_out) return DataSplit{data, std::nullopt};
  const int64_t held = std::max<int64_t>(data.size() / 10, seq + 1);
  if (data.size() - held < seq + 1) {
    return absl::InvalidArgumentError(absl::StrCat("--eval-every: ", data.name(), " holds ", data.size(),
                                                   " tokens, too few to hold out ", held,
                                                   " and still train on windows of ", seq + 1));
  }
  const int64_t cut = data.size() - held;
  return DataSplit{data.Slice(absl::StrCat(data.name(), " [0, ", cut, ")"), 0, cut),
                   data.Slice(absl::StrCat(data.name(), " [", cut, ", ", data.size(), ")"), cut, data.size())};
}

#ifdef KILN_WITH_CUDA
// Compiles the step for the GPU and says what it became: launches, GEMMs, the arena.
absl::StatusOr<std::unique_ptr<CudaTrainer>> CreateCudaTrainer(const ParsedArgs& args, std::unique_ptr<Module> module,
                                                               const Function* step_fn,
                                                               const TrainingStepLayout& layout,
                                                               std::vector<HostTensor> params,
                                                               const ResolvedBackend& backend) {
  auto compile_start = std::chrono::steady_clock::now();
  CudaExecutableOptions exe_options;
  exe_options.cuda_graph = !args.Has("no-cuda-graph");
  exe_options.autotune_gemms = !args.Has("no-gemm-autotune");
  ASSIGN_OR_RETURN(std::unique_ptr<CudaTrainer> cuda, CudaTrainer::Create(std::move(module), step_fn, layout,
                                                                          std::move(params), *backend.device,
                                                                          exe_options));
  const CudaExecutable::Stats& st = cuda->executable().stats();
  std::fprintf(stderr,
               "kiln train: compiled the step in %.1fs: %lld kernel launches (%lld distinct, %lld from the cache), "
               "%lld GEMMs, arena %.2f GB, %.2f GB moved per step (operands and results, from the plan)\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - compile_start).count(),
               static_cast<long long>(st.kernels), static_cast<long long>(st.distinct_kernels),
               static_cast<long long>(st.cache_hits), static_cast<long long>(st.gemms), st.arena_bytes / 1e9,
               st.bytes_moved / 1e9);
  // Everything kiln allocates on the device is the arena (torch's max_memory_allocated
  // counterpart; the CUDA context and cuBLASLt handles are outside both).
  std::fprintf(stderr, "kiln train: peak device memory: %lld bytes\n", static_cast<long long>(st.arena_bytes));
  return cuda;
}
#endif

// --steps and the periodic work along the run, checked against each other.
struct RunLength {
  int64_t steps = 0, save_every = 0, keep_last = 0, eval_every = 0;
};

absl::StatusOr<RunLength> ParseRunLength(const ParsedArgs& args, const ResolvedBackend& backend) {
  RunLength r;
  ASSIGN_OR_RETURN(r.steps, args.GetInt("steps", 150));
  if (r.steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  ASSIGN_OR_RETURN(r.save_every, args.GetInt("save-every", 0));
  ASSIGN_OR_RETURN(r.keep_last, args.GetInt("keep-last", 0));
  ASSIGN_OR_RETURN(r.eval_every, args.GetInt("eval-every", 0));
  if (r.save_every < 0 || r.keep_last < 0 || r.eval_every < 0) {
    return absl::InvalidArgumentError("--save-every, --keep-last and --eval-every must be >= 0");
  }
  if (r.save_every > 0 && !args.Has("save")) {
    return absl::InvalidArgumentError("--save-every needs --save PATH (the periodic checkpoints are named after it)");
  }
  if (r.keep_last > 0 && r.save_every == 0) return absl::InvalidArgumentError("--keep-last needs --save-every");
  if (backend.backend == Backend::kCpu) {
    for (const char* flag : {"trace", "no-cuda-graph", "no-gemm-autotune"}) {
      if (args.Has(flag)) return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs --backend cuda"));
    }
  }
  return r;
}

// --resume CKPT: a checkpoint of this model with steps left to run.
absl::StatusOr<std::optional<TrainingCheckpoint>> LoadResume(const ParsedArgs& args, const ModelConfig& config,
                                                             int64_t steps) {
  if (!args.Has("resume")) return std::optional<TrainingCheckpoint>();
  ASSIGN_OR_RETURN(TrainingCheckpoint resume, LoadTrainingCheckpoint(args.Get("resume")));
  if (HuggingFaceConfigJson(resume.config) != HuggingFaceConfigJson(config)) {
    return absl::InvalidArgumentError(absl::StrCat(args.Get("resume"), " holds a different model than '",
                                                   args.positionals()[0], "'"));
  }
  if (resume.state.step >= steps) {
    return absl::InvalidArgumentError(absl::StrCat(args.Get("resume"), " is at step ", resume.state.step, "; --steps ",
                                                   steps, " is the total to reach, so nothing is left"));
  }
  return std::optional<TrainingCheckpoint>(std::move(resume));
}

// What NCCL says on this machine, for --gpus N's message: the data-parallel runner will need it.
std::string NcclAvailability() {
#ifdef KILN_WITH_CUDA
  absl::StatusOr<std::unique_ptr<NcclLibrary>> nccl = NcclLibrary::Load();
  if (!nccl.ok()) return std::string(nccl.status().message());  // "NCCL not found: dlopen(...) failed: ..."
  absl::StatusOr<std::string> version = (*nccl)->VersionString();
  if (!version.ok()) return absl::StrCat("NCCL loads from ", (*nccl)->path(), " but ", version.status().message());
  return absl::StrCat("NCCL loads: version ", *version, " from ", (*nccl)->path());
#else
  return "NCCL not available: this kiln was built without the CUDA toolkit";
#endif
}

// --gpus N: 1 is the single-process run. N > 1 is checked (the global batch splits over the
// ranks, SampleRankBatch), then refused: the multi-process runner (one process per GPU, the
// buckets all-reduced inside the step's CUDA graph) is not built yet, and training on one
// GPU while the user asked for N would be a silent lie about what ran.
absl::Status CheckGpus(const ParsedArgs& args, const RunSettings& s) {
  if (!args.Has("gpus")) return absl::OkStatus();
  int64_t gpus = 0;
  if (!absl::SimpleAtoi(args.Get("gpus"), &gpus) || gpus < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--gpus expects an integer >= 1, got '", args.Get("gpus"), "'"));
  }
  if (gpus == 1) return absl::OkStatus();
  if (s.batch % gpus != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--gpus ", gpus, ": --batch ", s.batch, " does not split evenly over ",
                                                   gpus, " GPUs (each trains on batch / N sequences of every "
                                                   "micro-batch): pick a batch divisible by ", gpus));
  }
  return absl::UnimplementedError(absl::StrCat(
      "--gpus ", gpus, ": data-parallel training is not implemented yet (", NcclAvailability(),
      "); the gradient bucketing plan (runtime/distributed/grad_buckets.h), the rank batches (SampleRankBatch, "
      "runtime/training/dataset.h) and the rank processes' launcher and rendezvous (runtime/distributed/"
      "rank_launcher.h, rendezvous.h) exist, the runner that all-reduces the buckets inside the step does not: "
      "train with --gpus 1"));
}

absl::Status RunTrain(const ParsedArgs& args) {
  const auto run_start = std::chrono::steady_clock::now();
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const bool report = args.Has("report");
  ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(args.positionals()[0]));
  ASSIGN_OR_RETURN(ResolvedBackend backend, ResolveBackend(args.Get("backend", "auto")));
  ASSIGN_OR_RETURN(RunLength length, ParseRunLength(args, backend));
  const int64_t steps = length.steps;
  RETURN_IF_ERROR(CheckOutputs(args));
  ASSIGN_OR_RETURN(std::optional<TrainingCheckpoint> resume, LoadResume(args, config, steps));
  ASSIGN_OR_RETURN(ResolvedSettings settings, ResolveRunSettings(args, config, steps, resume ? &*resume : nullptr));
  ASSIGN_OR_RETURN(RunSettings s, ParseRunSettings(settings));
  RETURN_IF_ERROR(CheckGpus(args, s));
  const LrSchedule schedule{.peak_lr = s.lr, .min_lr = s.min_lr, .warmup_steps = s.warmup,
                            .total_steps = s.lr_decay_steps};

  ASSIGN_OR_RETURN(TrainingData training_data, ResolveTrainingData(args, resume ? &*resume : nullptr));
  RETURN_IF_ERROR(training_data.data.CheckFits(config.vocab_size, s.seq));
  // A held-out split changes what the run trains on, so a resume keeps the saved run's.
  const bool saved_held_out = resume && resume->settings.count(kHeldOutSetting) > 0 &&
                              resume->settings.at(kHeldOutSetting) == "true";
  const bool hold_out = length.eval_every > 0 || saved_held_out;
  if (resume && hold_out != saved_held_out) {
    settings.changes.push_back("--eval-every holds out the last tenth of the data: the run now trains on the rest "
                               "(the saved run trained on all of it)");
  }
  ASSIGN_OR_RETURN(DataSplit split, SplitForEvaluation(training_data.data, s.seq, hold_out));
  const TokenDataset& data = split.train;
  std::map<std::string, std::string> saved_settings = settings.values;
  saved_settings[kDataSetting] = training_data.recorded;
  saved_settings[kStepsSetting] = absl::StrCat(steps);
  saved_settings[kHeldOutSetting] = hold_out ? "true" : "false";

  std::vector<std::pair<std::string, double>> phases;  // for --report
  auto phase_start = std::chrono::steady_clock::now();
  auto end_phase = [&](std::string name) {
    phases.emplace_back(std::move(name), seconds_since(phase_start));
    phase_start = std::chrono::steady_clock::now();
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Module> module,
                   BuildModelModule(config, {.batch = s.batch, .seq_len = s.seq, .precision = s.precision}));
  CompileOptions compile_options;
  compile_options.precision = s.precision;
#ifdef KILN_WITH_CUDA
  compile_options.capabilities = &CodegenCapabilities();
  // Passes choose implementations for the GPU the step will run on.
  if (backend.device != nullptr) compile_options.target = backend.device->target();
#endif
  // An ablation (bench/ablation_h200.sh): the passes change no value beyond their policy
  // (`kiln check`), so the run trains the same model, at the speed and memory without them.
  if (args.Has("disable-pass")) {
    compile_options.disabled_passes = absl::StrSplit(args.Get("disable-pass"), ',', absl::SkipEmpty());
  }
  if (args.Has("enable-pass")) {
    compile_options.enabled_passes = absl::StrSplit(args.Get("enable-pass"), ',', absl::SkipEmpty());
  }
  RETURN_IF_ERROR(TrainingCompileFlagsFromArgs(args, compile_options));
  TrainingStepOptions step_options;
  step_options.accum_steps = s.accum;
  step_options.adamw.weight_decay = s.weight_decay;
  step_options.adamw.clip_norm = s.clip;
  // The sequence `kiln compile --training` and `kiln check --training` run too (`kiln check`
  // proves the pipeline changes no value); the step keeps its name and signature.
  ASSIGN_OR_RETURN(TrainingCompile compile, TrainingCompile::Create(step_options, compile_options));
  RETURN_IF_ERROR(compile.BuildStep(*module));
  RETURN_IF_ERROR(CheckRunFits(args, config, s, *module->FindFunction(step_options.name), backend));
  end_phase("model build + autodiff");
  ASSIGN_OR_RETURN(InitialWeights init, LoadInitialWeights(args, config, s.seed, resume ? &*resume : nullptr));
  end_phase(resume ? "checkpoint weights" : "initial weights");
  std::fprintf(stderr,
               "kiln train: %s (%.2fM params), %s, batch %lld x seq %lld x accum %lld, data: %s, weights: %s, "
               "backend %s\n",
               config.name.c_str(), ParameterCount(config) / 1e6, std::string(PrecisionName(s.precision)).c_str(),
               static_cast<long long>(s.batch), static_cast<long long>(s.seq), static_cast<long long>(s.accum),
               data.name().c_str(), init.source.c_str(), backend.backend == Backend::kCpu ? "cpu" : "cuda");
  std::fprintf(stderr, "kiln train: schedule: peak lr %g (%s) after %lld warmup step%s (%s), cosine to %g at step %lld\n",
               s.lr, settings.origins.at("lr").c_str(), static_cast<long long>(s.warmup), s.warmup == 1 ? "" : "s",
               settings.origins.at("warmup").c_str(), s.min_lr, static_cast<long long>(s.lr_decay_steps));
  if (!training_data.note.empty()) std::fprintf(stderr, "kiln train: %s\n", training_data.note.c_str());
  for (const std::string& change : settings.changes) {
    std::fprintf(stderr, "kiln train: resume changes the run: %s\n", change.c_str());
  }
  RETURN_IF_ERROR(compile.RunMainPipeline(*module));
  end_phase("pass pipeline");
  const Function* step_fn = compile.step();
  const TrainingStepLayout layout = compile.layout();
  if (report) {
    const auto* fusion = dynamic_cast<const FusionPass*>(compile.main_pipeline().FindPass(FusionPass::kName));
    std::fprintf(stderr, "kiln train: target %s\n",
                 compile_options.target ? compile_options.target->ToString().c_str() : "none (the CPU reference backend)");
    std::fprintf(stderr, "kiln train: forward pipeline (before autodiff)\n%s\n",
                 compile.forward_report().ToString().c_str());
    std::fprintf(stderr, "kiln train: pass pipeline\n%s\nkiln train: fusion (`kiln compile --report` lists each decision)\n%s\n",
                 compile.main_report().ToString().c_str(),
                 FormatFusionReport(*step_fn, fusion ? fusion->decisions() : std::vector<FusionDecision>{}, false)
                     .c_str());
    std::fprintf(stderr, "kiln train: zero-initialised accumulators: %lld\n",
                 static_cast<long long>(CountZeroInitialisedAccumulators(*module)));
  }

  // --fp8-calibrate (a fresh run): the states start with no amax history, so the first step
  // quantizes everything with scale 1 (gradients of 1e-6 flush to zero in e5m2, and weights
  // lose bits in e4m3). One step on the first batch measures the amaxes; its update is thrown
  // away (the initial weights, moments and step count are put back) and the run starts with
  // those scales. Opt-in until its effect on the loss curve is measured on the GPU.
  const bool calibrate_fp8 = !resume && layout.num_fp8_states() > 0 && args.Has("fp8-calibrate");
  std::vector<HostTensor> initial_params;
  if (calibrate_fp8) initial_params = init.params;

  std::unique_ptr<Trainer> trainer;
  CudaTrainer* cuda_trainer = nullptr;  // the trainer, when it runs on the GPU
  if (backend.backend == Backend::kCpu) {
    ASSIGN_OR_RETURN(trainer, ReferenceTrainer::Create(std::move(module), step_fn, layout, std::move(init.params)));
  } else {
#ifdef KILN_WITH_CUDA
    ASSIGN_OR_RETURN(std::unique_ptr<CudaTrainer> cuda,
                     CreateCudaTrainer(args, std::move(module), step_fn, layout, std::move(init.params), backend));
    const CudaExecutable::Stats& st = cuda->executable().stats();
    double compiled = 0;
    for (const auto& [phase, seconds] : st.phases) compiled += seconds;
    end_phase("");
    phases.back() = {"the rest of creating the trainer (CUDA context, uploading the state)", phases.back().second - compiled};
    cuda_trainer = cuda.get();
    trainer = std::move(cuda);
#endif
  }
  if (resume) RETURN_IF_ERROR(trainer->SetState(std::move(resume->state)));
  if (calibrate_fp8) {
    std::vector<TokenBatch> first;
    for (int64_t i = 0; i < s.accum; ++i) first.push_back(SampleBatch(data, s.seed, i, s.batch, s.seq));
    RETURN_IF_ERROR(trainer->Step(first, schedule.At(0)).status());
    TrainingState fresh = InitialTrainingState(std::move(initial_params));
    ASSIGN_OR_RETURN(fresh.fp8, trainer->Fp8States());
    RETURN_IF_ERROR(trainer->SetState(std::move(fresh)));
    std::fprintf(stderr, "kiln train: fp8: scales calibrated on the first batch (one step, its update discarded)\n");
  }

  // --eval-every: the held-out forwards are compiled at the first evaluation and kept; on the
  // GPU they read the trainer's parameter buffers in place (no copy of the state).
  std::optional<EvalScorer> held_out_scorer;
  ForwardWeights held_out_weights;
  if (length.eval_every > 0) {
    held_out_scorer.emplace(config, *split.held_out, s.seq, s.batch, s.precision, backend, kHeldOutWindows);
#ifdef KILN_WITH_CUDA
    if (cuda_trainer != nullptr) {
      for (int64_t i = 0; i < layout.num_params; ++i) {
        ASSIGN_OR_RETURN(void* address, cuda_trainer->executable().InputAddress(layout.first_param() + i));
        held_out_weights.device.push_back(address);
      }
    }
#endif
  }

  ProgressPrinter progress(steps);
  PeriodicCheckpoints periodic(args.Get("save"), length.save_every, length.keep_last);
  const double tokens_per_step = static_cast<double>(s.batch * s.seq * s.accum);
  auto start = std::chrono::steady_clock::now();
  const int64_t first_step = trainer->steps_done();
  for (int64_t step = first_step; step < steps; ++step) {
    std::vector<TokenBatch> micro_batches;
    for (int64_t i = 0; i < s.accum; ++i) {
      micro_batches.push_back(SampleBatch(data, s.seed, step * s.accum + i, s.batch, s.seq));
    }
    // The last step is the one traced: by then the kernels and the graph are warm.
    const bool profile = cuda_trainer != nullptr && step + 1 == steps && (report || args.Has("trace"));
#ifdef KILN_WITH_CUDA
    if (profile) cuda_trainer->ProfileNextStep();
#endif
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(double loss, trainer->Step(micro_batches, schedule.At(step)));
    auto t1 = std::chrono::steady_clock::now();
    if (step == first_step) {
      std::fprintf(stderr, "kiln train: time to first step: %.2f s\n", seconds_since(run_start));
      if (report) PrintPhases(phases, cuda_trainer, std::chrono::duration<double>(t1 - t0).count());
    }
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("loss is ", loss, " at step ", step + 1,
                                              "; stopping before anything is saved (try a lower --lr)"));
    }
    progress.Report(step + 1, loss, tokens_per_step / std::chrono::duration<double>(t1 - t0).count(),
                    std::chrono::duration<double>(t1 - start).count());
    if (length.eval_every > 0 && ((step + 1) % length.eval_every == 0 || step + 1 == steps)) {
      if (held_out_weights.device.empty()) {
        ASSIGN_OR_RETURN(TrainingState state, trainer->State());
        held_out_weights.host = std::move(state.params);
      }
      ASSIGN_OR_RETURN(auto scored, held_out_scorer->Score(held_out_weights));
      std::printf("eval step %lld  held-out loss %.4f  (%lld windows of %s)\n", static_cast<long long>(step + 1),
                  scored.first, static_cast<long long>(scored.second), split.held_out->name().c_str());
      std::fflush(stdout);
    }
    if (periodic.Due(step + 1, steps)) {
      ASSIGN_OR_RETURN(TrainingState state, trainer->State());
      RETURN_IF_ERROR(periodic.Save({config, std::move(state), saved_settings}));
    }
  }
#ifdef KILN_WITH_CUDA
  if (cuda_trainer != nullptr) RETURN_IF_ERROR(ReportProfile(args, *cuda_trainer, steps));
#endif
  if (report && layout.num_fp8_states() > 0) {
    const auto* fp8 = dynamic_cast<const SelectFp8GemmPass*>(compile.main_pipeline().FindPass(SelectFp8GemmPass::kName));
    ASSIGN_OR_RETURN(std::vector<HostTensor> states, trainer->Fp8States());
    std::fprintf(stderr, "%s",
                 FormatFp8Report(*step_fn, layout, fp8 ? fp8->last_decisions() : std::vector<std::string>{}, states)
                     .c_str());
  }
  if (args.Has("save")) {
    ASSIGN_OR_RETURN(TrainingState state, trainer->State());
    const int64_t saved_step = state.step;
    RETURN_IF_ERROR(SaveTrainingCheckpoint(args.Get("save"), {config, std::move(state), saved_settings}));
    std::fprintf(stderr, "kiln train: saved step %lld to %s\n", static_cast<long long>(saved_step),
                 args.Get("save").c_str());
  }
  return absl::OkStatus();
}

}  // namespace

Command TrainCommand() {
  CommandSpec spec{.name = "train",
           .usage = "MODEL [options]",
           .summary = "train a model (the default data is kiln's built-in corpus)",
           .details = "MODEL is a preset (see 'kiln models'), a Hugging Face config.json or a folder holding one.\n"
                      "--data FILE: a file ending in .bin holds little-endian uint16 tokens (nanoGPT / llm.c;\n"
                      "an llm.c header is recognised and skipped); any other file is raw text, one token per\n"
                      "byte. Batches are a function of (seed, step), so a resumed run sees the same data.\n"
                      "--steps is the total: a run resumed from step 10 with --steps 20 runs 10 more. The\n"
                      "learning rate warms up, then follows a cosine to --lr-decay-steps (default --steps):\n"
                      "a run you will resume later should pass the final horizon so its schedule matches.\n"
                      "--resume keeps the saved --batch, --seq, --accum, --seed, --precision and data (a\n"
                      "differing flag is an error; --data replaces the data); --lr, --min-lr, --warmup,\n"
                      "--lr-decay-steps, --weight-decay and --clip may be set anew, and every setting that\n"
                      "differs from the saved run's is printed. MODEL as a Hugging Face folder with\n"
                      "model.safetensors starts from those weights.",
           .min_positionals = 1,
           .max_positionals = 1,
           .flags = {
               {.name = "backend", .value_name = "B", .help = "cpu, cuda or auto", .default_value = "auto"},
               {.name = "gpus", .value_name = "N",
                .help = "data-parallel over N GPUs of this host (N > 1: not built yet, says what exists)",
                .default_value = "1"},
               {.name = "steps", .value_name = "N", .help = "total optimizer steps", .default_value = "150"},
               {.name = "batch", .value_name = "B", .help = "sequences per micro-batch", .default_value = "the preset's"},
               {.name = "seq", .value_name = "T", .help = "tokens per sequence", .default_value = "the preset's"},
               {.name = "lr", .value_name = "X",
                .help = "peak learning rate (llama-M's loss spikes at 3e-3: bench/RESULTS.md trains it at 5e-4 "
                        "with --warmup 100)",
                .default_value = "3e-3"},
               {.name = "min-lr", .value_name = "X", .help = "final learning rate", .default_value = "lr / 10"},
               {.name = "warmup", .value_name = "N", .help = "linear warmup steps", .default_value = "min(10, steps/10+1)"},
               {.name = "lr-decay-steps", .value_name = "N", .help = "cosine horizon", .default_value = "--steps"},
               {.name = "precision", .value_name = "P",
                .help = "fp32, bf16 or fp8 (bf16, with the linear layers' GEMMs in FP8: passes/fp8_policy.h)",
                .default_value = "bf16"},
               {.name = "data", .value_name = "FILE", .help = "training data (see above)", .default_value = "built-in corpus"},
               {.name = "seed", .value_name = "S", .help = "initial weights and batches", .default_value = "1337"},
               {.name = "save", .value_name = "CKPT", .help = "write a checkpoint (safetensors) at the end"},
               {.name = "save-every", .value_name = "N",
                .help = "also save every N steps, to CKPT's name + -stepN (needs --save)"},
               {.name = "keep-last", .value_name = "K", .help = "keep only the last K of --save-every's checkpoints",
                .default_value = "all"},
               {.name = "eval-every", .value_name = "N",
                .help = "every N steps and at the end, the loss on the data's last tenth, held out (the run "
                        "trains on the rest; a resume keeps the split)"},
               {.name = "resume", .value_name = "CKPT", .help = "continue from a checkpoint"},
               {.name = "report", .help = "print the passes, the time of each phase before the first step, the "
                                          "memory plan, and (GPU) where the last step's time went"},
               {.name = "trace", .value_name = "FILE.json", .help = "write the last step's launches as a Chrome trace (GPU)"},
               {.name = "fp8-calibrate",
                .help = "with --precision fp8: start from the scales one discarded step on the first batch measures, "
                        "instead of scale 1"},
               {.name = "no-cuda-graph", .help = "launch the step's kernels one by one instead of replaying a CUDA graph"},
               {.name = "no-gemm-autotune",
                .help = "keep cuBLASLt's heuristic first algorithm for every GEMM instead of timing its candidates at load"},
               {.name = "disable-pass", .value_name = "NAME,...",
                .help = "skip these passes (names as `kiln compile --help` lists them): an ablation"},
               {.name = "enable-pass", .value_name = "NAME,...",
                .help = "run these passes, which are off by default (`kiln compile --help` marks them)"},
           }};
  // The flags that shape the step's graph, shared with compile and check, listed after --seq.
  const std::vector<FlagSpec> step_flags = TrainingStepFlags();
  auto after_seq = std::find_if(spec.flags.begin(), spec.flags.end(), [](const FlagSpec& f) { return f.name == "seq"; });
  spec.flags.insert(after_seq + 1, step_flags.begin(), step_flags.end());
  return {std::move(spec), RunTrain};
}

}  // namespace kiln::cli
