// File helpers shared by every layer (the IR is the lowest layer that reads files).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// The whole file; NotFound names the path, other failures say why (errno text).
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// An open read-only descriptor of `path` (the caller closes it); the errors ReadFileToString
// gives for an empty name, a missing file, one that cannot be opened, or a directory.
absl::StatusOr<int> OpenForReading(const std::string& path);

// Writes `contents` to `path` so that a reader sees the old file or the new one, never a
// torn one, and reports success only when every byte reached the file:
//   - a symlink is followed: the file it points to is written, the link stays a link;
//   - a regular file (or no file) is replaced atomically: the bytes go to PATH.tmp.<pid>
//     beside the target, are flushed, and the temp file is renamed over the target (which
//     keeps its permission bits). Temp files of this pattern left by processes that no
//     longer run (a save killed mid-write) are removed first; no other file is touched;
//   - a character device or a FIFO (/dev/null, /dev/stdout, a pipe) is written in place,
//     since replacing it with a regular file is never what was meant;
//   - a directory, block device or socket is refused.
// On failure the target is as it was and no temp file is left.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// Checks, before any work is done, that WriteFileAtomically(path, ...) can succeed later:
// the folder that will hold the file exists and is writable, and an existing target is of
// a kind that can be written. Changes nothing on disk. `flag` names the option in errors
// ("--save").
absl::Status CheckOutputPath(const std::string& path, absl::string_view flag);

// Where a write to `path` lands: `path` with its symlinks followed (up to 40 levels, as the
// kernel does); a dangling link resolves to the file it names. Errors name the link.
absl::StatusOr<std::string> ResolveWriteTarget(const std::string& path);

}  // namespace kiln
