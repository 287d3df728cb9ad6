// Fuzz target for the protobuf JSON reader: any input gives a module that writes and reads
// back to the same text, or an error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ir/proto_io.h"
#include "ir/text_format.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<kiln::Module>> module = kiln::ModuleFromProtoJson(json);
  if (!module.ok()) {
    if (module.status().message().empty()) kiln::fuzz::Fail("ir_json_fuzzer", "empty error message", "");
    return 0;
  }
  const std::string text = kiln::PrintModule(**module);
  absl::StatusOr<std::string> written = kiln::ModuleToProtoJson(**module);
  if (!written.ok()) kiln::fuzz::Fail("ir_json_fuzzer", "a module read cannot be written", text);
  absl::StatusOr<std::unique_ptr<kiln::Module>> again = kiln::ModuleFromProtoJson(*written);
  if (!again.ok()) kiln::fuzz::Fail("ir_json_fuzzer", "a written module does not read back", text);
  if (kiln::PrintModule(**again) != text) kiln::fuzz::Fail("ir_json_fuzzer", "the round trip changed the module", text);
  return 0;
}
