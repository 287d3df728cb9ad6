// What kiln's GPU benchmarks (bench/attention_bench.cc, bench/gemm_bench.cc) share: the
// options they all take, timing a unit of work call by call with CUDA events, the device
// buffers of one row held until it is done, and the count of failed rows that makes a run's
// exit code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codegen/kernel_spec.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/kernel_launch.h"

namespace kiln::bench {

// The options every benchmark takes: --iters N (at least 1), --warmup N (0 or more), --rows N
// (sampled rows checked; at least the benchmark's minimum) and --max-error X (0 or more).
struct RunOptions {
  int iters = 1, warmup = 0, rows = 1;
  double max_error = 0;
};

// Whether argv[i] is one of RunOptions' (then read with its value, i moved onto the value):
// kRead, kInvalid (its value missing or out of range) or kOther (not one of them).
enum class OptionRead { kRead, kInvalid, kOther };
OptionRead ReadRunOption(int argc, char** argv, int& i, int min_rows, RunOptions& opt);

// The positive integers of `text` split at `separator` ("1,32", "4x5x4x4") into `out`; false
// when a part is not one, or there are none.
bool ParsePositiveInts(absl::string_view text, char separator, std::vector<int64_t>& out);

// Over the timed calls, in milliseconds.
struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Runs `call` (which enqueues one unit of work on `stream`) warmup + iters times, each call
// between two CUDA events and waited for, and keeps the last `iters` times. The first error
// of a call ends the timing and is returned; a call whose work faults is
// "<bench>: <unit> failed", events that cannot be made "<bench>: cudaEventCreate".
absl::StatusOr<Timing> TimeCalls(cudaStream_t stream, int warmup, int iters, absl::string_view bench,
                                 absl::string_view unit, const std::function<absl::Status()>& call);

// n bf16 values drawn uniformly in [lo, hi) (then rounded to bf16; the GPU tests'
// distribution): as doubles, and their bits.
struct Bf16Tensor {
  std::vector<double> values;
  std::vector<uint16_t> bits;
};
Bf16Tensor RandomBf16Tensor(int64_t n, double lo, double hi, uint64_t seed);

// A kernel as codegen emits it, compiled by NVRTC for `device`, loaded, its launch prepared.
struct LoadedKernel {
  std::unique_ptr<KernelLibrary> library;
  KernelLaunch launch;
};
absl::StatusOr<LoadedKernel> LoadKernel(const KernelSpec& spec, const CudaDevice& device);

// The device buffers of one benchmark row, freed together when it goes.
class DeviceBuffers {
 public:
  // Allocations are named `bench` and take at least `min_bytes`.
  DeviceBuffers(CudaDevice& device, std::string bench, int64_t min_bytes = 0)
      : device_(device), bench_(std::move(bench)), min_bytes_(min_bytes) {}

  // A buffer of `bytes` (or min_bytes), with `host`'s `bytes` copied in unless it is null.
  absl::StatusOr<void*> Upload(const void* host, int64_t bytes);

 private:
  CudaDevice& device_;
  std::string bench_;
  int64_t min_bytes_;
  std::vector<DeviceMemory> held_;
};

// The rows of a run that failed, each said on stderr as "<bench>: <label>: <error>".
class FailedRows {
 public:
  explicit FailedRows(std::string bench) : bench_(std::move(bench)) {}

  // Counts (and says) `status` if it is an error.
  void Check(absl::string_view label, const absl::Status& status);
  // The run's exit code: 0, or 1 after "<bench>: FAILED (<count> <rows>)".
  int ExitCode(absl::string_view rows) const;

 private:
  std::string bench_;
  int count_ = 0;
};

}  // namespace kiln::bench
