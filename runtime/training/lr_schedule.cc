#include "runtime/training/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kiln {

double LrSchedule::At(int64_t step) const {
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  double progress = std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

LrSchedule LrSchedule::Default(double peak_lr, int64_t horizon) {
  return {.peak_lr = peak_lr, .min_lr = peak_lr / 10, .warmup_steps = std::min<int64_t>(10, horizon / 10 + 1),
          .total_steps = horizon};
}

}  // namespace kiln
