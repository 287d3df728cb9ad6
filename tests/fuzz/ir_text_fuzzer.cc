// libFuzzer target for the IR text parser: any input must give a module that prints and
// re-parses to the same text, or an error positioned as "<line>:<col>: ". Build and run
// with tests/fuzz/run_ir_text_fuzzer.sh (needs clang with -fsanitize=fuzzer); CMake builds it
// with tests/fuzz/fuzz_driver.cc and ctest runs it over corpus/ir_text and regressions/ir_text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ir/text_format.h"

namespace {

bool IsPositioned(const std::string& message) {
  size_t i = 0;
  auto digits = [&] {
    const size_t begin = i;
    while (i < message.size() && message[i] >= '0' && message[i] <= '9') ++i;
    return i > begin;
  };
  return digits() && i < message.size() && message[i++] == ':' && digits() && message.compare(i, 2, ": ") == 0;
}

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "ir_text_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<kiln::Module>> parsed = kiln::ParseModule(text);
  if (!parsed.ok()) {
    const std::string message(parsed.status().message());
    if (!IsPositioned(message)) Fail("unpositioned error", message);
    return 0;
  }
  const std::string printed = kiln::PrintModule(**parsed);
  absl::StatusOr<std::unique_ptr<kiln::Module>> again = kiln::ParseModule(printed);
  if (!again.ok()) Fail("printed module does not parse", std::string(again.status().message()) + "\n" + printed);
  if (kiln::PrintModule(**again) != printed) Fail("printed module does not round-trip", printed);
  return 0;
}
