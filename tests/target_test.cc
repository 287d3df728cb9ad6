// The Target a compile is for (passes/target.h), and that codegen sizes grids by it.
#include "passes/target.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "codegen/kernel_source.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(Target, NamedArchitecturesGetTheirFamilysNominalValues) {
  absl::StatusOr<Target> hopper = TargetForArch("sm_90a");
  ASSERT_TRUE(hopper.ok()) << hopper.status();
  EXPECT_EQ(hopper->sm_count, 132);
  EXPECT_EQ(hopper->shared_memory_per_block, 227 * 1024);
  EXPECT_TRUE(hopper->has_wgmma && hopper->has_tma && hopper->has_fp8);
  EXPECT_EQ(hopper->ToString(),
            "sm_90a: 132 SMs, 227 KiB shared memory per block, wgmma, tma, fp8 (--target sm_90a, nominal)");
  absl::StatusOr<Target> plain_hopper = TargetForArch("sm_90");
  ASSERT_TRUE(plain_hopper.ok());
  EXPECT_FALSE(plain_hopper->has_wgmma);  // wgmma is one of sm_90a's architecture-specific features
  EXPECT_TRUE(plain_hopper->has_tma);
  absl::StatusOr<Target> ampere = TargetForArch("sm_80");
  ASSERT_TRUE(ampere.ok());
  EXPECT_EQ(ampere->sm_count, 108);
  EXPECT_FALSE(ampere->has_fp8 || ampere->has_tma || ampere->has_wgmma);
  absl::StatusOr<Target> unknown = TargetForArch("sm_91x");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown target architecture 'sm_91x' (known: sm_90a, sm_90,"));
}

TEST(Target, ADeviceIsDescribedByWhatTheRuntimeReports) {
  const Target h100_pcie = TargetForDevice(9, 0, 114, 232448, "device 0, NVIDIA H100 PCIe");
  EXPECT_EQ(h100_pcie.arch, "sm_90a");
  EXPECT_EQ(h100_pcie.sm_count, 114);
  EXPECT_TRUE(h100_pcie.has_wgmma);
  const Target ada = TargetForDevice(8, 9, 142, 101376, "device 1");
  EXPECT_EQ(ada.arch, "sm_89");
  EXPECT_TRUE(ada.has_fp8);
  EXPECT_FALSE(ada.has_wgmma);
}

// Grid-stride grids scale with the SM count instead of assuming one GPU.
TEST(Target, GridStrideGridsScaleWithTheSmCount) {
  Target small = *TargetForArch("sm_90a");
  small.sm_count = 10;
  const Target large = *TargetForArch("sm_90a");
  const int64_t huge = int64_t{1} << 30;
  EXPECT_EQ(codegen::GridFor(huge, 256, small)[0], 10u * 8 * 4);
  EXPECT_EQ(codegen::GridFor(huge, 256, large)[0], 132u * 8 * 4);
  EXPECT_EQ(codegen::GridFor(1000, 256, large)[0], 4u);  // small work: one thread per item
}

}  // namespace
}  // namespace kiln
