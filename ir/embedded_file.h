// Files embedded in the binary at build time (cmake/EmbedFiles.cmake): the default
// training corpus, kernel templates. Looked up by their path relative to the source root.
#pragma once

#include <cstddef>

#include "absl/strings/string_view.h"

namespace kiln {

struct EmbeddedFile {
  const char* path;
  const unsigned char* data;
  size_t size;  // without the trailing NUL the generator appends
  absl::string_view contents() const { return {reinterpret_cast<const char*>(data), size}; }
};

}  // namespace kiln
