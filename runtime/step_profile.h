// Where one run of a compiled step spends its GPU time: per-launch timings (from CUDA events,
// runtime/cuda/executable.h's Profile) turned into a Chrome trace that Perfetto and
// chrome://tracing open (`kiln train --trace FILE.json`), and into the per-group table that
// `--report` and bench/RESULTS.md show. Needs no GPU: the timings are plain data.
#pragma once

#include <string>
#include <vector>

#include "absl/types/span.h"

namespace kiln {

// How long one launch (kernel, GEMM or copy) of a run took on the GPU.
struct StepTiming {
  std::string name;   // the kernel's symbol, "gemm BxMxNxK", or the copy's purpose
  std::string group;  // what kind of work: the op ("gemm", "rms_norm", "fusion", "copy")
  std::string node;   // %name of the IR node; empty for the finishing copies
  std::string scope;  // the node's scope, e.g. "layers.3.attn"
  // From its start to its end, the start from the beginning of the run. In a graph (in_graph)
  // a launch may start before the one ahead of it ends (programmatic dependent launch: its
  // blocks wait in griddepcontrol.wait), so spans overlap.
  double start_us = 0, duration_us = 0;
  // How far it moved the run's end: its end minus the latest end of the launches before it
  // (0 when it ended under another). The runs' exposed times add up to the run's GPU time;
  // launched one by one, exposed is the duration.
  double exposed_us = 0;
  // Timed inside the replayed CUDA graph (CUPTI's activity trace), not launched alone between
  // two CUDA events (which adds the launch's host latency and overlaps nothing).
  bool in_graph = false;
};

// How `timings` were measured, for a report's heading: "in the CUDA graph (CUPTI)" or
// "launched one by one with CUDA events".
std::string TimingMethod(absl::Span<const StepTiming> timings);

// The Chrome trace event format ("traceEvents", complete events with ts/dur in microseconds),
// one event per launch on one track; args carry the group, node and scope.
std::string ChromeTraceJson(absl::Span<const StepTiming> timings, const std::string& run_name);

struct TimeGroup {
  std::string group;
  int64_t launches = 0;
  double total_us = 0;
};
// Groups by `group` (totals of exposed time), largest total first.
std::vector<TimeGroup> GroupTimes(absl::Span<const StepTiming> timings);

// A text table of the top `rows` groups: group, launches, ms, share of the run.
std::string FormatGroupTable(absl::Span<const StepTiming> timings, int rows);

// The `rows` launches of most exposed time, most first: exposed and span microseconds, group, node (or the launch's
// name when it has no node), scope and the launch's name (the kernel of a node that has
// several); what to read after the group table says which kind of work costs most.
std::string FormatSlowestLaunches(absl::Span<const StepTiming> timings, int rows);

}  // namespace kiln
