// The student's wait for a teacher that went away: backoff doubling up to
// its cap, a limit that ends the wait with an error naming
// --teacher_wait_s, and a fresh start once the teacher is back.
#include "student_trainer/feed/teacher_wait.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

namespace e3 {
namespace {

using ::testing::HasSubstr;

TeacherWaitOptions WaitOptions() {
  TeacherWaitOptions o;
  o.address = "10.0.0.7:50051";
  o.limit = absl::Milliseconds(300);
  o.initial_backoff = absl::Milliseconds(10);
  o.max_backoff = absl::Milliseconds(40);
  return o;
}

TEST(TeacherWaitTest, BacksOffToItsCapThenGivesUpNamingTheFlag) {
  TeacherWait wait(WaitOptions());
  EXPECT_FALSE(wait.away());
  std::vector<absl::Duration> pauses;
  for (int i = 0; i < 4; ++i) {
    auto pause = wait.Failed("connection refused", "0:7");
    ASSERT_TRUE(pause.ok()) << pause.status();
    pauses.push_back(*pause);
  }
  EXPECT_TRUE(wait.away());
  EXPECT_EQ(pauses, (std::vector<absl::Duration>{absl::Milliseconds(10), absl::Milliseconds(20),
                                                 absl::Milliseconds(40), absl::Milliseconds(40)}));
  std::this_thread::sleep_for(std::chrono::milliseconds(320));
  auto over = wait.Failed("connection refused", "0:7");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("teacher at 10.0.0.7:50051 lost"));
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("--teacher_wait_s=0.3"));
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("last error: connection refused"));
}

TEST(TeacherWaitTest, ATeacherThatIsBackStartsTheClockAndBackoffAgain) {
  TeacherWait wait(WaitOptions());
  ASSERT_TRUE(wait.Failed("reset", "0:1").ok());
  ASSERT_TRUE(wait.Failed("reset", "0:1").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  wait.Accepted("0:1");
  EXPECT_FALSE(wait.away());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // 400 ms since the first failure, but only this one counts now.
  auto pause = wait.Failed("reset", "0:3");
  ASSERT_TRUE(pause.ok()) << pause.status();
  EXPECT_EQ(*pause, absl::Milliseconds(10));
}

}  // namespace
}  // namespace e3
