// File helpers shared by every layer (the IR is the lowest layer that reads files).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// The whole file; NotFound names the path, other failures say why (errno text).
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `contents` to a temporary file beside `path`, flushes it, and renames it over
// `path`: a reader sees the old file or the new one, never a torn one.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace kiln
