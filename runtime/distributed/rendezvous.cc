#include "runtime/distributed/rendezvous.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

constexpr absl::string_view kMagic = "kiln-rendezvous v1";

struct Parsed {
  std::string run_id;
  int world_size = 0;
  std::string payload;
};

absl::StatusOr<Parsed> Parse(const std::string& path, const std::string& text) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a kiln rendezvous file: ", why));
  };
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (lines.size() < 2 || !absl::StartsWith(lines[0], kMagic)) return bad(absl::StrCat("no '", kMagic, "' line"));
  Parsed p;
  int64_t bytes = -1;
  for (absl::string_view field : absl::StrSplit(lines[0].substr(kMagic.size()), ' ', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&field, "run=")) {
      p.run_id = std::string(field);
    } else if (absl::ConsumePrefix(&field, "world=")) {
      if (!absl::SimpleAtoi(field, &p.world_size)) return bad("world= is not a number");
    } else if (absl::ConsumePrefix(&field, "bytes=")) {
      if (!absl::SimpleAtoi(field, &bytes)) return bad("bytes= is not a number");
    }
  }
  if (p.run_id.empty() || p.world_size < 1 || bytes < 0) return bad("run=, world= or bytes= missing");
  const std::string& hex = lines[1];
  const bool is_hex = std::all_of(hex.begin(), hex.end(), [](char c) { return absl::ascii_isxdigit(c); });
  if (!is_hex || static_cast<int64_t>(hex.size()) != 2 * bytes) {
    return bad(absl::StrCat("the payload is not ", bytes, " bytes of hex"));
  }
  p.payload = absl::HexStringToBytes(hex);
  return p;
}

}  // namespace

absl::Status PublishRendezvous(const Rendezvous& r, absl::string_view payload) {
  if (r.run_id.empty() || absl::StrContains(r.run_id, ' ') || absl::StrContains(r.run_id, '\n')) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous run id '", r.run_id, "' must be non-empty, no spaces"));
  }
  return WriteFileAtomically(r.path, absl::StrCat(kMagic, " run=", r.run_id, " world=", r.world_size, " bytes=",
                                                  payload.size(), "\n", absl::BytesToHexString(payload), "\n"));
}

absl::StatusOr<std::string> AwaitRendezvous(const Rendezvous& r, int rank, int64_t payload_bytes) {
  const absl::Time deadline = absl::Now() + r.timeout;
  std::string stale;  // the run id of a file left by another run, for the timeout's message
  while (true) {
    absl::StatusOr<std::string> text = ReadFileToString(r.path);
    if (text.ok()) {
      ASSIGN_OR_RETURN(Parsed p, Parse(r.path, *text));
      if (p.run_id == r.run_id) {
        if (p.world_size != r.world_size) {
          return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of ", r.world_size, ": ", r.path,
                                                            " is for a world of ", p.world_size,
                                                            " (every rank must be given the same --gpus)"));
        }
        if (static_cast<int64_t>(p.payload.size()) != payload_bytes) {
          return absl::FailedPreconditionError(absl::StrCat("rank ", rank, ": ", r.path, " holds ", p.payload.size(),
                                                            " bytes, not the ", payload_bytes, " expected"));
        }
        return p.payload;
      }
      stale = p.run_id;
    } else if (!absl::IsNotFound(text.status())) {
      return absl::Status(text.status().code(),
                          absl::StrCat("rank ", rank, ": reading the rendezvous: ", text.status().message()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank, " of ", r.world_size, ": rank 0 did not publish run ", r.run_id, " at ", r.path, " within ",
          absl::FormatDuration(r.timeout),
          stale.empty() ? " (no file there: did rank 0 start, or die before it made its NCCL id?)"
                        : absl::StrCat(" (the file there is run ", stale, "'s, an earlier run's)")));
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(r.poll));
  }
}

}  // namespace kiln
