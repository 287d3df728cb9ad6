// The processes of one data-parallel run on one host: one a rank (a GPU), started together,
// watched together, and stopped together. When a rank exits with an error or is killed, the
// others are sent SIGTERM and, after a grace period, SIGKILL, so that a run never hangs on a
// peer that is gone (NCCL itself would wait in a collective forever); the error names the
// first rank that failed, how (exit status or signal), and the last lines of its log.
//
// Every rank runs with KILN_RANK, KILN_WORLD_SIZE and KILN_RUN_ID set (what the rank reads to
// find its GPU, its shard of the batch and the rendezvous: runtime/distributed/rendezvous.h),
// and with NCCL_NVLS_ENABLE=0: NVLink multicast stays off (the GPU machines' rule, KINDS.md).
// Each rank's stdout and stderr go to its own log file.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kiln {

struct RankProcess {
  std::vector<std::string> argv;  // argv[0] is the program (searched on PATH without a '/')
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing in) this process's
  std::string log_path;           // stdout and stderr, truncated at start
};

struct RankLaunchOptions {
  std::string run_id;  // KILN_RUN_ID of every rank
  // After one rank fails, how long the others have between SIGTERM and SIGKILL.
  absl::Duration grace = absl::Seconds(10);
  // The whole run's limit (every rank stopped, then DeadlineExceeded); zero: none.
  absl::Duration timeout = absl::ZeroDuration();
  absl::Duration poll = absl::Milliseconds(10);
  int log_tail_lines = 20;  // of the failed rank's log, in the error
};

// Starts ranks[0..N) (rank r is ranks[r]) and waits for all of them. OK when every rank
// exits 0. Errors: a rank that cannot be started (the others are stopped), the first rank to
// exit non-zero or by a signal (Aborted: "rank 1 of 2 exited with status 3; its log LOG ends:
// ..."), or the run's timeout.
absl::Status RunRanks(absl::Span<const RankProcess> ranks, const RankLaunchOptions& options);

}  // namespace kiln
