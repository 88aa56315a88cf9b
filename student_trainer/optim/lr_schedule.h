// Linear warmup to the peak learning rate, then cosine decay to a floor.
#ifndef E3_STUDENT_TRAINER_OPTIM_LR_SCHEDULE_H_
#define E3_STUDENT_TRAINER_OPTIM_LR_SCHEDULE_H_

#include <cstdint>

#include "common/config/run_config.h"

namespace e3 {

struct LrSchedule {
  double peak = 0;
  double min_ratio = 0;  // floor as a fraction of the peak
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // decay ends here; 0 keeps the peak after warmup

  // Learning rate for 0-based `step` (the step about to run).
  double At(int64_t step) const;

  // The schedule section's, over `planned` steps (warmup_steps, else
  // warmup_ratio of them).
  static LrSchedule From(const ScheduleSettings& schedule, int64_t planned);
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_OPTIM_LR_SCHEDULE_H_
