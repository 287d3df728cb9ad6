// How the processes of one data-parallel run find each other: rank 0 makes NCCL's unique id
// (ncclGetUniqueId: 128 opaque bytes) and publishes it; every other rank waits for it, then
// all of them call ncclCommInitRank with it. This is the rendezvous by file: a path every
// rank can read (a local folder on one host; a shared file system across hosts).
//
// The file names the run (a run id the launcher gives every rank) and the world size, so a
// file left by an earlier run, or one written for another world, is never taken for this
// one's: a rank keeps waiting past a stale run id and fails at once on a mismatched world.
// Waiting has a deadline: a rank whose rank 0 never starts, or dies before publishing, stops
// with an error naming itself, the path and how long it waited, instead of hanging.
//
// Format, one line of text then the payload in hex:
//   kiln-rendezvous v1 run=RUN_ID world=N bytes=B
//   <2B hex digits>
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln {

struct Rendezvous {
  std::string path;         // the file rank 0 writes
  std::string run_id;       // the same on every rank of one run (no spaces)
  int world_size = 1;
  absl::Duration timeout = absl::Seconds(300);  // how long a rank waits for rank 0's file
  absl::Duration poll = absl::Milliseconds(20);
};

// Rank 0: writes `payload` atomically (a reader sees no file or the whole one).
absl::Status PublishRendezvous(const Rendezvous& r, absl::string_view payload);

// Rank `rank` (>= 1): the payload of this run's file once it exists. Errors: DeadlineExceeded
// after r.timeout (naming the rank, the path, and a stale file's run id if one was there),
// FailedPrecondition for this run's file with another world size or a payload of other than
// `payload_bytes`, InvalidArgument for a file that is not a rendezvous file.
absl::StatusOr<std::string> AwaitRendezvous(const Rendezvous& r, int rank, int64_t payload_bytes);

}  // namespace kiln
