// kiln generate: text (or tokens) from a model through the paged-KV inference functions
// (frontends/generator.h), on the CPU reference backend or a GPU.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "frontends/cli/backend_flag.h"
#include "frontends/cli/commands.h"
#include "frontends/generator.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#include "frontends/training_checkpoint.h"
#include "frontends/weight_init.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "runtime/memory_estimate.h"

namespace kiln::cli {
namespace {

using inference::TokenId;

// The presets read and write bytes: token = byte value.
bool IsByteLevel(const ModelConfig& config) { return config.vocab_size == 256; }

struct LoadedWeights {
  ModelConfig config;
  std::vector<HostTensor> weights;
  std::string source;
};

absl::StatusOr<LoadedWeights> LoadWeights(const ParsedArgs& args) {
  const std::string& model = args.positionals()[0];
  ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(model));
  if (args.Has("weights")) {
    ASSIGN_OR_RETURN(TrainingCheckpoint ckpt, LoadTrainingCheckpoint(args.Get("weights")));
    if (HuggingFaceConfigJson(ckpt.config) != HuggingFaceConfigJson(config)) {
      return absl::InvalidArgumentError(
          absl::StrCat(args.Get("weights"), " holds weights for a different model than '", model, "'"));
    }
    return LoadedWeights{config, std::move(ckpt.state.params), absl::StrCat("checkpoint ", args.Get("weights"))};
  }
  std::error_code ec;
  if (std::filesystem::is_directory(model, ec)) {
    ASSIGN_OR_RETURN(HuggingFaceModel hf, LoadHuggingFaceModel(model));
    return LoadedWeights{hf.config, std::move(hf.weights), absl::StrCat(model, "/model.safetensors")};
  }
  ASSIGN_OR_RETURN(int64_t seed, args.GetInt("init-seed", 1337));
  return LoadedWeights{config, InitLlamaWeights(config, static_cast<uint64_t>(seed)),
                       absl::StrCat("random init (seed ", seed, "; pass --weights CKPT for trained ones)")};
}

// "1048576", "512K", "64M", "2G" (binary units): bytes, > 0.
absl::StatusOr<int64_t> ParseByteCount(absl::string_view text, absl::string_view what) {
  int64_t unit = 1;
  absl::string_view digits = text;
  if (!digits.empty()) {
    switch (std::toupper(static_cast<unsigned char>(digits.back()))) {
      case 'K': unit = int64_t{1} << 10; break;
      case 'M': unit = int64_t{1} << 20; break;
      case 'G': unit = int64_t{1} << 30; break;
      default: break;
    }
    if (unit > 1) digits.remove_suffix(1);
  }
  int64_t count = 0;
  if (!absl::SimpleAtoi(digits, &count) || count <= 0 || count > std::numeric_limits<int64_t>::max() / unit) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "': expected a positive byte count such as ",
                                                   "1048576, 512K, 64M or 2G"));
  }
  return count * unit;
}

absl::StatusOr<std::vector<TokenId>> ParseTokenList(absl::string_view text, absl::string_view what) {
  std::vector<TokenId> tokens;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    int32_t t = 0;
    if (!absl::SimpleAtoi(part, &t)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", part, "' is not a token id (expected e.g. 1,2,3)"));
    }
    tokens.push_back(t);
  }
  return tokens;
}

std::vector<TokenId> Bytes(absl::string_view text) {
  std::vector<TokenId> tokens;
  for (unsigned char c : text) tokens.push_back(c);
  return tokens;
}

// One request of the command line: its prompt, and its own output budget when a .jsonl
// --prompts line gives one (else --max-new-tokens).
struct PromptRequest {
  std::vector<TokenId> tokens;
  std::optional<int64_t> max_new_tokens;
};

// A .jsonl --prompts line: {"prompt": "text"} (byte-level presets) or {"tokens": [1, 2, 3]},
// and optionally "max_new_tokens": N. `where` names the line in errors.
absl::StatusOr<PromptRequest> ParseJsonPrompt(const std::string& line, const ModelConfig& config,
                                              const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object (expected e.g. {\"tokens\": [1, 2], ",
                                                   "\"max_new_tokens\": 16})"));
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "prompt" && key != "tokens" && key != "max_new_tokens") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field \"", key,
                                                     "\" (fields: prompt, tokens, max_new_tokens)"));
    }
  }
  PromptRequest r;
  if (j.contains("prompt") == j.contains("tokens")) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": give exactly one of \"prompt\" (text) or \"tokens\" (ids)"));
  }
  if (j.contains("prompt")) {
    if (!j["prompt"].is_string()) return absl::InvalidArgumentError(absl::StrCat(where, ": \"prompt\" must be a string"));
    if (!IsByteLevel(config)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"prompt\" text is for the byte-level presets; model '",
                                                     config.name, "' takes \"tokens\" (kiln has no tokenizer)"));
    }
    r.tokens = Bytes(j["prompt"].get<std::string>());
  } else {
    if (!j["tokens"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"tokens\" must be an array of token ids"));
    }
    for (const nlohmann::json& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < std::numeric_limits<TokenId>::min() ||
          t.get<int64_t>() > std::numeric_limits<TokenId>::max()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": \"tokens\" holds ", t.dump(), ", not a token id"));
      }
      r.tokens.push_back(static_cast<TokenId>(t.get<int64_t>()));
    }
  }
  if (j.contains("max_new_tokens")) {
    if (!j["max_new_tokens"].is_number_integer() || j["max_new_tokens"].get<int64_t>() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"max_new_tokens\" must be an integer >= 1, got ", j["max_new_tokens"].dump()));
    }
    r.max_new_tokens = j["max_new_tokens"].get<int64_t>();
  }
  return r;
}

// One prompt per request: --prompt TEXT, --prompt-tokens IDS, or the lines of --prompts FILE
// (text for the byte-level presets, comma-separated ids otherwise; a FILE ending in .jsonl
// holds one JSON object a line, ParseJsonPrompt's). Empty prompts are kept: the scheduler
// rejects them with the request's id.
absl::StatusOr<std::vector<PromptRequest>> ReadPrompts(const ParsedArgs& args, const ModelConfig& config) {
  const int given = args.Has("prompt") + args.Has("prompt-tokens") + args.Has("prompts");
  if (given != 1) {
    return absl::InvalidArgumentError("give exactly one of --prompt TEXT, --prompt-tokens IDS or --prompts FILE");
  }
  if (args.Has("prompt-tokens")) {
    ASSIGN_OR_RETURN(std::vector<TokenId> tokens, ParseTokenList(args.Get("prompt-tokens"), "--prompt-tokens"));
    return std::vector<PromptRequest>{{tokens, std::nullopt}};
  }
  if (!IsByteLevel(config) && args.Has("prompt")) {
    return absl::InvalidArgumentError(absl::StrCat("--prompt takes text only for the byte-level presets (vocabulary of "
                                                   "256); model '", config.name, "' has ", config.vocab_size,
                                                   " tokens and kiln has no tokenizer: give --prompt-tokens 1,2,3"));
  }
  if (args.Has("prompt")) return std::vector<PromptRequest>{{Bytes(args.Get("prompt")), std::nullopt}};
  const std::string& path = args.Get("prompts");
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--prompts: cannot read ", path));
  const bool jsonl = absl::EndsWith(path, ".jsonl");
  std::vector<PromptRequest> prompts;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (jsonl) {
      if (absl::StripAsciiWhitespace(line).empty()) continue;  // JSON Lines allows blank lines
      ASSIGN_OR_RETURN(PromptRequest r, ParseJsonPrompt(line, config, absl::StrCat(path, " line ", line_number)));
      prompts.push_back(std::move(r));
    } else if (IsByteLevel(config)) {
      prompts.push_back({Bytes(line), std::nullopt});
    } else if (line.empty()) {
      prompts.emplace_back();
    } else {
      ASSIGN_OR_RETURN(std::vector<TokenId> tokens,
                       ParseTokenList(line, absl::StrCat("--prompts line ", prompts.size() + 1)));
      prompts.push_back({std::move(tokens), std::nullopt});
    }
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat("--prompts: ", args.Get("prompts"), " is empty"));
  return prompts;
}

// A token as printed: its byte for the presets (escaped unless printable; a newline kept
// only when `raw_newline`), else its id.
std::string Show(TokenId t, bool bytes, bool raw_newline = true) {
  if (!bytes) return absl::StrCat(" ", t);
  if (t == '\n') return raw_newline ? "\n" : "\\n";
  if (t == '\\') return "\\\\";
  if (t >= 32 && t < 127) return std::string(1, static_cast<char>(t));
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(t) & 0xffu);
  return buf;
}

std::string ShowAll(absl::Span<const TokenId> tokens, bool bytes, bool raw_newline = true) {
  std::string out;
  for (TokenId t : tokens) out += Show(t, bytes, raw_newline);
  return out;
}

std::string Rate(int64_t tokens, double seconds) {
  return seconds > 0 ? absl::StrFormat("%.0f tok/s", tokens / seconds) : std::string("- tok/s");
}

absl::Status RunGenerate(const ParsedArgs& args) {
  ASSIGN_OR_RETURN(ResolvedBackend backend, ResolveBackend(args.Get("backend", "cpu")));
  ASSIGN_OR_RETURN(int64_t max_new, args.GetInt("max-new-tokens", 32));
  ASSIGN_OR_RETURN(double temperature, args.GetDouble("temperature", 1.0));
  ASSIGN_OR_RETURN(int64_t top_k, args.GetInt("top-k", 0));
  ASSIGN_OR_RETURN(double top_p, args.GetDouble("top-p", 1.0));
  ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 0));
  ASSIGN_OR_RETURN(Precision precision, ParsePrecision(args.Get("precision", "bf16")));
  if (precision == Precision::kFp8) {
    return absl::InvalidArgumentError(
        "--precision fp8 is a training policy (FP8 GEMMs in the training step); inference runs fp32 or bf16");
  }
  GeneratorOptions options{.precision = precision};
#ifdef KILN_WITH_CUDA
  options.device = backend.device.get();
#endif
  ASSIGN_OR_RETURN(options.block_size, args.GetInt("block-size", 16));
  ASSIGN_OR_RETURN(options.num_blocks, args.GetInt("kv-blocks", 0));
  ASSIGN_OR_RETURN(options.max_running, args.GetInt("max-running", 8));
  ASSIGN_OR_RETURN(options.max_context, args.GetInt("context", 0));
  const bool report = args.Has("report");
  const bool trace = args.Has("trace");
  if (trace) RETURN_IF_ERROR(CheckOutputPath(args.Get("trace"), "--trace"));
  options.enable_prefix_caching = !args.Has("no-prefix-cache");
  ASSIGN_OR_RETURN(options.max_prefill_call_tokens, args.GetInt("prefill-call-tokens", options.max_prefill_call_tokens));
  if (options.max_prefill_call_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefill-call-tokens ", options.max_prefill_call_tokens, " must be >= 1"));
  }
  if (args.Has("no-fresh-prefill")) options.fresh_prefill_min_tokens = 0;
  if (args.Has("no-decode-lookahead")) options.decode_lookahead = false;
  if (args.Has("disable-pass")) options.disabled_passes = absl::StrSplit(args.Get("disable-pass"), ',', absl::SkipEmpty());
  if (args.Has("enable-pass")) options.enabled_passes = absl::StrSplit(args.Get("enable-pass"), ',', absl::SkipEmpty());
  // A decode call well past the first (the batch has filled) but before the shortest
  // request can end.
  options.time_decode_calls = report;
  if (report || trace) options.profile_decode_call = std::max<int64_t>(0, std::min<int64_t>(16, max_new - 2));
  // And the first prefill call (the first step's prompts, or the prompt).
  if (report) options.profile_prefill_call = 0;
  if (max_new < 1) return absl::InvalidArgumentError(absl::StrCat("--max-new-tokens ", max_new, " must be >= 1"));
  if (seed < 0) return absl::InvalidArgumentError(absl::StrCat("--seed ", seed, " must be >= 0"));
  inference::SamplingParams sampling{.temperature = temperature, .top_k = top_k, .top_p = top_p,
                                     .seed = static_cast<uint64_t>(seed)};
  RETURN_IF_ERROR(inference::ValidateSamplingParams(sampling));

  ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(args.positionals()[0]));
  ASSIGN_OR_RETURN(std::vector<PromptRequest> prompts, ReadPrompts(args, config));
  const bool bytes = IsByteLevel(config);
  // A single request's problems are the command's; with --prompts a bad line is reported
  // and the others still run.
  const bool single = prompts.size() == 1;
  std::string pool_from;  // with --kv-memory: the pool's bytes and where they came from
  if (args.Has("kv-memory")) {
    if (args.Has("kv-blocks")) return absl::InvalidArgumentError("give --kv-memory or --kv-blocks, not both");
    if (options.block_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--block-size ", options.block_size, " must be >= 1"));
    }
    const std::string text = args.Get("kv-memory");
    int64_t budget = 0;
    std::string from;  // how the budget was arrived at, for the pool line
    if (absl::EndsWith(text, "%")) {
      // A share of the GPU's free memory, as it is before the weights go up, less the
      // weights; what the share leaves free is for the executables' arenas.
      double percent = 0;
      if (!absl::SimpleAtod(absl::string_view(text).substr(0, text.size() - 1), &percent) || !(percent > 0) ||
          percent > 100) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kv-memory ", text, ": a share of the free GPU memory is a percentage in (0, 100], e.g. 90%"));
      }
#ifdef KILN_WITH_CUDA
      if (backend.device == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kv-memory ", text, " sizes the pool from the free GPU memory: it needs --backend cuda"));
      }
      const int64_t free = backend.device->free_bytes();
      int64_t weight_bytes = 0;
      for (const WeightSpec& w : LlamaWeights(config)) weight_bytes += InferenceWeightType(w, precision).num_bytes();
      budget = static_cast<int64_t>(static_cast<double>(free) * percent / 100.0) - weight_bytes;
      from = absl::StrCat(": ", text, " of ", FormatBytes(free), " free, less ", FormatBytes(weight_bytes), " of weights");
      if (budget <= 0) {
        return absl::ResourceExhaustedError(absl::StrCat("--kv-memory ", text, from, ", leaves nothing for the KV pool"));
      }
#else
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-memory ", text, " sizes the pool from the free GPU memory: this kiln was built without CUDA"));
#endif
    } else {
      ASSIGN_OR_RETURN(budget, ParseByteCount(text, "--kv-memory"));
    }
    // K and V of every layer: 2 x L x KV x BS x Dh elements of the pool's dtype a block.
    const PagedKvLayout one_block{.num_blocks = 1, .block_size = options.block_size, .max_blocks_per_sequence = 1};
    const int64_t block_bytes = 2 * KvPoolType(config, one_block, precision).num_bytes();
    options.num_blocks = budget / block_bytes;
    if (options.num_blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-memory ", text, from, " holds no KV block: one block of ",
                                                     options.block_size, " tokens takes ", block_bytes, " bytes for ",
                                                     args.positionals()[0], " (K and V of ", config.n_layers,
                                                     " layers)"));
    }
    pool_from = absl::StrCat(" (", FormatBytes(options.num_blocks * block_bytes), from, ")");
  }
  if (options.num_blocks == 0 && options.block_size >= 1) {
    // Default: blocks for every request at once (they are known up front), no more than
    // max_running full contexts.
    const int64_t context = options.max_context > 0     ? options.max_context
                            : config.max_positions > 0 ? config.max_positions
                                                       : config.seq_len;
    const int64_t per_sequence = (context + options.block_size - 1) / options.block_size;
    int64_t needed = 0;
    for (const PromptRequest& p : prompts) {
      const int64_t tokens =
          std::min<int64_t>(static_cast<int64_t>(p.tokens.size()) + p.max_new_tokens.value_or(max_new) - 1, context);
      needed += std::max<int64_t>(1, (tokens + options.block_size - 1) / options.block_size);
    }
    options.num_blocks = std::min(needed, std::max<int64_t>(1, options.max_running) * per_sequence);
  }
  if (options.num_blocks > 0 && backend.backend == Backend::kCpu) {
    // The pools as the reference backend holds them (a double per value, K and V, and the
    // copy each call makes), with the weights as read and as bound.
    const double pool_values = 2.0 * static_cast<double>(config.n_layers) * static_cast<double>(options.num_blocks) *
                               static_cast<double>(config.n_kv_heads * options.block_size * config.head_dim);
    RETURN_IF_ERROR(CheckFitsHostMemory(
        SaturatingSum({HostTensorBytes(3.0 * pool_values), HostTensorBytes(2.0 * ParameterCount(config))}),
        absl::StrCat("generating with ", args.positionals()[0], " and a KV pool of ", options.num_blocks, " blocks"),
        "the KV pools (K and V, as passed in and as returned) and the weights, on the reference backend"));
  }
  ASSIGN_OR_RETURN(LoadedWeights loaded, LoadWeights(args));
  ASSIGN_OR_RETURN(std::unique_ptr<Generator> generator,
                   Generator::Create(loaded.config, std::move(loaded.weights), options));
  const int64_t num_blocks = generator->layout().num_blocks;
  std::fprintf(stderr, "kiln generate: %s, %s, weights: %s, backend %s, KV pool of %lld block%s of %lld tokens%s\n",
               loaded.config.name.c_str(), std::string(PrecisionName(precision)).c_str(), loaded.source.c_str(),
               backend.backend == Backend::kCpu ? "cpu (reference)" : "cuda",
               static_cast<long long>(num_blocks), num_blocks == 1 ? "" : "s",
               static_cast<long long>(generator->layout().block_size), pool_from.c_str());
  int64_t rejected = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::Status st = generator->Submit({.id = static_cast<int64_t>(i), .prompt = prompts[i].tokens,
                                         .max_new_tokens = prompts[i].max_new_tokens.value_or(max_new),
                                         .sampling = sampling});
    if (st.ok()) continue;
    if (single) return st;
    std::fprintf(stderr, "kiln generate: %s (line %zu skipped)\n", std::string(st.message()).c_str(), i + 1);
    ++rejected;
  }
  if (single) std::printf("%s", ShowAll(prompts[0].tokens, bytes).c_str());
  std::fflush(stdout);
  const auto run_start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::vector<inference::FinishedRequest> finished,
                   generator->Run([&](inference::RequestId, TokenId token) {
                     if (!single) return;
                     std::printf("%s", Show(token, bytes).c_str());
                     std::fflush(stdout);
                   }));
  const double run_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (single) {
    std::printf("\n");
  } else {
    std::sort(finished.begin(), finished.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    for (const inference::FinishedRequest& f : finished) {
      std::printf("[%lld] %s%s\n", static_cast<long long>(f.id), ShowAll(prompts[f.id].tokens, bytes, false).c_str(),
                  ShowAll(f.output, bytes, false).c_str());
    }
  }
  std::fflush(stdout);  // the text, then the figures
  const GenerationStats& s = generator->stats();
  std::fprintf(stderr,
               "kiln generate: prefill %lld tokens in %.3f s (%s, %lld from the prefix cache), decode %lld tokens in "
               "%.3f s (%s; %lld decode steps, %.3f ms each), %lld steps; compiling %lld functions took %.3f s\n",
               static_cast<long long>(s.prefill_tokens), s.prefill_seconds, Rate(s.prefill_tokens, s.prefill_seconds).c_str(),
               static_cast<long long>(s.cached_tokens), static_cast<long long>(s.decode_tokens), s.decode_seconds,
               Rate(s.decode_tokens, s.decode_seconds).c_str(), static_cast<long long>(s.decode_steps),
               s.decode_steps > 0 ? 1e3 * s.decode_seconds / static_cast<double>(s.decode_steps) : 0.0,
               static_cast<long long>(s.steps),
               static_cast<long long>(s.functions_compiled), s.compile_seconds);
  if (s.prefill_calls > 0) {
    std::fprintf(stderr, "kiln generate: prefill calls: %lld (%lld of @fresh_prefill)\n",
                 static_cast<long long>(s.prefill_calls), static_cast<long long>(s.fresh_prefill_calls));
  }
  if (s.decode_steps > 0) {
    const DecodeCallTimes calls = SummarizeDecodeCalls(s);
    std::fprintf(stderr, "kiln generate: decode calls: median %.3f ms, min %.3f, max %.3f (%lld calls)%s\n",
                 calls.median_ms, calls.min_ms, calls.max_ms, static_cast<long long>(s.decode_steps),
                 calls.gpu_median_ms > 0
                     ? absl::StrFormat("; on the GPU: median %.3f ms from the run's start on the stream to its end",
                                       calls.gpu_median_ms)
                           .c_str()
                     : "");
    if (s.lookahead_started > 0) {
      std::fprintf(stderr, "kiln generate: decode lookahead: %lld of %lld steps started ahead came as assumed\n",
                   static_cast<long long>(s.lookahead_used), static_cast<long long>(s.lookahead_started));
    }
  }
  // The workload as a whole: every token out over the run's wall time (the scheduler, the
  // uploads and the host's work included, the compiles not), and how much of the prompts the
  // prefix cache served.
  int64_t generated = 0;
  for (const inference::FinishedRequest& f : finished) generated += static_cast<int64_t>(f.output.size());
  const int64_t prompt_tokens = s.prefill_tokens + s.cached_tokens;
  const double serving_seconds = std::max(0.0, run_seconds - s.compile_seconds);
  std::fprintf(stderr,
               "kiln generate: %zu request%s, %lld prompt tokens (%lld from the prefix cache: %.1f%%), %lld new "
               "tokens in %.3f s: %s new%s\n",
               finished.size(), finished.size() == 1 ? "" : "s", static_cast<long long>(prompt_tokens),
               static_cast<long long>(s.cached_tokens),
               prompt_tokens > 0 ? 100.0 * static_cast<double>(s.cached_tokens) / static_cast<double>(prompt_tokens) : 0.0,
               static_cast<long long>(generated), serving_seconds, Rate(generated, serving_seconds).c_str(),
               options.enable_prefix_caching ? "" : " (--no-prefix-cache)");
  if ((report || trace) && generator->decode_profile().empty()) {
    std::fprintf(stderr, "kiln generate: --%s: no decode call was profiled (%s)\n", report ? "report" : "trace",
                 backend.backend == Backend::kCpu ? "the CPU backend has no launches to time"
                                                  : "fewer decode calls than the profiled one");
  } else if (trace) {
    const std::vector<StepTiming>& timings = generator->decode_profile();
    RETURN_IF_ERROR(WriteFileAtomically(
        args.Get("trace"), ChromeTraceJson(timings, absl::StrCat("kiln generate, decode call ", options.profile_decode_call,
                                                                 " (batch bucket ", generator->decode_profile_bucket(), ")"))));
    std::fprintf(stderr, "kiln generate: wrote decode call %lld's %zu launches to %s (open it in ui.perfetto.dev)\n",
                 static_cast<long long>(options.profile_decode_call), timings.size(), args.Get("trace").c_str());
  }
  if (report && !generator->decode_profile().empty()) {
    const std::vector<StepTiming>& timings = generator->decode_profile();
    double total_us = 0;
    for (const StepTiming& t : timings) total_us += t.exposed_us;
    std::fprintf(stderr,
                 "kiln generate: GPU time of decode call %lld (batch bucket %lld) by kernel group, %zu launches, "
                 "%.3f ms %s\n%s",
                 static_cast<long long>(options.profile_decode_call),
                 static_cast<long long>(generator->decode_profile_bucket()), timings.size(), total_us / 1e3,
                 TimingMethod(timings).c_str(), FormatGroupTable(timings, 15).c_str());
    std::fprintf(stderr, "kiln generate: its 15 launches of most exposed time\n%s",
                 FormatSlowestLaunches(timings, 15).c_str());
  }
  if (report && !generator->prefill_profile().empty()) {
    const std::vector<StepTiming>& timings = generator->prefill_profile();
    const InferenceShape& shape = generator->prefill_profile_shape();
    double total_us = 0;
    for (const StepTiming& t : timings) total_us += t.exposed_us;
    std::fprintf(stderr,
                 "kiln generate: GPU time of prefill call 0 (@%s, %lld prompt%s of %lld tokens) by kernel group, %zu "
                 "launches, %.3f ms %s (its time, profiled, is in the prefill figure above)\n%s",
                 InferenceFunctionName(shape.phase), static_cast<long long>(shape.batch), shape.batch == 1 ? "" : "s",
                 static_cast<long long>(shape.tokens), timings.size(), total_us / 1e3, TimingMethod(timings).c_str(),
                 FormatGroupTable(timings, 15).c_str());
  }
  if (rejected > 0) {
    return absl::InvalidArgumentError(absl::StrCat(rejected, " of ", prompts.size(), " requests were rejected"));
  }
  return absl::OkStatus();
}

}  // namespace

Command GenerateCommand() {
  return {{.name = "generate",
           .usage = "MODEL (--prompt TEXT | --prompt-tokens IDS | --prompts FILE) [options]",
           .summary = "generate tokens from a paged KV cache (CPU reference backend or a GPU)",
           .details =
               "Runs the prefill and @decode functions the compiler derives from the model (causal attention\n"
               "over the prompts writing K/V into paged blocks, several prompts a call: @fresh_prefill's flash\n"
               "attention for prompts with nothing cached, @prefill's paged attention for the rest; then one\n"
               "token per sequence reading K/V through block tables) with continuous batching and prefix\n"
               "caching, and prints the tokens as they come,\n"
               "then the prefill and decode speed on stderr. MODEL is a preset (bytes in and out: --prompt\n"
               "TEXT) or an HF config/folder (token ids: --prompt-tokens 1,2,3). Weights: --weights CKPT\n"
               "(from kiln train --save), an HF folder's model.safetensors, or a seeded random init.\n"
               "--prompts FILE runs one request per line together (text lines for the presets, comma-separated\n"
               "ids otherwise); a bad line is reported and skipped. A FILE ending in .jsonl holds one JSON object\n"
               "a line, {\"prompt\": \"text\"} or {\"tokens\": [1, 2, 3]}, with an optional \"max_new_tokens\": N\n"
               "of its own (bench/serve_h200.sh writes such workloads). A line on stderr then sums up the\n"
               "workload: requests, prompt tokens and the prefix cache's share, new tokens per second of wall\n"
               "time (compiles excluded). On --backend cuda every function size is one executable (a CUDA\n"
               "graph) binding one copy of the weights and of the KV pool.",
           .min_positionals = 1,
           .max_positionals = 1,
           .flags = {
               {.name = "prompt", .value_name = "TEXT", .help = "the prompt, as bytes (presets only)"},
               {.name = "prompt-tokens", .value_name = "IDS", .help = "the prompt as comma-separated token ids"},
               {.name = "prompts", .value_name = "FILE", .help = "one prompt per line, run together"},
               {.name = "max-new-tokens", .value_name = "N", .help = "tokens to generate per prompt", .default_value = "32"},
               {.name = "temperature", .value_name = "T", .help = "0 is greedy", .default_value = "1"},
               {.name = "top-k", .value_name = "K", .help = "keep the K most likely tokens; 0: all", .default_value = "0"},
               {.name = "top-p", .value_name = "P", .help = "nucleus mass in (0, 1]", .default_value = "1"},
               {.name = "seed", .value_name = "S", .help = "sampling seed", .default_value = "0"},
               {.name = "weights", .value_name = "CKPT", .help = "a kiln training checkpoint"},
               {.name = "init-seed", .value_name = "S", .help = "seed of the random init without weights",
                .default_value = "1337"},
               {.name = "precision", .value_name = "P", .help = "fp32 or bf16", .default_value = "bf16"},
               {.name = "block-size", .value_name = "N", .help = "tokens per KV block", .default_value = "16"},
               {.name = "kv-memory", .value_name = "BYTES|P%",
                .help = "size the KV pool (K and V) to at most this many bytes (1048576, 512K, 64M, 2G), or to a "
                        "share of the free GPU memory less the weights (90%: the rest is the executables')"},
               {.name = "kv-blocks", .value_name = "N", .help = "KV blocks in the pool",
                .default_value = "what the requests need, at most max-running full contexts"},
               {.name = "max-running", .value_name = "N", .help = "requests decoded together at most",
                .default_value = "8"},
               {.name = "context", .value_name = "N", .help = "tokens per sequence at most",
                .default_value = "the model's"},
               {.name = "backend", .value_name = "B", .help = "cpu, cuda or auto", .default_value = "cpu"},
               {.name = "report", .help = "where one decode call's and the first prefill call's GPU time goes, by kernel "
                                          "group (cuda)"},
               {.name = "trace", .value_name = "FILE.json",
                .help = "write one decode call's launches as a Chrome trace (cuda; open it in ui.perfetto.dev)"},
               {.name = "no-prefix-cache", .help = "prefill every prompt in full (to measure what the cache saves)"},
               {.name = "prefill-call-tokens", .value_name = "N",
                .help = "tokens of one prefill call at most, padding included: prompts of one length bucket are "
                        "prefilled together up to it (1: one prompt a call)",
                .default_value = "4096"},
               {.name = "no-fresh-prefill",
                .help = "prefill prompts with nothing cached through paged attention too, not the flash kernel "
                        "over the call's own keys (to measure what it saves)"},
               {.name = "no-decode-lookahead",
                .help = "wait for each decode step's tokens before starting the next (cuda; to measure what "
                        "starting it ahead saves)"},
               {.name = "disable-pass", .value_name = "NAME,...",
                .help = "skip these compiler passes in the prefill and decode compiles (to measure what one "
                        "saves; names: kiln compile --help)"},
               {.name = "enable-pass", .value_name = "NAME,...",
                .help = "run these passes, which are off by default, in the prefill and decode compiles (kiln "
                        "compile --help marks them)"},
           }},
          RunGenerate};
}

}  // namespace kiln::cli
