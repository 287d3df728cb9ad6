#include "bench/bench_util.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "codegen/nvrtc_compiler.h"
#include "ir/numerics.h"

namespace kiln::bench {

bool ParsePositiveInts(absl::string_view text, char separator, std::vector<int64_t>& out) {
  out.clear();
  for (absl::string_view part : absl::StrSplit(text, separator, absl::SkipEmpty())) {
    int64_t x = 0;
    if (!absl::SimpleAtoi(part, &x) || x < 1) return false;
    out.push_back(x);
  }
  return !out.empty();
}

Bf16Tensor RandomBf16Tensor(int64_t n, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bf16Tensor t;
  t.values.resize(n);
  t.bits.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    t.values[i] = RoundToDType(lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1p-53, DType::kBF16);
    t.bits[i] = FloatToBF16Bits(static_cast<float>(t.values[i]));
  }
  return t;
}

absl::StatusOr<LoadedKernel> LoadKernel(const KernelSpec& spec, const CudaDevice& device) {
  absl::StatusOr<CompiledKernel> compiled = CompileKernel(spec, NvrtcOptions{.arch = device.arch()});
  if (!compiled.ok()) return compiled.status();
  absl::StatusOr<std::unique_ptr<KernelLibrary>> library = KernelLibrary::Load(*compiled);
  if (!library.ok()) return library.status();
  LoadedKernel l;
  l.library = *std::move(library);
  absl::StatusOr<KernelLaunch> launch = PrepareLaunch(*l.library, spec, device.ordinal());
  if (!launch.ok()) return launch.status();
  l.launch = *launch;
  return l;
}

OptionRead ReadRunOption(int argc, char** argv, int& i, int min_rows, RunOptions& opt) {
  const absl::string_view a = argv[i];
  const bool has_value = i + 1 < argc;
  if (a == "--max-error") {
    if (!has_value || !absl::SimpleAtod(argv[++i], &opt.max_error) || !(opt.max_error >= 0)) {
      return OptionRead::kInvalid;
    }
    return OptionRead::kRead;
  }
  if (a == "--iters" || a == "--warmup" || a == "--rows") {
    const int least = a == "--warmup" ? 0 : a == "--rows" ? min_rows : 1;
    int value = 0;
    if (!has_value || !absl::SimpleAtoi(argv[++i], &value) || value < least) return OptionRead::kInvalid;
    (a == "--iters" ? opt.iters : a == "--warmup" ? opt.warmup : opt.rows) = value;
    return OptionRead::kRead;
  }
  return OptionRead::kOther;
}

absl::StatusOr<Timing> TimeCalls(cudaStream_t stream, int warmup, int iters, absl::string_view bench,
                                 absl::string_view unit, const std::function<absl::Status()>& call) {
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    return absl::InternalError(absl::StrCat(bench, ": cudaEventCreate"));
  }
  std::vector<double> ms;
  absl::Status status;
  for (int it = 0; it < warmup + iters && status.ok(); ++it) {
    cudaEventRecord(start, stream);
    status = call();
    cudaEventRecord(stop, stream);
    if (status.ok() && cudaEventSynchronize(stop) != cudaSuccess) {
      status = absl::InternalError(absl::StrCat(bench, ": ", unit, " failed"));
    }
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (it >= warmup) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  std::sort(ms.begin(), ms.end());
  return Timing{ms[ms.size() / 2], ms.front(), ms.back()};
}

absl::StatusOr<void*> DeviceBuffers::Upload(const void* host, int64_t bytes) {
  absl::StatusOr<void*> p = device_.Allocate(std::max(bytes, min_bytes_), bench_);
  if (!p.ok()) return p.status();
  held_.emplace_back(*p);
  if (host != nullptr && cudaMemcpy(*p, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    return absl::InternalError(absl::StrCat(bench_, ": upload"));
  }
  return *p;
}

void FailedRows::Check(absl::string_view label, const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s: %s\n", bench_.c_str(), std::string(label).c_str(),
               std::string(status.message()).c_str());
  ++count_;
}

int FailedRows::ExitCode(absl::string_view rows) const {
  if (count_ == 0) return 0;
  std::fprintf(stderr, "%s: FAILED (%d %s)\n", bench_.c_str(), count_, std::string(rows).c_str());
  return 1;
}

}  // namespace kiln::bench
