// gemm_bench: cuBLASLt bf16 against FP8 through kiln's own GEMM path, on the projection GEMMs
// of llama-S and llama-M's forward (frontends/model_config.cc's presets; M = the tokens of the
// default train batch, batch x seq: 16384 for llama-S, 8192 for llama-M):
//   qkv      x [M, d_model] · [Wq; Wk; Wv]ᵀ, N = (heads + 2 kv_heads) head_dim (merge-sibling-gemms'
//            one GEMM: llama-S 1280, llama-M 4096)
//   o        attention output · Woᵀ, N = d_model, K = heads head_dim
//   gate_up  x · [Wgate; Wup]ᵀ, N = 2 d_ff (merged likewise)
//   down     h · Wdownᵀ, N = d_model, K = d_ff
//   lm_head  x · Wheadᵀ, N = vocab
// Each GEMM is an IR gemm node (a mk, b nk: the TN layout FP8 needs), described by codegen
// (GemmDescriptionOf) and planned by the runtime (GemmPlan::Create, then Autotune on the
// benchmark's buffers, as CudaExecutable does), twice:
//   bf16   bf16 x bf16 -> bf16, alpha = a_scale b_scale
//   fp8    f8e4m3 x f8e4m3 -> bf16 {scaled=1}, a_scale 0.5 and b_scale 0.25 on the device
// over the same values: the operands are drawn in e4m3 and the bf16 operands are their exact
// copies (every e4m3 value is a bf16 one), so the bf16 GEMM is the FP8 GEMM's reference on the
// GPU; the two differ by f32 accumulation order and one bf16 rounding of D (about 2⁻⁸ of the
// largest |D|). Each row: median, min and max TFLOP/s (2 M N K per call) over --iters calls
// timed one by one with CUDA events after --warmup, the ratio of the fp8 median to the bf16
// median, and max |D_fp8 - D_bf16| / max |D_bf16| over sampled rows. One JSON object a line on
// stdout, a table on stderr.
//
//   gemm_bench [--presets llama-S,llama-M] [--gemms qkv,o,gate_up,down,lm_head] [--iters 50]
//              [--warmup 5] [--rows 256] [--max-error 0.02] [--no-autotune] [--require-gpu]
//
// Self-checking: exit 1 when a GEMM's relative error passes --max-error (or is NaN) or a plan
// fails. Without a GPU (or without FP8 tensor cores) it describes every GEMM and checks the
// descriptions against the plan's rules (GemmPlan::CheckSupported), says it skipped the rest
// and exits 0, unless --require-gpu (bench/run_gemm_h200.sh passes it), which makes that exit 1.
//
// Linked like the GPU tests (Abseil and protobuf statically, the CUDA runtime statically,
// never libcuda).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "codegen/compile_program.h"
#include "frontends/model_config.h"
#include "ir/graph.h"
#include "ir/numerics.h"
#include "ir/text_format.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/gemm.h"

namespace kiln {
namespace {

constexpr float kAScale = 0.5f, kBScale = 0.25f;

struct GemmShape {
  std::string preset, name;
  int64_t m, n, k;
  double flops() const { return 2.0 * static_cast<double>(m) * n * k; }
};

// The forward projection GEMMs of a preset, M the tokens of its default batch.
absl::StatusOr<std::vector<GemmShape>> PresetGemms(const std::string& preset) {
  absl::StatusOr<ModelConfig> c = PresetConfig(preset);
  if (!c.ok()) return c.status();
  const int64_t tokens = c->batch * c->seq_len;
  const int64_t q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
  return std::vector<GemmShape>{{preset, "qkv", tokens, q + 2 * kv, c->d_model},
                                {preset, "o", tokens, c->d_model, q},
                                {preset, "gate_up", tokens, 2 * c->d_ff, c->d_model},
                                {preset, "down", tokens, c->d_model, c->d_ff},
                                {preset, "lm_head", tokens, c->vocab_size, c->d_model}};
}

// The gemm node of one shape, in `in` operands (fp8 ones scaled, d_scale the constant 1: a bf16
// D takes no other), and its description as codegen makes it.
absl::StatusOr<GemmDescription> Describe(const GemmShape& s, bool fp8, std::unique_ptr<Module>* keep) {
  const std::string in = fp8 ? "f8e4m3" : "bf16";
  const std::string scales = fp8 ? ", %sa, %sb, %sd" : "";
  const std::string text = absl::StrCat(
      "module @bench\nfunc @main {\n", "  %a = parameter() {index=0} : ", in, "[", s.m, ",", s.k, "]\n",
      "  %b = parameter() {index=1} : ", in, "[", s.n, ",", s.k, "]\n",
      fp8 ? "  %sa = parameter() {index=2} : f32[]\n  %sb = parameter() {index=3} : f32[]\n"
            "  %sd = constant() {value=1.0} : f32[]\n"
          : "",
      "  %", s.name, " = gemm(%a, %b", scales, ") {a_layout=mk, alpha=",
      fp8 ? "1.0" : absl::StrCat(static_cast<double>(kAScale) * kBScale), ", b_layout=nk, batch=1, beta=0.0, ",
      "epilogue=none, k=", s.k, ", m=", s.m, ", n=", s.n, fp8 ? ", scaled=1" : "", "} : bf16[", s.m, ",", s.n, "]\n",
      "  return %", s.name, "\n}\n");
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  if (!m.ok()) return m.status();
  *keep = *std::move(m);
  for (const auto& n : (*keep)->functions()[0]->nodes()) {
    if (n->opcode() != Opcode::kGemm) continue;
    absl::StatusOr<GemmDescription> g = GemmDescriptionOf(*n);
    if (g.ok()) g->context = absl::StrCat(s.preset, " ", s.name, fp8 ? " (fp8)" : " (bf16)");
    return g;
  }
  return absl::InternalError("gemm_bench: no gemm node");
}

// `n` e4m3 values (uniform in [-2, 2) before rounding) as bytes, and their bf16 copies. A pool of
// a prime number of values, repeated, so that rows differ and 80M values take no minute to draw.
struct Operand {
  std::vector<uint8_t> fp8;
  std::vector<uint16_t> bf16;
};
Operand Draw(int64_t n, uint64_t seed) {
  constexpr int64_t kPool = 1000003;
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> pool(kPool);
  for (uint8_t& v : pool) v = FloatToF8E4M3Bits(static_cast<float>(-2.0 + 4.0 * static_cast<double>(rng() >> 11) * 0x1p-53));
  uint16_t to_bf16[256];
  for (int b = 0; b < 256; ++b) to_bf16[b] = FloatToBF16Bits(F8E4M3BitsToFloat(static_cast<uint8_t>(b)));
  Operand o;
  o.fp8.resize(n);
  o.bf16.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    o.fp8[i] = pool[i % kPool];
    o.bf16[i] = to_bf16[o.fp8[i]];
  }
  return o;
}

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
};

absl::StatusOr<Timing> Time(const GemmPlan& plan, const GemmBuffers& buffers, const CudaDevice& device, int warmup,
                            int iters) {
  absl::StatusOr<bench::Timing> t = bench::TimeCalls(device.stream(), warmup, iters, "gemm_bench", "a call",
                                                     [&] { return plan.Enqueue(buffers, device.stream()); });
  if (!t.ok()) return t.status();
  return Timing{1000.0 * t->median_ms, 1000.0 * t->min_ms, 1000.0 * t->max_ms};
}

struct Options : bench::RunOptions {
  Options() : bench::RunOptions{.iters = 50, .warmup = 5, .rows = 256, .max_error = 0.02} {}
  std::vector<std::string> presets = {"llama-S", "llama-M"};
  std::vector<std::string> gemms = {"qkv", "o", "gate_up", "down", "lm_head"};
  bool autotune = true, require_gpu = false;
};

double Tflops(const GemmShape& s, double us) { return s.flops() / (us * 1e-6) * 1e-12; }

// Times one shape in bf16 and fp8 and compares the two results; the error it returns fails the run.
absl::Status RunShape(const GemmShape& s, CudaDevice& device, const Options& opt) {
  std::unique_ptr<Module> bf16_module, fp8_module;
  absl::StatusOr<GemmDescription> bf16_desc = Describe(s, /*fp8=*/false, &bf16_module);
  absl::StatusOr<GemmDescription> fp8_desc = Describe(s, /*fp8=*/true, &fp8_module);
  if (!bf16_desc.ok()) return bf16_desc.status();
  if (!fp8_desc.ok()) return fp8_desc.status();
  absl::StatusOr<std::unique_ptr<GemmPlan>> bf16 = GemmPlan::Create(*bf16_desc, device);
  absl::StatusOr<std::unique_ptr<GemmPlan>> fp8 = GemmPlan::Create(*fp8_desc, device);
  if (!bf16.ok()) return bf16.status();
  if (!fp8.ok()) return fp8.status();

  const Operand a = Draw(s.m * s.k, 1), b = Draw(s.n * s.k, 2);
  bench::DeviceBuffers held(device, "gemm_bench", /*min_bytes=*/256);
  auto upload = [&](const void* host, int64_t bytes) { return held.Upload(host, bytes); };
  const float scales[2] = {kAScale, kBScale};
  const int64_t d_bytes = s.m * s.n * 2;
  absl::StatusOr<void*> a8 = upload(a.fp8.data(), s.m * s.k), b8 = upload(b.fp8.data(), s.n * s.k),
                        a16 = upload(a.bf16.data(), s.m * s.k * 2), b16 = upload(b.bf16.data(), s.n * s.k * 2),
                        sa = upload(&scales[0], 4), sb = upload(&scales[1], 4), d8 = upload(nullptr, d_bytes),
                        d16 = upload(nullptr, d_bytes), scratch = upload(nullptr, kGemmWorkspaceBytes);
  for (const auto* p : {&a8, &b8, &a16, &b16, &sa, &sb, &d8, &d16, &scratch}) {
    if (!p->ok()) return p->status();
  }
  const GemmBuffers bf16_buffers{.out = *d16, .a = *a16, .b = *b16, .scratch = *scratch};
  const GemmBuffers fp8_buffers{.out = *d8, .a = *a8, .b = *b8, .a_scale = *sa, .b_scale = *sb, .scratch = *scratch};
  GemmPlan::Tuning bf16_tuning, fp8_tuning;
  if (opt.autotune) {
    absl::StatusOr<GemmPlan::Tuning> t = (*bf16)->Autotune(bf16_buffers, device.stream(), /*l2_flush=*/{});
    if (!t.ok()) return t.status();
    bf16_tuning = *t;
    t = (*fp8)->Autotune(fp8_buffers, device.stream(), /*l2_flush=*/{});
    if (!t.ok()) return t.status();
    fp8_tuning = *t;
  }
  absl::StatusOr<Timing> t16 = Time(**bf16, bf16_buffers, device, opt.warmup, opt.iters);
  if (!t16.ok()) return t16.status();
  absl::StatusOr<Timing> t8 = Time(**fp8, fp8_buffers, device, opt.warmup, opt.iters);
  if (!t8.ok()) return t8.status();

  // Sampled rows of D (the first and the last among them), fp8 against bf16.
  double max_diff = 0, max_ref = 0;
  std::vector<uint16_t> row8(s.n), row16(s.n);
  std::mt19937_64 rng(7);
  for (int r = 0; r < opt.rows; ++r) {
    const int64_t row = r == 0 ? 0 : r == 1 ? s.m - 1 : static_cast<int64_t>(rng() % s.m);
    if (cudaMemcpy(row8.data(), static_cast<char*>(*d8) + row * s.n * 2, s.n * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(row16.data(), static_cast<char*>(*d16) + row * s.n * 2, s.n * 2, cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
      return absl::InternalError("gemm_bench: download");
    }
    for (int64_t j = 0; j < s.n; ++j) {
      const double x = BF16BitsToFloat(row8[j]), y = BF16BitsToFloat(row16[j]);
      const double e = std::abs(x - y);
      max_diff = std::isnan(e) ? INFINITY : std::max(max_diff, e);
      max_ref = std::max(max_ref, std::abs(y));
    }
  }
  const double rel = max_ref > 0 ? max_diff / max_ref : INFINITY;
  const double ratio = t16->median_us / t8->median_us;  // fp8 TFLOP/s over bf16 TFLOP/s
  std::printf(
      "{\"preset\": \"%s\", \"gemm\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
      "\"bf16_tflops\": {\"median\": %.1f, \"min\": %.1f, \"max\": %.1f}, "
      "\"fp8_tflops\": {\"median\": %.1f, \"min\": %.1f, \"max\": %.1f}, \"fp8_over_bf16\": %.3f, "
      "\"bf16_us\": %.2f, \"fp8_us\": %.2f, \"max_rel_err\": %.3g, "
      "\"bf16_tuning\": {\"candidates\": %d, \"chosen\": %d}, \"fp8_tuning\": {\"candidates\": %d, \"chosen\": %d}}\n",
      s.preset.c_str(), s.name.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n),
      static_cast<long long>(s.k), Tflops(s, t16->median_us), Tflops(s, t16->max_us), Tflops(s, t16->min_us),
      Tflops(s, t8->median_us), Tflops(s, t8->max_us), Tflops(s, t8->min_us), ratio, t16->median_us, t8->median_us,
      rel, bf16_tuning.candidates, bf16_tuning.chosen, fp8_tuning.candidates, fp8_tuning.chosen);
  std::fflush(stdout);
  std::fprintf(stderr, "%-8s %-8s M%-6lld N%-6lld K%-6lld bf16 %7.1f (%6.1f-%6.1f)  fp8 %7.1f (%6.1f-%6.1f)  %5.2fx  err %.2g\n",
               s.preset.c_str(), s.name.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n),
               static_cast<long long>(s.k), Tflops(s, t16->median_us), Tflops(s, t16->max_us),
               Tflops(s, t16->min_us), Tflops(s, t8->median_us), Tflops(s, t8->max_us), Tflops(s, t8->min_us), ratio,
               rel);
  if (!(rel <= opt.max_error)) {
    return absl::InternalError(absl::StrCat("the fp8 result is ", rel, " of max |D| from the bf16 one, beyond --max-error ",
                                            opt.max_error));
  }
  return absl::OkStatus();
}

bool ParseArgs(int argc, char** argv, Options& opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (const bench::OptionRead read = bench::ReadRunOption(argc, argv, i, /*min_rows=*/2, opt);
        read != bench::OptionRead::kOther) {
      if (read == bench::OptionRead::kInvalid) return false;
    } else if (a == "--presets" && has_value) {
      opt.presets = absl::StrSplit(argv[++i], ',', absl::SkipEmpty());
    } else if (a == "--gemms" && has_value) {
      opt.gemms = absl::StrSplit(argv[++i], ',', absl::SkipEmpty());
    } else if (a == "--no-autotune") {
      opt.autotune = false;
    } else if (a == "--require-gpu") {
      opt.require_gpu = true;
    } else {
      return false;
    }
  }
  return true;
}

int Main(int argc, char** argv) {
  Options opt;
  if (!ParseArgs(argc, argv, opt)) {
    std::fprintf(stderr,
                 "usage: gemm_bench [--presets llama-S,llama-M] [--gemms qkv,o,gate_up,down,lm_head] [--iters N] "
                 "[--warmup N] [--rows N] [--max-error X] [--no-autotune] [--require-gpu]\n");
    return 2;
  }
  std::vector<GemmShape> shapes;
  for (const std::string& preset : opt.presets) {
    absl::StatusOr<std::vector<GemmShape>> gemms = PresetGemms(preset);
    if (!gemms.ok()) {
      std::fprintf(stderr, "gemm_bench: %s\n", std::string(gemms.status().message()).c_str());
      return 2;
    }
    for (const std::string& name : opt.gemms) {
      const auto it = std::find_if(gemms->begin(), gemms->end(), [&](const GemmShape& s) { return s.name == name; });
      if (it == gemms->end()) {
        std::fprintf(stderr, "gemm_bench: unknown GEMM '%s' (qkv, o, gate_up, down, lm_head)\n", name.c_str());
        return 2;
      }
      shapes.push_back(*it);
    }
  }
  // What needs no GPU first: every shape's two descriptions, and the plan's rules for them.
  for (const GemmShape& s : shapes) {
    for (bool fp8 : {false, true}) {
      std::unique_ptr<Module> keep;
      absl::StatusOr<GemmDescription> g = Describe(s, fp8, &keep);
      const absl::Status st = g.ok() ? GemmPlan::CheckSupported(*g) : g.status();
      if (!st.ok()) {
        std::fprintf(stderr, "gemm_bench: %s %s: %s\n", s.preset.c_str(), s.name.c_str(), std::string(st.message()).c_str());
        return 1;
      }
    }
  }
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Open();
  if (!device.ok()) {
    std::fprintf(stderr, "gemm_bench: %zu GEMMs described; skipped: no GPU: %s\n", shapes.size(),
                 std::string(device.status().message()).c_str());
    return opt.require_gpu ? 1 : 0;
  }
  if (!(*device)->target().has_fp8) {
    std::fprintf(stderr, "gemm_bench: skipped: %s has no FP8 tensor cores (sm_89, sm_90)\n", (*device)->name().c_str());
    return opt.require_gpu ? 1 : 0;
  }
  std::fprintf(stderr, "gemm_bench on %s (%s), cuBLASLt %zu, %s, %d calls a GEMM after %d\n",
               (*device)->name().c_str(), (*device)->target().ToString().c_str(), cublasLtGetVersion(),
               opt.autotune ? "autotuned" : "the heuristic's first choice", opt.iters, opt.warmup);
  std::fprintf(stderr, "%-8s %-8s %-22s %-28s %-28s %6s  %s\n", "preset", "gemm", "shape", "bf16 TFLOP/s (min-max)",
               "fp8 TFLOP/s (min-max)", "fp8/bf16", "rel err");
  bench::FailedRows failed("gemm_bench");
  for (const GemmShape& s : shapes) failed.Check(absl::StrCat(s.preset, " ", s.name), RunShape(s, **device, opt));
  return failed.ExitCode("GEMM(s)");
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
