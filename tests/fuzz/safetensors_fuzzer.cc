// Fuzz target for the safetensors decoder: any input decodes to tensors that encode and
// decode again to the same names, types and values, or gives an error naming the source.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "runtime/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kiln::Safetensors> st = kiln::DecodeSafetensors(bytes, "fuzz.safetensors");
  if (!st.ok()) {
    if (!absl::StartsWith(st.status().message(), "fuzz.safetensors: ")) {
      kiln::fuzz::Fail("safetensors_fuzzer", "an error that does not name the file", std::string(st.status().message()));
    }
    return 0;
  }
  absl::StatusOr<std::string> encoded = kiln::EncodeSafetensors(*st);
  if (!encoded.ok()) return 0;  // names or metadata the encoder refuses (not valid UTF-8): said, not crashed
  absl::StatusOr<kiln::Safetensors> again = kiln::DecodeSafetensors(*encoded, "re-encoded");
  if (!again.ok()) kiln::fuzz::Fail("safetensors_fuzzer", "re-encoded tensors do not decode", std::string(again.status().message()));
  if (again->tensors.size() != st->tensors.size() || again->metadata != st->metadata) {
    kiln::fuzz::Fail("safetensors_fuzzer", "the round trip changed the file", "");
  }
  for (size_t i = 0; i < st->tensors.size(); ++i) {
    const kiln::NamedTensor& a = st->tensors[i];
    const kiln::NamedTensor& b = again->tensors[i];
    if (a.name != b.name || a.tensor.type() != b.tensor.type()) {
      kiln::fuzz::Fail("safetensors_fuzzer", "the round trip changed a tensor", a.name);
    }
  }
  return 0;
}
