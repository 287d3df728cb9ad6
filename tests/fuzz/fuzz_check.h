// What a fuzz target does when an invariant breaks: print what and abort, which libFuzzer
// records as a crash and the corpus test (fuzz_driver.cc) as a failure.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln::fuzz {

[[noreturn]] inline void Fail(const char* target, const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s\n%s\n", target, what, detail.c_str());
  std::abort();
}

}  // namespace kiln::fuzz
