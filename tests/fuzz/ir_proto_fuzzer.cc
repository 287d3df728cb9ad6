// Fuzz target for the binary protobuf reader: any input gives a module that writes and
// reads back to the same text, or an error that says where ("at byte N (...)") or what.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ir/proto_io.h"
#include "ir/text_format.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<kiln::Module>> module = kiln::ModuleFromProtoBinary(bytes);
  if (!module.ok()) {
    if (module.status().message().empty()) kiln::fuzz::Fail("ir_proto_fuzzer", "empty error message", "");
    return 0;
  }
  const std::string text = kiln::PrintModule(**module);
  absl::StatusOr<std::string> written = kiln::ModuleToProtoBinary(**module);
  if (!written.ok()) kiln::fuzz::Fail("ir_proto_fuzzer", "a module read cannot be written", text);
  absl::StatusOr<std::unique_ptr<kiln::Module>> again = kiln::ModuleFromProtoBinary(*written);
  if (!again.ok()) kiln::fuzz::Fail("ir_proto_fuzzer", "a written module does not read back", text);
  if (kiln::PrintModule(**again) != text) kiln::fuzz::Fail("ir_proto_fuzzer", "the round trip changed the module", text);
  return 0;
}
