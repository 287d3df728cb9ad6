#include "bench/bench_util.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kiln::bench {

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
