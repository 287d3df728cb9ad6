// Learning-rate schedule: linear warmup, then cosine decay to min_lr. Computed on the host
// and fed to the step function as an input (the step graph stays the same every step).
#pragma once

#include <cstdint>

namespace kiln {

struct LrSchedule {
  double peak_lr = 3e-3;
  double min_lr = 3e-4;
  int64_t warmup_steps = 10;
  int64_t total_steps = 100;

  // Learning rate for 0-based `step`: (step + 1) / warmup * peak during warmup, then
  // min + (peak - min) (1 + cos(pi * progress)) / 2 with progress from 0 to 1 over the
  // remaining steps.
  double At(int64_t step) const;

  // kiln train's defaults for a peak and a horizon: min lr peak / 10, warmup
  // min(10, horizon / 10 + 1) steps.
  static LrSchedule Default(double peak_lr, int64_t horizon);
};

}  // namespace kiln
