// When each kernel, copy and memset of a replayed CUDA graph ran on the GPU, from CUPTI's
// activity API (concurrent-kernel tracing: it does not serialize the launches), so that a
// profile shows the graph as it runs, programmatic dependent launch's overlap included. Timing
// launches one by one with CUDA events (CudaExecutable::Profile's fallback) adds a launch's
// host latency to every step and overlaps nothing: at llama-M's batch-1 decode step the two
// differ by a third.
//
// CUPTI is loaded at run time (dlopen of the toolkit's libcupti.so.13), never linked: the
// binaries start where it is absent (tests/cli_binary_deps_test.cc), and there a profile says
// why it fell back to events. CUPTI's activity buffers are the process's, so there is one
// tracer a process (Get) and one trace at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

struct TracedActivity {
  enum class Kind { kKernel, kMemcpy, kMemset };
  Kind kind = Kind::kKernel;
  std::string name;  // the kernel's symbol; empty for a copy or memset
  uint64_t start_ns = 0, end_ns = 0;  // GPU timestamps
};

class ActivityTracer {
 public:
  // The process's tracer: CUPTI loaded once (later calls return the first call's result).
  // NotFound, naming the libraries tried and dlerror(), where libcupti is absent.
  static absl::StatusOr<ActivityTracer*> Get();

  // Records every kernel, copy and memset the GPU runs from now until Stop.
  absl::Status Start();
  // Flushes CUPTI's buffers and returns what ran since Start, by start time. Fails when CUPTI
  // dropped records (a trace with holes would misattribute the time).
  absl::StatusOr<std::vector<TracedActivity>> Stop();

  struct Api;

 private:
  explicit ActivityTracer(Api* api) : api_(api) {}
  Api* api_;
  bool tracing_ = false;
};

// What one step of a run launches, for MatchActivitiesToSteps.
struct TracedStep {
  std::string kernel;          // our kernel's symbol; empty for work not ours to name (cuBLASLt's, a copy)
  bool launches_work = true;   // false for a step that enqueues nothing (an elided copy)
};

// Which of `activities` (by start time, as Stop returns them) each step of one run did.
// Named kernels are matched by symbol, in step order; the activities between two of them go
// to the unnamed steps between, one each in order, the last of those taking any left over (a
// GEMM's split-K reduction). result[i] lists indices into `activities`, empty for a step that
// launched nothing. Fails, naming the step, when a named kernel is missing from the trace.
absl::StatusOr<std::vector<std::vector<int>>> MatchActivitiesToSteps(const std::vector<TracedActivity>& activities,
                                                                     const std::vector<TracedStep>& steps);

}  // namespace kiln
