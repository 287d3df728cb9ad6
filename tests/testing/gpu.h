// For GPU tests: the process's one CudaDevice, and KILN_REQUIRE_GPU(), which skips a test
// with the reason (no driver, no device) where kernels cannot run, as on CI.
#pragma once

#include <memory>

#include <gtest/gtest.h>

#include "runtime/cuda/device.h"

namespace kiln::testing {

// Opened once, on first use; nullptr when no GPU is usable.
inline CudaDevice* TestDevice() {
  static CudaDevice* device = [] {
    absl::StatusOr<std::unique_ptr<CudaDevice>> d = CudaDevice::Open();
    return d.ok() ? d->release() : nullptr;
  }();
  return device;
}

}  // namespace kiln::testing

#define KILN_REQUIRE_GPU()                                                                 \
  do {                                                                                     \
    if (absl::Status available = ::kiln::CudaDevice::Available(); !available.ok()) {      \
      GTEST_SKIP() << "no GPU to run kernels on: " << available.message();                 \
    }                                                                                      \
    ASSERT_NE(::kiln::testing::TestDevice(), nullptr) << ::kiln::CudaDevice::Open().status(); \
  } while (0)
