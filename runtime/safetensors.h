// The safetensors file format (https://github.com/huggingface/safetensors), read and written
// with HostTensor values:
//
//   [u64 little-endian N][N bytes of JSON header, space-padded][data buffer]
//   header: {"__metadata__": {"k": "v"}, "name": {"dtype": "BF16", "shape": [2, 3],
//            "data_offsets": [begin, end]}, ...}   offsets are relative to the data buffer
//
// The decoder treats its input as hostile: every length, offset and shape is checked before
// use, and a bad file yields an error naming the file and the tensor, never a crash.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/host_tensor.h"

namespace kiln {

struct NamedTensor {
  std::string name;
  HostTensor tensor;
};

struct Safetensors {
  std::vector<NamedTensor> tensors;  // in file order (by data offset)
  std::map<std::string, std::string> metadata;
};

// Encodes each tensor in its own dtype (F32, BF16, F16, F8_E4M3, F8_E5M2, I32, I64, BOOL),
// little-endian, the header padded with spaces to a multiple of 8 bytes (as the Python
// library does) and data offsets contiguous in tensor order. Fails on duplicate names and
// on the reserved name "__metadata__".
absl::StatusOr<std::string> EncodeSafetensors(const Safetensors& st);

// `source_name` (usually the path) prefixes every error. Besides kiln's own dtypes, F64
// tensors are accepted and read as f32.
absl::StatusOr<Safetensors> DecodeSafetensors(absl::string_view bytes, absl::string_view source_name);

// Atomic: on failure the old file, if any, is left as it was.
absl::Status WriteSafetensorsFile(const std::string& path, const Safetensors& st);
absl::StatusOr<Safetensors> ReadSafetensorsFile(const std::string& path);

}  // namespace kiln
