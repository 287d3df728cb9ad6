// decode_gemm_bench: the decode step's projection GEMMs on the GPU, kiln's few-row kernel
// (kernels/gemv.cuh's SmallMGemm, exactly as codegen lowers the gemm: codegen/lower_gemv.cc)
// against cuBLASLt (GemmPlan: its heuristic's first choice, and autotuned over the heuristic's
// candidates as CudaExecutable does), on llama-M's shapes at each --m (the decode batch, at
// most kMaxRows; past kSmallMGemmMaxRows, cuBLASLt's two rows alone, e.g. --m 32):
// qkv N 4096 K 2048, o N 2048 K 2048, gate_up N 11264 K 2048, down N 2048 K 5632, lm_head
// N 32000 K 2048; bf16 operands and D, no C.
// Each row: median, min and max us over the timed calls (CUDA events around each call, after
// warm-up, the same buffers every call: a weight smaller than L2 may be served from it), the
// weight's bytes over the median (GB/s: the bound at these M), and max |D - D of cuBLASLt|
// over max |D of cuBLASLt| (f32 accumulation in another order, one bf16 rounding: about 2^-8).
// One JSON object a line on stdout, a table on stderr.
//
//   decode_gemm_bench [--m 1,8] [--gemms qkv,o,gate_up,down,lm_head] [--iters 50] [--warmup 5]
//                     [--geometries auto,1x1x8x4] [--in-a-row 16] [--max-error 0.02]
// (a geometry is SmallMGemm's rows x split x unroll x groups: CodegenOptions::small_m_gemv_geometry)
//
// Self-checking: exit 1 when kiln's D differs from cuBLASLt's by more than --max-error (or
// NaN). Linked like the GPU tests; without a GPU it says so and exits 1.
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "codegen/compile_program.h"
#include "codegen/lower_gemv.h"
#include "codegen/lower_node.h"
#include "codegen/nvrtc_compiler.h"
#include "ir/graph.h"
#include "ir/numerics.h"
#include "ir/text_format.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/kernel_launch.h"

namespace kiln {
namespace {

constexpr int64_t kMaxRows = 64;

struct Shape {
  std::string name;
  int64_t n, k;
};
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {
      {"qkv", 4096, 2048}, {"o", 2048, 2048}, {"gate_up", 11264, 2048}, {"down", 2048, 5632}, {"lm_head", 32000, 2048}};
  return shapes;
}

struct Options : bench::RunOptions {
  Options() : bench::RunOptions{.iters = 50, .warmup = 5, .rows = 1, .max_error = 0.02} {}
  std::vector<int64_t> ms = {1, 8};
  std::vector<std::string> gemms = {"qkv", "o", "gate_up", "down", "lm_head"};
  std::vector<std::string> geometries = {"auto"};
  int in_a_row = 16;
};

// The gemm of one shape as a module (kept alive: the node is lowered from it).
absl::StatusOr<std::unique_ptr<Module>> GemmModule(int64_t m, const Shape& s) {
  return ParseModule(absl::StrCat("module @bench\nfunc @main {\n  %a = parameter() {index=0} : bf16[", m, ",", s.k,
                                  "]\n  %b = parameter() {index=1} : bf16[", s.n, ",", s.k, "]\n  %", s.name,
                                  " = gemm(%a, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, "
                                  "epilogue=none, k=", s.k, ", m=", m, ", n=", s.n, "} : bf16[", m, ",", s.n,
                                  "]\n  return %", s.name, "\n}\n"));
}

const Node& GemmOf(const Module& m) {
  for (const auto& n : m.functions()[0]->nodes()) {
    if (n->opcode() == Opcode::kGemm) return *n;
  }
  return *m.functions()[0]->nodes().back();
}

using Loaded = bench::LoadedKernel;

std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> bits(n);
  for (uint16_t& b : bits) b = FloatToBF16Bits(static_cast<float>(-1.0 + 2.0 * static_cast<double>(rng() >> 11) * 0x1p-53));
  return bits;
}

std::vector<float> Download(const void* d, int64_t n) {
  std::vector<uint16_t> bits(n);
  cudaMemcpy(bits.data(), d, n * 2, cudaMemcpyDeviceToHost);
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = BF16BitsToFloat(bits[i]);
  return out;
}

void Report(int64_t m, const Shape& s, const std::string& impl, const bench::Timing& t, double err) {
  const double gbps = 2.0 * s.n * s.k / (t.median_ms * 1e-3) * 1e-9;
  std::printf(
      "{\"m\": %lld, \"gemm\": \"%s\", \"n\": %lld, \"k\": %lld, \"impl\": \"%s\", \"median_us\": %.2f, \"min_us\": "
      "%.2f, \"max_us\": %.2f, \"gbps\": %.0f, \"rel_err_vs_cublaslt\": %.3g}\n",
      static_cast<long long>(m), s.name.c_str(), static_cast<long long>(s.n), static_cast<long long>(s.k), impl.c_str(),
      t.median_ms * 1e3, t.min_ms * 1e3, t.max_ms * 1e3, gbps, err);
  std::fprintf(stderr, "m %-3lld %-8s %-28s %8.2f us (min %.2f, max %.2f) %6.0f GB/s  err %.3g\n",
               static_cast<long long>(m), s.name.c_str(), impl.c_str(), t.median_ms * 1e3, t.min_ms * 1e3,
               t.max_ms * 1e3, gbps, err);
}

absl::Status RunShape(int64_t m, const Shape& s, CudaDevice& device, const Options& opt) {
  absl::StatusOr<std::unique_ptr<Module>> module = GemmModule(m, s);
  if (!module.ok()) return module.status();
  const Node& gemm = GemmOf(**module);
  absl::StatusOr<GemmDescription> description = GemmDescriptionOf(gemm);
  if (!description.ok()) return description.status();
  absl::StatusOr<std::unique_ptr<GemmPlan>> plan = GemmPlan::Create(*description, device);
  if (!plan.ok()) return plan.status();

  bench::DeviceBuffers held(device, "decode_gemm_bench", /*min_bytes=*/256);
  const std::vector<uint16_t> a = RandomBf16(m * s.k, 1), b = RandomBf16(s.n * s.k, 2);
  absl::StatusOr<void*> da = held.Upload(a.data(), a.size() * 2), db = held.Upload(b.data(), b.size() * 2),
                        d_blas = held.Upload(nullptr, m * s.n * 2), d_kiln = held.Upload(nullptr, m * s.n * 2),
                        scratch = held.Upload(nullptr, kGemmWorkspaceBytes);
  for (const auto* p : {&da, &db, &d_blas, &d_kiln, &scratch}) {
    if (!p->ok()) return p->status();
  }
  const GemmBuffers buffers{.out = *d_blas, .a = *da, .b = *db, .scratch = *scratch};
  auto time_blas = [&] {
    return bench::TimeCalls(device.stream(), opt.warmup, opt.iters, "decode_gemm_bench", "a call",
                            [&] { return (*plan)->Enqueue(buffers, device.stream()); });
  };
  // The heuristic's first choice, then the autotuned one, which is the reference.
  if (absl::Status used = (*plan)->UseCandidate(0); !used.ok()) return used;
  absl::StatusOr<bench::Timing> t_first = time_blas();
  if (!t_first.ok()) return t_first.status();
  const std::vector<float> first = Download(*d_blas, m * s.n);
  absl::StatusOr<GemmPlan::Tuning> tuning = (*plan)->Autotune(buffers, device.stream(), /*l2_flush=*/{});
  if (!tuning.ok()) return tuning.status();
  absl::StatusOr<bench::Timing> t_blas = time_blas();
  if (!t_blas.ok()) return t_blas.status();
  const std::vector<float> want = Download(*d_blas, m * s.n);
  double largest = 0;
  for (float x : want) largest = std::max(largest, static_cast<double>(std::abs(x)));
  auto error_of = [&](const std::vector<float>& got) {
    double diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double e = std::abs(static_cast<double>(got[i]) - want[i]);
      diff = std::isnan(e) ? INFINITY : std::max(diff, e);
    }
    return largest > 0 ? diff / largest : diff;
  };
  const double first_err = error_of(first);
  if (!(first_err <= opt.max_error)) {  // the autotuned (perhaps split-K) D against the first choice's
    return absl::InternalError(absl::StrCat("m ", m, " ", s.name, ": cuBLASLt's autotuned D is ", first_err,
                                            " of its largest |D| from the heuristic's first choice's"));
  }
  Report(m, s, "cublaslt (heuristic's first)", *t_first, first_err);
  std::fprintf(stderr, "      %s\n", (*plan)->CandidateSummary(0).c_str());
  Report(m, s, "cublaslt (autotuned)", *t_blas, 0.0);
  std::fprintf(stderr, "      candidate %d of %d: %s\n", tuning->chosen, (*plan)->num_candidates(),
               (*plan)->CandidateSummary(tuning->chosen).c_str());
  if (m > codegen::kSmallMGemmMaxRows) return absl::OkStatus();  // cuBLASLt's alone: past SmallMGemm's rows

  // kiln's kernel, as codegen lowers the gemm, in each geometry asked for ("auto": the one
  // codegen picks). Timed twice: one launch between two events (the figure the rows above
  // give cuBLASLt), and --in-a-row launches back to back, programmatic as in the decode graph,
  // each on another copy of the weight (enough copies that they do not fit in L2 together),
  // per launch: the kernel's time with its neighbours' ramps overlapping as in the step.
  const int64_t weight_bytes = s.n * s.k * 2;
  const int copies = static_cast<int>(std::min<int64_t>(opt.in_a_row, 1 + (int64_t{160} << 20) / weight_bytes));
  std::vector<const void*> weights = {*db};
  for (int c = 1; c < copies; ++c) {
    absl::StatusOr<void*> copy = held.Upload(b.data(), weight_bytes);
    if (!copy.ok()) return copy.status();
    weights.push_back(*copy);
  }
  absl::Status worst = absl::OkStatus();
  for (const std::string& geometry : opt.geometries) {
    CodegenOptions options{.target = device.target()};
    if (geometry != "auto") {
      absl::StatusOr<CodegenOptions::GemvGeometry> parsed = ParseGemvGeometry(geometry);
      if (!parsed.ok()) return parsed.status();
      options.small_m_gemv_geometry = *parsed;
    }
    absl::StatusOr<LoweredNode> lowered = LowerNode(gemm, options);
    if (!lowered.ok()) return lowered.status();
    if (lowered->kind != LoweringKind::kKernels || lowered->kernels.size() != 1) {
      return absl::InternalError(absl::StrCat("m ", m, " ", s.name, ": codegen did not give one kiln kernel"));
    }
    const std::string& source = lowered->kernels[0].source;
    const size_t at = source.find("SmallMGemm<");
    const std::string call = at == std::string::npos ? "" : source.substr(at, source.find(">::Run", at) - at + 1);
    absl::StatusOr<Loaded> kernel = bench::LoadKernel(lowered->kernels[0], device);
    if (!kernel.ok()) {
      std::fprintf(stderr, "m %-3lld %-8s %s: %s\n", static_cast<long long>(m), s.name.c_str(), geometry.c_str(),
                   std::string(kernel.status().message()).c_str());
      worst.Update(kernel.status());
      continue;
    }
    std::vector<void*> args = {*d_kiln, *da, const_cast<void*>(weights[0])};
    absl::StatusOr<bench::Timing> t =
        bench::TimeCalls(device.stream(), opt.warmup, opt.iters, "decode_gemm_bench", "a call",
                         [&] { return EnqueueLaunch(kernel->launch, args, device.stream(), "decode_gemm_bench"); });
    if (!t.ok()) return t.status();
    const double err = error_of(Download(*d_kiln, m * s.n));
    absl::StatusOr<bench::Timing> row = bench::TimeCalls(
        device.stream(), opt.warmup, opt.iters, "decode_gemm_bench", "launches in a row", [&]() -> absl::Status {
          for (int i = 0; i < opt.in_a_row; ++i) {
            args[2] = const_cast<void*>(weights[i % weights.size()]);
            RETURN_IF_ERROR(EnqueueLaunch(kernel->launch, args, device.stream(), "decode_gemm_bench"));
          }
          return absl::OkStatus();
        });
    if (!row.ok()) return row.status();
    row->median_ms /= opt.in_a_row;
    row->min_ms /= opt.in_a_row;
    row->max_ms /= opt.in_a_row;
    Report(m, s, absl::StrCat("kiln ", geometry), *t, err);
    Report(m, s, absl::StrCat("kiln ", geometry, " in a row"), *row, err);
    std::fprintf(stderr, "      %s\n", call.c_str());
    if (!(err <= opt.max_error)) {  // NaN compares false
      worst.Update(absl::InternalError(absl::StrCat("m ", m, " ", s.name, " ", geometry, ": kiln's D is ", err,
                                                    " of the largest |D| from cuBLASLt's, beyond --max-error ",
                                                    opt.max_error)));
    }
  }
  return worst;
}

bool ParseArgs(int argc, char** argv, Options& opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (const bench::OptionRead read = bench::ReadRunOption(argc, argv, i, /*min_rows=*/1, opt);
        read != bench::OptionRead::kOther) {
      if (read == bench::OptionRead::kInvalid) return false;
    } else if (a == "--m" && i + 1 < argc) {
      if (!bench::ParsePositiveInts(argv[++i], ',', opt.ms)) return false;
      for (int64_t m : opt.ms) {
        if (m > kMaxRows) return false;
      }
    } else if (a == "--gemms" && i + 1 < argc) {
      opt.gemms = absl::StrSplit(argv[++i], ',', absl::SkipEmpty());
    } else if (a == "--geometries" && i + 1 < argc) {
      opt.geometries = absl::StrSplit(argv[++i], ',', absl::SkipEmpty());
    } else if (a == "--in-a-row" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &opt.in_a_row) || opt.in_a_row < 1) return false;
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
                 "usage: decode_gemm_bench [--m 1,8 (each at most %lld; past %lld, cuBLASLt's rows alone)] "
                 "[--gemms qkv,o,gate_up,down,lm_head] [--geometries auto,RxSxUxG,...] [--in-a-row N] [--iters N] "
                 "[--warmup N] [--max-error X]\n",
                 static_cast<long long>(kMaxRows), static_cast<long long>(codegen::kSmallMGemmMaxRows));
    return 2;
  }
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Open();
  if (!device.ok()) {
    std::fprintf(stderr, "decode_gemm_bench: no GPU: %s\n", std::string(device.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "decode_gemm_bench on %s (%s)\n", (*device)->name().c_str(),
               (*device)->target().ToString().c_str());
  bench::FailedRows failed("decode_gemm_bench");
  for (int64_t m : opt.ms) {
    for (const std::string& name : opt.gemms) {
      const auto it = std::find_if(Shapes().begin(), Shapes().end(), [&](const Shape& s) { return s.name == name; });
      if (it == Shapes().end()) {
        std::fprintf(stderr, "decode_gemm_bench: unknown gemm '%s' (qkv, o, gate_up, down, lm_head)\n", name.c_str());
        return 2;
      }
      failed.Check(absl::StrCat("m ", m, " ", name), RunShape(m, *it, **device, opt));
    }
  }
  return failed.ExitCode("gemm(s)");
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
