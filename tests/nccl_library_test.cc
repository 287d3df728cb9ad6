// NCCL loaded at run time (runtime/distributed/nccl.h): a missing library is an error that
// names it and what dlopen said; where libnccl.so.2 is installed (the CUDA toolkit ships it
// here, CI may lack it: the test then skips), it loads and reports its version, and a failed
// call's error names the call and the rank. No GPU is needed: nothing here makes a
// communicator. (That kiln never links NCCL: tests/cli_binary_deps_test.cc.)
#include <gtest/gtest.h>

#include "absl/strings/match.h"

#if KILN_WITH_CUDA
#include "runtime/distributed/nccl.h"
#endif

namespace kiln {
namespace {

#if KILN_WITH_CUDA

TEST(NcclLibrary, AMissingLibraryIsANamedError) {
  absl::StatusOr<std::unique_ptr<NcclLibrary>> nccl = NcclLibrary::Load("/nonexistent/libnccl-missing.so.2");
  ASSERT_FALSE(nccl.ok());
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kNotFound);
  const std::string message(nccl.status().message());
  EXPECT_TRUE(absl::StrContains(message, "NCCL not found")) << message;
  EXPECT_TRUE(absl::StrContains(message, "dlopen(\"/nonexistent/libnccl-missing.so.2\")")) << message;
  EXPECT_TRUE(absl::StrContains(message, "No such file or directory")) << message;  // dlerror()'s words
}

TEST(NcclLibrary, ALibraryWithoutNcclIsANamedError) {
  // libm is on every machine and has none of NCCL's symbols.
  absl::StatusOr<std::unique_ptr<NcclLibrary>> nccl = NcclLibrary::Load("libm.so.6");
  ASSERT_FALSE(nccl.ok());
  EXPECT_TRUE(absl::StrContains(nccl.status().message(), "libm.so.6 has no ncclGetVersion")) << nccl.status();
}

TEST(NcclLibrary, LoadsTheInstalledLibraryAndReadsItsVersion) {
  absl::StatusOr<std::unique_ptr<NcclLibrary>> nccl = NcclLibrary::Load();
  if (!nccl.ok()) GTEST_SKIP() << "no NCCL on this machine: " << nccl.status();
  EXPECT_EQ((*nccl)->path(), "libnccl.so.2");
  absl::StatusOr<int> code = (*nccl)->Version();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_GE(*code, 20000) << "NCCL 2.x codes its version as major*10000 + minor*100 + patch";
  absl::StatusOr<std::string> version = (*nccl)->VersionString();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_TRUE(absl::StartsWith(*version, "2.")) << *version;
}

TEST(NcclLibrary, ErrorsNameTheCallAndTheRank) {
  absl::StatusOr<std::unique_ptr<NcclLibrary>> nccl = NcclLibrary::Load();
  if (!nccl.ok()) GTEST_SKIP() << "no NCCL on this machine: " << nccl.status();
  EXPECT_TRUE((*nccl)->CallStatus(ncclSuccess, "ncclAllReduce", 1).ok());
  absl::Status s = (*nccl)->CallStatus(ncclInvalidArgument, "ncclAllReduce", 1);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StartsWith(s.message(), "ncclAllReduce (rank 1): ")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "(ncclResult_t 4)")) << s;
  absl::Status unranked = (*nccl)->CallStatus(ncclSystemError, "ncclGetUniqueId", -1);
  EXPECT_TRUE(absl::StartsWith(unranked.message(), "ncclGetUniqueId: ")) << unranked;
}

#else

TEST(NcclLibrary, NeedsTheCudaBuild) { GTEST_SKIP() << "built without the CUDA toolkit: no NCCL loader"; }

#endif

}  // namespace
}  // namespace kiln
