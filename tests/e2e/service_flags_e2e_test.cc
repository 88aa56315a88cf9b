// The services' flags as a user gives them: deprecated spellings still
// work with a warning, an old and a new spelling together are refused, and
// a run config with a bad key stops a service naming the file and key.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;

// Runs `argv` to its end (bounded) and returns its output; `status` gets
// the exit code.
std::string RunToEnd(const std::vector<std::string>& argv, const std::string& log, int* status) {
  Subprocess p(argv, log);
  auto st = p.Wait(60s);
  EXPECT_TRUE(st.has_value()) << "still running after 60 s\n" << p.Log();
  *status = st.has_value() && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
  return p.Log();
}

TEST(ServiceFlagsE2eTest, AnOldSpellingIsAcceptedWithAWarning) {
  const std::string dir = testing::ScratchDir("flags_old_spelling");
  int status = 0;
  // (service_flags_test checks the value reaches the new flag.) Nothing
  // listens on port 1: the student fails to connect, after reading
  // its flags.
  const std::string log = RunToEnd({testing::StudentBinary(), "--teacher=127.0.0.1:1", "--seed=5",
                                    "--connect_attempts=1", "--metrics_port=-1"},
                                   dir + "/student.log", &status);
  EXPECT_EQ(status, 1) << log;
  EXPECT_NE(log.find("student_trainer: warning: --seed is deprecated; use --init_seed"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("127.0.0.1:1 unreachable"), std::string::npos) << log;
}

TEST(ServiceFlagsE2eTest, BothSpellingsTogetherAreRefused) {
  const std::string dir = testing::ScratchDir("flags_both_spellings");
  int status = 0;
  const std::string log = RunToEnd({testing::TeacherBinary(), "--model_dir=x", "--data=y",
                                    "--max_credit_window=4", "--credit_window=8"},
                                   dir + "/teacher.log", &status);
  EXPECT_EQ(status, 2) << log;
  EXPECT_NE(
      log.find(
          "teacher_server: error: --max_credit_window and --credit_window are the same flag; give "
          "only --credit_window"),
      std::string::npos)
      << log;
}

TEST(ServiceFlagsE2eTest, ABadRunConfigStopsAServiceNamingFileAndKey) {
  const std::string dir = testing::ScratchDir("flags_bad_config");
  const std::string config = dir + "/run.yaml";
  std::ofstream(config) << "schedule:\n  credit_window: many\n";
  int status = 0;
  const std::string teacher =
      RunToEnd({testing::TeacherBinary(), "--config=" + config}, dir + "/teacher.log", &status);
  EXPECT_EQ(status, 2) << teacher;
  EXPECT_NE(
      teacher.find("teacher_server: error: " + config +
                   ": schedule.credit_window: expected an integer in [1, 1024], got \"many\""),
      std::string::npos)
      << teacher;
  const std::string student =
      RunToEnd({testing::StudentBinary(), "--config=" + config}, dir + "/student.log", &status);
  EXPECT_EQ(status, 2) << student;
  EXPECT_NE(student.find("student_trainer: error: " + config + ": schedule.credit_window:"),
            std::string::npos)
      << student;
}

}  // namespace
}  // namespace e3
