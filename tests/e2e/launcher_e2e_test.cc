// e3_launch as a user runs it, on the CPU: a run of the bundled model
// from a YAML config (the teacher and the student read the same resolved
// file), its --plan, and processes that die early, reported within
// seconds with the end of their log while the others are stopped.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/launcher_run.h"
#include "tests/e2e/subprocess.h"
#include "tests/free_port.h"
#include "tests/wait_for.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

using testing::Launcher;

std::string WriteConfig(const std::string& dir) { return testing::WriteTinyRunConfig(dir); }

TEST(LauncherE2eTest, TrainsTheBundledModelFromAYamlConfig) {
  const std::string dir = testing::ScratchDir("launcher_run");
  const std::string config = WriteConfig(dir);
  const int teacher_metrics = testing::FreePort(), student_metrics = testing::FreePort();
  Subprocess launch({Launcher(), "--config=" + config, "--status_every_s=1", "schedule.lr=3e-3",
                     absl::StrCat("teachers.metrics_port=", teacher_metrics),
                     absl::StrCat("students.metrics_port=", student_metrics)},
                    dir + "/launch.log");
  auto st = launch.Wait(300s);
  ASSERT_TRUE(st.has_value()) << "launcher did not finish\n" << launch.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << launch.Log();
  const std::string log = launch.Log();
  // Authenticated by default: a fresh token only this user reads.
  struct stat token {};
  ASSERT_EQ(::stat((dir + "/run/auth_token").c_str(), &token), 0);
  EXPECT_EQ(token.st_mode & 0777, 0600u);
  const std::string teacher_log = ReadFile(dir + "/run/teacher-0.log");
  EXPECT_NE(teacher_log.find(absl::StrCat("(metrics on :", teacher_metrics, "), ")),
            std::string::npos)
      << teacher_log;
  EXPECT_NE(teacher_log.find("peers checked by a shared token"), std::string::npos) << teacher_log;
  EXPECT_NE(ReadFile(dir + "/run/student-0.log")
                .find(absl::StrCat("student[0]: metrics on :", student_metrics)),
            std::string::npos);
  EXPECT_NE(log.find("e3_launch: 1 teacher(s) of TP=1 at 127.0.0.1:"), std::string::npos) << log;
  // Live status lines: the student's progress appears as it trains.
  EXPECT_NE(log.find("e3_launch: student-0        cpu     running"), std::string::npos) << log;
  EXPECT_NE(log.find("=== student[0] summary: 6 steps"), std::string::npos) << log;

  // Both services read the resolved config, the override included.
  const std::string resolved = ReadFile(dir + "/run/run.yaml");
  EXPECT_NE(resolved.find("lr: \"0.003\""), std::string::npos) << resolved;
  const std::string teacher = ReadFile(dir + "/run/teacher-0.log");
  EXPECT_NE(teacher.find("teacher: config " + dir + "/run/run.yaml"), std::string::npos) << teacher;
  EXPECT_NE(teacher.find("draft vocab 256 of 8192"), std::string::npos) << teacher;
  auto summary = nlohmann::json::parse(ReadFile(dir + "/run/summary-0.json"));
  EXPECT_EQ(summary["steps"], 6);
  EXPECT_TRUE(IsRegularFile(dir + "/run/draft/model.safetensors"));
  EXPECT_TRUE(IsRegularFile(dir + "/run/checkpoints/latest"));

  // The curves, drawn at the end from the student's step log.
  const std::string png = ReadFile(dir + "/run/run.png");
  ASSERT_GT(png.size(), 8u) << log;
  EXPECT_EQ(png.substr(0, 8), "\x89PNG\r\n\x1a\n");
  auto panels = nlohmann::json::parse(ReadFile(dir + "/run/run.png.json"))["panels"];
  EXPECT_EQ(panels.size(), 6u);
  EXPECT_EQ(panels[0], "loss");
}

TEST(LauncherE2eTest, PlanPrintsTheLayoutAndStartsNothing) {
  const std::string dir = testing::ScratchDir("launcher_plan");
  const std::string config = WriteConfig(dir);
  Subprocess plan({Launcher(), "--config=" + config, "--plan", "students.devices=cpu,cpu"},
                  dir + "/plan.log");
  auto st = plan.Wait(30s);
  ASSERT_TRUE(st.has_value() && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << plan.Log();
  const std::string out = plan.Log();
  for (const char* needle :
       {"LlamaForCausalLM, L=8, H=256", "2 data-parallel rank(s); batch 256 tokens per rank",
        "student-1        cpu      RANK=1 WORLD_SIZE=2", "memory per device"}) {
    EXPECT_NE(out.find(needle), std::string::npos) << needle << "\n" << out;
  }
  EXPECT_FALSE(PathExists(dir + "/run")) << "--plan started something";
  EXPECT_NE(out.find("c10d rendezvous through " + dir + "/run/rendezvous/students."),
            std::string::npos)
      << out;

  // Every missing input at once, each with its key.
  Subprocess missing({Launcher(), "--config=" + config, "--plan", "model.dir=/nonexistent/model",
                      "data.train=/nonexistent/train.jsonl"},
                     dir + "/missing.log");
  auto mst = missing.Wait(30s);
  ASSERT_TRUE(mst.has_value() && WIFEXITED(*mst) && WEXITSTATUS(*mst) == 2) << missing.Log();
  EXPECT_NE(missing.Log().find("e3_launch: error: " + config +
                               ": model.dir: /nonexistent/model: not a directory\n"
                               "e3_launch: error: " +
                               config + ": data.train: /nonexistent/train.jsonl: no such file\n"),
            std::string::npos)
      << missing.Log();

  Subprocess bad({Launcher(), "--config=" + config, "--plan", "teachers.tp=two"}, dir + "/bad.log");
  auto bst = bad.Wait(30s);
  ASSERT_TRUE(bst.has_value() && WIFEXITED(*bst) && WEXITSTATUS(*bst) == 2) << bad.Log();
  EXPECT_NE(bad.Log().find(
                "e3_launch: error: override 'teachers.tp=two': teachers.tp: expected an integer in "
                "[1, 1024], got \"two\""),
            std::string::npos)
      << bad.Log();
}

// Runs the launcher on a run that fails; returns its log after checking
// that it ended with status 1 within `bound`.
std::string LaunchFailing(const std::string& dir, const std::string& override_arg,
                          std::chrono::seconds bound) {
  const auto start = std::chrono::steady_clock::now();
  Subprocess launch({Launcher(), "--config=" + WriteConfig(dir), override_arg},
                    dir + "/launch.log");
  auto st = launch.Wait(120s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(st.has_value()) << "the launcher hung\n" << launch.Log();
  if (!st.has_value()) return launch.Log();
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << launch.Log();
  EXPECT_LT(seconds, bound.count()) << launch.Log();
  std::printf("launcher reported the failure after %.1f s\n", seconds);
  return launch.Log();
}

TEST(LauncherE2eTest, ATeacherThatDiesIsReportedAtOnceWithItsLog) {
  const std::string dir = testing::ScratchDir("launcher_teacher_dies");
  // The teacher loads the model, then finds no data: it exits 1 after a
  // second or two, long before it would serve.
  const std::string log = LaunchFailing(dir, "teachers.args=--data=/nonexistent/train.jsonl", 30s);
  EXPECT_NE(log.find("e3_launch: teacher-0 (pid "), std::string::npos) << log;
  EXPECT_NE(log.find(") failed (exit 1) after "), std::string::npos) << log;
  EXPECT_NE(log.find("  | teacher_server: error: "), std::string::npos) << log;
  EXPECT_NE(log.find("/nonexistent/train.jsonl"), std::string::npos) << log;
  EXPECT_EQ(log.find("student rank(s)"), std::string::npos)
      << "students started without a teacher\n"
      << log;
}

TEST(LauncherE2eTest, AStudentThatDiesStopsTheTeacher) {
  const std::string dir = testing::ScratchDir("launcher_student_dies");
  // The student connects and fetches the weights, then refuses a flag.
  const std::string log = LaunchFailing(dir, "students.args=--ttt_positions=diagonal", 60s);
  EXPECT_NE(log.find("e3_launch: student-0 (pid "), std::string::npos) << log;
  EXPECT_NE(log.find("  | student_trainer: error: "), std::string::npos) << log;
  EXPECT_NE(log.find("e3_launch: stopping the other processes"), std::string::npos) << log;
  // The teacher drained on SIGTERM: its ledger is in its log.
  EXPECT_NE(ReadFile(dir + "/run/teacher-0.log").find("teacher: ledger"), std::string::npos);
}

// A teacher that also serves a named student group outlives this run's
// student: the launcher waits while a student launched apart trains in
// the group, and ends when the teacher, every group done, exits.
TEST(LauncherE2eTest, TeachersKeepServingStudentGroupsUntilTheyAreDone) {
  const std::string dir = testing::ScratchDir("launcher_student_groups");
  testing::TinyRunLength length;
  length.max_samples = 24;
  length.max_steps = 0;  // to the end of the data: the teacher can tell when the run's group is done
  const std::string config = testing::WriteTinyRunConfig(dir, length);
  Subprocess launch({Launcher(), "--config=" + config, "--status_every_s=1", "teachers.student_groups=extra"},
                    dir + "/launch.log");
  ASSERT_TRUE(testing::WaitFor(
      [&] { return launch.Log().find("the teachers keep serving student groups extra") != std::string::npos; },
      240s))
      << launch.Log();
  EXPECT_FALSE(launch.Wait(2s).has_value()) << "the launcher left before the group trained\n" << launch.Log();
  const std::string port = ReadFile(dir + "/run/teacher-0.port");
  const std::string extra = dir + "/extra";
  ASSERT_TRUE(MakeDirs(extra).ok());
  Subprocess student({testing::StudentBinary(), "--config=" + dir + "/run/run.yaml", "--device=cpu",
                      "--auth_token_file=" + dir + "/run/auth_token", "--teacher=127.0.0.1:" + port,
                      "--student_group=extra", "--checkpoint_dir=" + extra + "/checkpoints",
                      "--output_dir=" + extra + "/draft", "--summary_json=" + extra + "/summary.json",
                      "--step_log=" + extra + "/steps.jsonl", "--best_dir=" + extra + "/best",
                      "--tensorboard_dir=" + extra + "/tb", "--metrics_port=-1"},
                     dir + "/extra.log");
  auto student_end = student.Wait(240s);
  ASSERT_TRUE(student_end.has_value() && WIFEXITED(*student_end) && WEXITSTATUS(*student_end) == 0)
      << student.Log();
  auto launch_end = launch.Wait(120s);
  ASSERT_TRUE(launch_end.has_value()) << "the launcher did not end with its teacher\n" << launch.Log();
  EXPECT_TRUE(WIFEXITED(*launch_end) && WEXITSTATUS(*launch_end) == 0) << launch.Log();
  EXPECT_NE(launch.Log().find("e3_launch: done"), std::string::npos) << launch.Log();
  // Both groups trained to the end of the same data.
  const auto mine = nlohmann::json::parse(ReadFile(dir + "/run/summary-0.json"));
  const auto theirs = nlohmann::json::parse(ReadFile(extra + "/summary.json"));
  EXPECT_GT(theirs["steps"].get<int64_t>(), 0);
  EXPECT_EQ(theirs["steps"], mine["steps"]);
}

}  // namespace
}  // namespace e3
