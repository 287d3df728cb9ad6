// Fuzz target for .bin token files (raw uint16, or with an llm.c header): any input gives
// a dataset whose tokens are all within its size, or an error naming the file. The reader
// maps files, so each input is written to a temporary file first.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/training/dataset.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = absl::StrCat(tmp ? tmp : "/tmp", "/kiln_llmc_bin_fuzzer.", ::getpid(), ".bin");
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) kiln::fuzz::Fail("llmc_bin_fuzzer", "cannot create", path);
  if (size > 0 && std::fwrite(data, 1, size, f) != size) kiln::fuzz::Fail("llmc_bin_fuzzer", "cannot write", path);
  std::fclose(f);
  absl::StatusOr<kiln::TokenDataset> d = kiln::TokenDataset::FromFile(path);
  if (!d.ok()) {
    if (!absl::StrContains(d.status().message(), path)) {
      kiln::fuzz::Fail("llmc_bin_fuzzer", "an error that does not name the file", std::string(d.status().message()));
    }
  } else {
    if (d->size() * 2 > static_cast<int64_t>(size)) kiln::fuzz::Fail("llmc_bin_fuzzer", "more tokens than bytes", "");
    int max_token = 0;
    for (int64_t i = 0; i < d->size(); ++i) max_token = std::max<int>(max_token, d->token(i));
    if (max_token != d->max_token()) kiln::fuzz::Fail("llmc_bin_fuzzer", "max_token disagrees with the tokens", "");
  }
  std::remove(path.c_str());
  return 0;
}
