#include "student_trainer/optim/lr_schedule.h"

#include <gtest/gtest.h>

namespace e3 {
namespace {

TEST(LrScheduleTest, WarmupThenCosineToTheFloor) {
  LrSchedule s{/*peak=*/1e-3, /*min_ratio=*/0.1, /*warmup_steps=*/10, /*total_steps=*/110};
  EXPECT_DOUBLE_EQ(s.At(0), 1e-4);   // first step is 1/10 of the peak, never 0
  EXPECT_DOUBLE_EQ(s.At(9), 1e-3);   // warmup ends at the peak
  EXPECT_DOUBLE_EQ(s.At(10), 1e-3);  // cosine starts at the peak
  EXPECT_NEAR(s.At(60), 0.55e-3, 1e-12);  // halfway: (peak + floor) / 2
  EXPECT_NEAR(s.At(110), 1e-4, 1e-12);    // the floor
  EXPECT_NEAR(s.At(500), 1e-4, 1e-12);    // stays there
  for (int64_t i = 11; i < 110; ++i) EXPECT_LE(s.At(i), s.At(i - 1));
}

TEST(LrScheduleTest, NoTotalKeepsThePeak) {
  LrSchedule s{2e-4, 0.1, 0, 0};
  EXPECT_DOUBLE_EQ(s.At(0), 2e-4);
  EXPECT_DOUBLE_EQ(s.At(1000), 2e-4);
}

TEST(LrScheduleTest, FromTheScheduleSection) {
  ScheduleSettings schedule;  // the declared defaults
  schedule.lr = 3e-4;
  schedule.min_lr_ratio = 0.25;
  schedule.warmup_ratio = 0.1;
  const LrSchedule by_ratio = LrSchedule::From(schedule, 200);
  EXPECT_EQ(by_ratio.peak, 3e-4);
  EXPECT_EQ(by_ratio.min_ratio, 0.25);
  EXPECT_EQ(by_ratio.total_steps, 200);
  EXPECT_EQ(by_ratio.warmup_steps, 20);
  schedule.warmup_steps = 7;  // a count overrides the ratio
  EXPECT_EQ(LrSchedule::From(schedule, 200).warmup_steps, 7);
}

}  // namespace
}  // namespace e3
