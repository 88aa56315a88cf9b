#include "student_trainer/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace e3 {

double LrSchedule::At(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (total_steps <= warmup_steps) return peak;
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) /
                                         static_cast<double>(total_steps - warmup_steps), 0.0, 1.0);
  const double floor = peak * min_ratio;
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(M_PI * progress));
}

LrSchedule LrSchedule::From(const ScheduleSettings& schedule, int64_t planned) {
  LrSchedule lr;
  lr.peak = schedule.lr;
  lr.min_ratio = schedule.min_lr_ratio;
  lr.total_steps = planned;
  lr.warmup_steps = schedule.warmup_steps >= 0 ? schedule.warmup_steps
                                               : static_cast<int64_t>(schedule.warmup_ratio * planned);
  return lr;
}

}  // namespace e3
