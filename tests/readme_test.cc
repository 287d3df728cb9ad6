// The README shows frontends/examples/print_llama/ (which the build compiles, and
// tests/package/ builds against the installed package) and its two commands; this keeps them
// from drifting apart.
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

// The package's CMake snippet is the example project's own, and the install command is there.
TEST(Readme, ShowsTheExampleProjectsCMake) {
  std::string root = KILN_SOURCE_DIR;
  std::string readme = *ReadFileToString(root + "/README.md");
  absl::StatusOr<std::string> cmake = ReadFileToString(root + "/frontends/examples/print_llama/CMakeLists.txt");
  ASSERT_TRUE(cmake.ok()) << cmake.status();
  const std::string open = "```cmake\n";
  size_t begin = readme.find(open);
  ASSERT_NE(begin, std::string::npos) << "README.md has no ```cmake block";
  begin += open.size();
  size_t end = readme.find("```", begin);
  ASSERT_NE(end, std::string::npos);
  std::string snippet = readme.substr(begin, end - begin);
  EXPECT_TRUE(absl::StrContains(snippet, "find_package(kiln CONFIG REQUIRED)")) << snippet;
  EXPECT_TRUE(absl::StrContains(*cmake, snippet))
      << "README.md's ```cmake block must be a verbatim part of frontends/examples/print_llama/CMakeLists.txt:\n"
      << snippet;
  EXPECT_TRUE(absl::StrContains(readme, "cmake --install build --prefix"));
  for (const char* example : {"print_llama", "train_mlp"}) {
    EXPECT_TRUE(absl::StrContains(readme, std::string("`") + example + "/`")) << example;
    EXPECT_TRUE(ReadFileToString(root + "/frontends/examples/" + example + "/CMakeLists.txt").ok()) << example;
  }
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
