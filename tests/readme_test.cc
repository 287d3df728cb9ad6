// The README shows frontends/examples/print_llama/print_llama.cc (which the build compiles) and its two
// commands; this keeps them from drifting apart.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "ir/file_util.h"

namespace kiln {
namespace {

TEST(Readme, ShowsTheCompiledExampleVerbatim) {
  absl::StatusOr<std::string> readme = ReadFileToString(std::string(KILN_SOURCE_DIR) + "/README.md");
  absl::StatusOr<std::string> example =
      ReadFileToString(std::string(KILN_SOURCE_DIR) + "/frontends/examples/print_llama/print_llama.cc");
  ASSERT_TRUE(readme.ok()) << readme.status();
  ASSERT_TRUE(example.ok()) << example.status();
  EXPECT_TRUE(absl::StrContains(*readme, "```cpp\n" + *example + "```"))
      << "README.md must quote frontends/examples/print_llama/print_llama.cc verbatim in a ```cpp block";
}

TEST(Readme, NamesTheTwoCommandsThatExist) {
  std::string root = KILN_SOURCE_DIR;
  std::string readme = *ReadFileToString(root + "/README.md");
  for (const char* script : {"scripts/run.sh", "scripts/test.sh"}) {
    EXPECT_TRUE(absl::StrContains(readme, std::string("bash ") + script)) << script;
    EXPECT_TRUE(ReadFileToString(root + "/" + script).ok()) << script;
  }
  std::string ci = *ReadFileToString(root + "/.ci/run");
  EXPECT_TRUE(absl::StrContains(ci, "scripts/test.sh")) << "CI must run the README's test command";
}

}  // namespace
}  // namespace kiln
