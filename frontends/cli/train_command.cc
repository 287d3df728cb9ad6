// kiln train: train a model on the built-in corpus or a file, with checkpoints and resume.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "codegen/capabilities.h"
#include "frontends/cli/backend_flag.h"
#include "frontends/cli/commands.h"
#include "frontends/cli/model_source.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "frontends/cuda_trainer.h"
#include "frontends/trainer.h"
#include "frontends/training_checkpoint.h"
#include "frontends/weight_init.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "passes/fusion.h"
#include "passes/training_compile.h"
#include "runtime/step_profile.h"
#include "runtime/training/dataset.h"
#include "runtime/training/lr_schedule.h"

namespace kiln {
class CudaTrainer;  // frontends/cuda_trainer.h, in builds with CUDA
}  // namespace kiln

namespace kiln::cli {
namespace {

// The flags a run is made of. A checkpoint stores them; a resumed run takes them from it, so
// that it continues exactly as an uninterrupted run would have.
const char* const kRunSettingFlags[] = {"batch", "seq",     "accum",          "seed",         "precision", "lr",
                                        "min-lr", "warmup", "lr-decay-steps", "weight-decay", "clip"};

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

// Settings by flag name: from the checkpoint when resuming (a flag that disagrees is an
// error), else from the flags, else the defaults.
absl::StatusOr<std::map<std::string, std::string>> ResolveRunSettings(const ParsedArgs& args,
                                                                      const ModelConfig& config, int64_t steps,
                                                                      const TrainingCheckpoint* resume) {
  std::map<std::string, std::string> v;
  if (resume) {
    for (const char* flag : kRunSettingFlags) {
      auto it = resume->settings.find(flag);
      if (it == resume->settings.end()) {
        return absl::InvalidArgumentError(absl::StrCat(args.Get("resume"), ": no '", flag, "' setting saved"));
      }
      if (args.Has(flag) && !SameSetting(args.Get(flag), it->second)) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", args.Get(flag), " differs from the checkpoint's ",
                                                       it->second, " (", args.Get("resume"),
                                                       "); drop the flag to resume as saved"));
      }
      v[flag] = it->second;
    }
    return v;
  }
  auto set = [&](const char* flag, std::string fallback) { v[flag] = args.Has(flag) ? args.Get(flag) : fallback; };
  set("batch", absl::StrCat(config.batch));
  set("seq", absl::StrCat(config.seq_len));
  set("accum", "1");
  set("seed", "1337");
  set("precision", "bf16");
  set("lr", "0.003");
  double lr = 0;
  if (!absl::SimpleAtod(v["lr"], &lr)) return absl::InvalidArgumentError(absl::StrCat("--lr expects a number, got '", v["lr"], "'"));
  set("min-lr", ExactText(LrSchedule::Default(lr, steps).min_lr));
  set("lr-decay-steps", absl::StrCat(steps));
  int64_t horizon = 0;
  if (!absl::SimpleAtoi(v["lr-decay-steps"], &horizon)) {
    return absl::InvalidArgumentError(absl::StrCat("--lr-decay-steps expects an integer, got '", v["lr-decay-steps"], "'"));
  }
  set("warmup", absl::StrCat(LrSchedule::Default(lr, horizon).warmup_steps));
  set("weight-decay", "0.1");
  set("clip", "1.0");
  return v;
}

absl::StatusOr<RunSettings> ParseRunSettings(const std::map<std::string, std::string>& v) {
  RunSettings s;
  auto integer = [&](const char* flag, int64_t& out) -> absl::Status {
    if (!absl::SimpleAtoi(v.at(flag), &out) || out < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " expects a non-negative integer, got '", v.at(flag), "'"));
    }
    return absl::OkStatus();
  };
  auto number = [&](const char* flag, double& out) -> absl::Status {
    if (!absl::SimpleAtod(v.at(flag), &out) || !(out >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " expects a non-negative number, got '", v.at(flag), "'"));
    }
    return absl::OkStatus();
  };
  int64_t seed = 0;
  RETURN_IF_ERROR(integer("batch", s.batch));
  RETURN_IF_ERROR(integer("seq", s.seq));
  RETURN_IF_ERROR(integer("accum", s.accum));
  RETURN_IF_ERROR(integer("seed", seed));
  RETURN_IF_ERROR(integer("warmup", s.warmup));
  RETURN_IF_ERROR(integer("lr-decay-steps", s.lr_decay_steps));
  RETURN_IF_ERROR(number("lr", s.lr));
  RETURN_IF_ERROR(number("min-lr", s.min_lr));
  RETURN_IF_ERROR(number("weight-decay", s.weight_decay));
  RETURN_IF_ERROR(number("clip", s.clip));
  s.seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(s.precision, ParsePrecision(v.at("precision")));
  if (s.batch < 1 || s.seq < 1 || s.accum < 1) return absl::InvalidArgumentError("--batch, --seq and --accum must be >= 1");
  return s;
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
    std::fprintf(stderr, "kiln train: GPU time of step %lld by kernel group (CUDA events, launched one by one)\n%s",
                 static_cast<long long>(steps), FormatGroupTable(timings, 15).c_str());
    std::fprintf(stderr, "kiln train: memory plan: %s\nlargest buffers:\n%s", exe.buffer_plan().Summary().c_str(),
                 exe.buffer_plan().LargestBuffers(exe.function(), 10).c_str());
    std::fprintf(stderr, "kiln train: CUDA graph: %lld nodes\n", static_cast<long long>(exe.stats().graph_nodes));
  }
  return absl::OkStatus();
}
#endif

absl::Status RunTrain(const ParsedArgs& args) {
  const auto run_start = std::chrono::steady_clock::now();
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const bool report = args.Has("report");
  ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(args.positionals()[0]));
  ASSIGN_OR_RETURN(ResolvedBackend backend, ResolveBackend(args.Get("backend", "auto")));
  ASSIGN_OR_RETURN(int64_t steps, args.GetInt("steps", 150));
  if (steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  std::optional<TrainingCheckpoint> resume;
  if (args.Has("resume")) {
    ASSIGN_OR_RETURN(resume, LoadTrainingCheckpoint(args.Get("resume")));
    if (HuggingFaceConfigJson(resume->config) != HuggingFaceConfigJson(config)) {
      return absl::InvalidArgumentError(absl::StrCat(args.Get("resume"), " holds a different model than '",
                                                     args.positionals()[0], "'"));
    }
    if (resume->state.step >= steps) {
      return absl::InvalidArgumentError(absl::StrCat(args.Get("resume"), " is at step ", resume->state.step,
                                                     "; --steps ", steps, " is the total to reach, so nothing is left"));
    }
  }
  ASSIGN_OR_RETURN(auto settings, ResolveRunSettings(args, config, steps, resume ? &*resume : nullptr));
  ASSIGN_OR_RETURN(RunSettings s, ParseRunSettings(settings));
  const LrSchedule schedule{.peak_lr = s.lr, .min_lr = s.min_lr, .warmup_steps = s.warmup,
                            .total_steps = s.lr_decay_steps};

  TokenDataset data = TokenDataset::Default();
  if (args.Has("data")) {
    ASSIGN_OR_RETURN(data, TokenDataset::FromFile(args.Get("data")));
  }
  RETURN_IF_ERROR(data.CheckFits(config.vocab_size, s.seq));

  std::vector<std::pair<std::string, double>> phases;  // for --report
  auto phase_start = std::chrono::steady_clock::now();
  auto end_phase = [&](std::string name) {
    phases.emplace_back(std::move(name), seconds_since(phase_start));
    phase_start = std::chrono::steady_clock::now();
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Module> module,
                   BuildLlamaModule(config, {.batch = s.batch, .seq_len = s.seq, .precision = s.precision}));
  CompileOptions compile_options;
  compile_options.precision = s.precision;
#ifdef KILN_WITH_CUDA
  compile_options.capabilities = &CodegenCapabilities();
#endif
  TrainingStepOptions step_options;
  step_options.accum_steps = s.accum;
  step_options.adamw.weight_decay = s.weight_decay;
  step_options.adamw.clip_norm = s.clip;
  // The sequence `kiln compile --training` and `kiln check --training` run too (`kiln check`
  // proves the pipeline changes no value); the step keeps its name and signature.
  ASSIGN_OR_RETURN(TrainingCompile compile, TrainingCompile::Create(step_options, compile_options));
  RETURN_IF_ERROR(compile.BuildStep(*module));
  end_phase("model build + autodiff");
  RETURN_IF_ERROR(compile.RunMainPipeline(*module));
  end_phase("pass pipeline");
  const Function* step_fn = compile.step();
  const TrainingStepLayout layout = compile.layout();
  if (report) {
    std::fprintf(stderr, "kiln train: forward pipeline (before autodiff)\n%s\n",
                 compile.forward_report().ToString().c_str());
    std::fprintf(stderr, "kiln train: pass pipeline\n%s\nkiln train: fusion (`kiln compile --report` lists each decision)\n%s\n",
                 compile.main_report().ToString().c_str(), FormatFusionReport(*step_fn, false).c_str());
  }

  std::vector<HostTensor> init = resume ? resume->state.params : InitLlamaWeights(config, s.seed);
  end_phase(resume ? "checkpoint weights" : "initial weights");
  std::unique_ptr<Trainer> trainer;
  CudaTrainer* cuda_trainer = nullptr;  // the trainer, when it runs on the GPU
  if (backend.backend == Backend::kCpu) {
    for (const char* flag : {"trace", "no-cuda-graph"}) {
      if (args.Has(flag)) return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs --backend cuda"));
    }
    ASSIGN_OR_RETURN(trainer, ReferenceTrainer::Create(std::move(module), step_fn, layout, std::move(init)));
  } else {
#ifdef KILN_WITH_CUDA
    auto compile_start = std::chrono::steady_clock::now();
    CudaExecutableOptions exe_options;
    exe_options.cuda_graph = !args.Has("no-cuda-graph");
    ASSIGN_OR_RETURN(std::unique_ptr<CudaTrainer> cuda, CudaTrainer::Create(std::move(module), step_fn, layout,
                                                                            std::move(init), *backend.device,
                                                                            exe_options));
    const CudaExecutable::Stats& st = cuda->executable().stats();
    std::fprintf(stderr,
                 "kiln train: compiled the step in %.1fs: %lld kernel launches (%lld distinct, %lld from the cache), "
                 "%lld GEMMs, arena %.2f GB\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - compile_start).count(),
                 static_cast<long long>(st.kernels), static_cast<long long>(st.distinct_kernels),
                 static_cast<long long>(st.cache_hits), static_cast<long long>(st.gemms), st.arena_bytes / 1e9);
    // Everything kiln allocates on the device is the arena (torch's max_memory_allocated
    // counterpart; the CUDA context and cuBLASLt handles are outside both).
    std::fprintf(stderr, "kiln train: peak device memory: %lld bytes\n", static_cast<long long>(st.arena_bytes));
    double compiled = 0;
    for (const auto& [phase, seconds] : st.phases) compiled += seconds;
    end_phase("");
    phases.back() = {"the rest of creating the trainer (CUDA context, uploading the state)", phases.back().second - compiled};
    cuda_trainer = cuda.get();
    trainer = std::move(cuda);
#endif
  }
  if (resume) RETURN_IF_ERROR(trainer->SetState(std::move(resume->state)));

  std::fprintf(stderr, "kiln train: %s (%.2fM params), %s, batch %lld x seq %lld x accum %lld, data: %s, backend %s\n",
               config.name.c_str(), ParameterCount(config) / 1e6, std::string(PrecisionName(s.precision)).c_str(),
               static_cast<long long>(s.batch), static_cast<long long>(s.seq), static_cast<long long>(s.accum),
               data.name().c_str(), std::string(trainer->backend()).c_str());
  ProgressPrinter progress(steps);
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
  }
#ifdef KILN_WITH_CUDA
  if (cuda_trainer != nullptr) RETURN_IF_ERROR(ReportProfile(args, *cuda_trainer, steps));
#endif
  if (args.Has("save")) {
    ASSIGN_OR_RETURN(TrainingState state, trainer->State());
    RETURN_IF_ERROR(SaveTrainingCheckpoint(args.Get("save"), {config, state, settings}));
    std::fprintf(stderr, "kiln train: saved step %lld to %s\n", static_cast<long long>(state.step),
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
                      "a run you will resume later should pass the final horizon so its schedule matches.",
           .min_positionals = 1,
           .max_positionals = 1,
           .flags = {
               {.name = "backend", .value_name = "B", .help = "cpu, cuda or auto", .default_value = "auto"},
               {.name = "steps", .value_name = "N", .help = "total optimizer steps", .default_value = "150"},
               {.name = "batch", .value_name = "B", .help = "sequences per micro-batch", .default_value = "the preset's"},
               {.name = "seq", .value_name = "T", .help = "tokens per sequence", .default_value = "the preset's"},
               {.name = "lr", .value_name = "X", .help = "peak learning rate", .default_value = "3e-3"},
               {.name = "min-lr", .value_name = "X", .help = "final learning rate", .default_value = "lr / 10"},
               {.name = "warmup", .value_name = "N", .help = "linear warmup steps", .default_value = "min(10, steps/10+1)"},
               {.name = "lr-decay-steps", .value_name = "N", .help = "cosine horizon", .default_value = "--steps"},
               {.name = "precision", .value_name = "P", .help = "fp32 or bf16", .default_value = "bf16"},
               {.name = "data", .value_name = "FILE", .help = "training data (see above)", .default_value = "built-in corpus"},
               {.name = "seed", .value_name = "S", .help = "initial weights and batches", .default_value = "1337"},
               {.name = "save", .value_name = "CKPT", .help = "write a checkpoint (safetensors) at the end"},
               {.name = "resume", .value_name = "CKPT", .help = "continue from a checkpoint"},
               {.name = "report", .help = "print the passes, the time of each phase before the first step, the "
                                          "memory plan, and (GPU) where the last step's time went"},
               {.name = "trace", .value_name = "FILE.json", .help = "write the last step's launches as a Chrome trace (GPU)"},
               {.name = "no-cuda-graph", .help = "launch the step's kernels one by one instead of replaying a CUDA graph"},
           }};
  // The flags that shape the step's graph, shared with compile and check, listed after --seq.
  const std::vector<FlagSpec> step_flags = TrainingStepFlags();
  auto after_seq = std::find_if(spec.flags.begin(), spec.flags.end(), [](const FlagSpec& f) { return f.name == "seq"; });
  spec.flags.insert(after_seq + 1, step_flags.begin(), step_flags.end());
  return {std::move(spec), RunTrain};
}

}  // namespace kiln::cli
