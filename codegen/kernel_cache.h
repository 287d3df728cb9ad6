// On-disk cache of compiled kernels, keyed by a hash of (source, options, arch, NVRTC
// version). Directory: $KILN_CACHE_DIR, else ~/.cache/kiln. Safe with several processes
// writing at once (write to a temp file, then rename) and with a corrupted or truncated
// entry (each entry carries a length and checksum; a bad one is reported as a miss, removed,
// and rebuilt by the caller).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

class KernelCache {
 public:
  // Creates the directory if needed. `dir` empty: $KILN_CACHE_DIR, else ~/.cache/kiln.
  static absl::StatusOr<KernelCache> Open(std::string dir = "");
  const std::string& dir() const { return dir_; }

  // A key for these inputs (hex, stable across runs and machines).
  static std::string Key(absl::string_view source, absl::string_view options, absl::string_view arch,
                         absl::string_view nvrtc_version);
  // The cached bytes, or nullopt on a miss (a corrupted entry counts as a miss and is removed).
  std::optional<std::string> Lookup(absl::string_view key) const;
  absl::Status Store(absl::string_view key, absl::string_view bytes) const;

 private:
  explicit KernelCache(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace kiln
