// A whole file mapped read-only: readers of big files (datasets, weights) look at its bytes
// without copying them into memory first. Unmapped when the last holder lets go.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

class MappedFile {
 public:
  // NotFound names a missing path; a directory or device is refused (only regular files
  // can be mapped); an empty file maps to no bytes.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  absl::string_view bytes() const { return {static_cast<const char*>(addr_), length_}; }

 private:
  MappedFile() = default;
  void* addr_ = nullptr;
  size_t length_ = 0;
};

}  // namespace kiln
