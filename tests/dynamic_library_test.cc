// Libraries opened at run time (runtime/dynamic_library.h): a missing one and a missing entry
// point are errors that name them with dlerror()'s words; a found entry point is callable.
#include "runtime/dynamic_library.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/match.h"

namespace kiln {
namespace {

TEST(DynamicLibrary, AMissingLibraryIsANamedError) {
  absl::StatusOr<std::unique_ptr<DynamicLibrary>> lib = DynamicLibrary::Open("/nonexistent/libkiln-missing.so");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(lib.status().message(), "dlopen(\"/nonexistent/libkiln-missing.so\") failed: "))
      << lib.status();
  EXPECT_TRUE(absl::StrContains(lib.status().message(), "No such file or directory")) << lib.status();
}

TEST(DynamicLibrary, EntryPointsResolveByNameOrSayTheyAreMissing) {
  absl::StatusOr<std::unique_ptr<DynamicLibrary>> libm = DynamicLibrary::Open("libm.so.6");
  ASSERT_TRUE(libm.ok()) << libm.status();
  EXPECT_EQ((*libm)->path(), "libm.so.6");
  double (*cosine)(double) = nullptr;
  ASSERT_TRUE((*libm)->Resolve("cos", cosine).ok());
  EXPECT_EQ(cosine(0.0), 1.0);
  absl::Status missing = (*libm)->Resolve("kiln_no_such_symbol", cosine);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(missing.message(), "libm.so.6 has no kiln_no_such_symbol (")) << missing;
}

}  // namespace
}  // namespace kiln
