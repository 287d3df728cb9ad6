// The `kiln` binary must start on CI (no GPU, no driver) and on the GPU machine (no Abseil,
// no protobuf): Abseil, protobuf and libstdc++ are linked statically and libcuda never
// (DESIGN.md principle 5), nor libnccl (runtime/distributed/nccl.h dlopens it for `kiln
// train --gpus N`). This reads the binary's dynamic section to hold us to that.
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "tests/testing/run_command.h"

namespace kiln {
namespace {

TEST(KilnBinary, LinksNoForbiddenSharedLibraries) {
  auto r = testing::RunCommand("readelf -d " + testing::Kiln());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> needed;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (absl::StrContains(line, "(NEEDED)")) needed.emplace_back(line);
  }
  ASSERT_FALSE(needed.empty()) << r.output;
  for (const std::string& line : needed) {
    for (const char* forbidden : {"libcuda.so", "libnccl", "libabsl", "libprotobuf", "libstdc++", "libgcc_s"}) {
      EXPECT_FALSE(absl::StrContains(line, forbidden)) << "kiln links " << forbidden << ": " << line;
    }
  }
}

TEST(KilnBinary, StartsAndListsCommandsWithoutAGpu) {
  auto r = testing::RunCommand(testing::Kiln() + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.signal, 0);
}

}  // namespace
}  // namespace kiln
