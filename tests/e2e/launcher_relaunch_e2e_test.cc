// One run directory across launches of e3_launch, on the CPU: a run
// killed with everything it started (SIGKILL to its process group, as a
// crash would) and launched again resumes from its checkpoint with every
// sample committed exactly once; a launcher killed alone takes its
// processes along; a second launcher on a directory in use is refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/launcher_run.h"
#include "tests/e2e/ledger_scan.h"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::Launcher;
using testing::ReadFile;
using testing::Subprocess;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Waits up to `timeout` for `path` while `launch` runs; false if it ended
// or the time ran out.
bool WaitForFileWhileRunning(Subprocess& launch, const std::string& path,
                             std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!PathExists(path)) {
    if (launch.Wait(0ms).has_value() || Clock::now() > deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

// A run that goes on for minutes unless stopped: its processes are still
// busy whenever the test acts.
testing::TinyRunLength LongRun() {
  testing::TinyRunLength length;
  length.max_samples = 60;
  length.epochs = 50;
  length.max_steps = 0;
  return length;
}

TEST(LauncherRelaunchE2eTest, ARunKilledWithItsProcessesResumesExactlyOnce) {
  const std::string dir = testing::ScratchDir("launcher_relaunch");
  testing::TinyRunLength length;
  length.max_samples = 60;
  length.max_steps = 0;  // to the end of the data
  length.checkpoint_every = 3;
  const std::string config = testing::WriteTinyRunConfig(dir, length);
  const std::string out = dir + "/run";
  const std::vector<std::string> argv = {Launcher(), "--config=" + config, "--status_every_s=1",
                                         "--noplot"};
  testing::SubprocessLimits own_group;
  own_group.own_process_group = true;
  {
    Subprocess first(argv, dir + "/launch1.log", own_group);
    ASSERT_TRUE(WaitForFileWhileRunning(first, out + "/checkpoints/latest", 180s))
        << "no checkpoint while the first launch ran\n"
        << first.Log();
    // The whole group at once, the launcher included: nothing drains.
    ASSERT_EQ(::kill(-first.pid(), SIGKILL), 0);
    ASSERT_TRUE(first.Wait(10s).has_value());
  }
  const testing::LedgerScan at_kill = testing::ScanLedger(out + "/ledger-0.jsonl");
  ASSERT_FALSE(at_kill.ExactlyOnce())
      << "the run had ended before the kill: " << at_kill.Describe();

  const auto start = Clock::now();
  Subprocess second(argv, dir + "/launch2.log");
  auto st = second.Wait(300s);
  ASSERT_TRUE(st.has_value()) << "the relaunch did not finish\n" << second.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << second.Log();
  std::printf("relaunch e2e: killed with %s; the relaunch finished in %.1f s\n",
              at_kill.Describe().c_str(), SecondsSince(start));

  // Each start has its own log: the relaunch's in student-0.log, the
  // killed one's rotated to student-0.log.1.
  const std::string now = ReadFile(out + "/student-0.log");
  const std::string before = ReadFile(out + "/student-0.log.1");
  EXPECT_NE(now.find("resumed from"), std::string::npos) << now;
  EXPECT_FALSE(before.empty());
  EXPECT_EQ(before.find("resumed from"), std::string::npos) << before;
  EXPECT_TRUE(PathExists(out + "/teacher-0.log.1"));
  EXPECT_FALSE(PathExists(out + "/student-0.log.2"));
  auto summary = nlohmann::json::parse(ReadFile(out + "/summary-0.json"));
  EXPECT_EQ(summary["resumed"], true) << summary.dump();

  // Exactly once over both teacher processes' records.
  const testing::LedgerScan end = testing::ScanLedger(out + "/ledger-0.jsonl");
  EXPECT_EQ(end.opens, 2) << end.Describe();
  EXPECT_TRUE(end.ExactlyOnce()) << end.Describe();
  EXPECT_EQ(static_cast<int64_t>(end.committed.size()), length.max_samples) << end.Describe();
}

TEST(LauncherRelaunchE2eTest, ALauncherKilledAloneTakesItsProcessesAlong) {
  const std::string dir = testing::ScratchDir("launcher_orphans");
  const std::string config = testing::WriteTinyRunConfig(dir, LongRun());
  Subprocess launch({Launcher(), "--config=" + config, "--noplot"}, dir + "/launch.log");
  // Training, with its signal handlers in place.
  ASSERT_TRUE(WaitForFileWhileRunning(launch, dir + "/run/checkpoints/latest", 120s))
      << launch.Log();
  std::vector<pid_t> children;
  for (auto until = Clock::now() + 10s; children.size() < 2 && Clock::now() < until;) {
    std::this_thread::sleep_for(20ms);
    children = testing::ChildrenOf(launch.pid());
  }
  ASSERT_EQ(children.size(), 2u) << "expected a teacher and a student\n" << launch.Log();
  ASSERT_EQ(::kill(launch.pid(), SIGKILL), 0);
  ASSERT_TRUE(launch.Wait(10s).has_value());
  const auto start = Clock::now();
  // They get SIGTERM, so they drain: the student checkpoints, the teacher
  // takes its final commit (--drain_timeout_s, 20 s, bounds its wait).
  const auto deadline = start + 60s;
  auto all_ended = [&] {
    for (pid_t pid : children) {
      if (!testing::Ended(pid)) return false;
    }
    return true;
  };
  while (!all_ended() && Clock::now() < deadline) std::this_thread::sleep_for(100ms);
  const bool ended = all_ended();
  for (pid_t pid : children) {
    if (!testing::Ended(pid)) ::kill(pid, SIGKILL);
  }
  ASSERT_TRUE(ended) << "a process outlived its launcher by 60 s";
  std::printf("orphans e2e: the launcher's processes ended %.1f s after it\n", SecondsSince(start));
  EXPECT_NE(ReadFile(dir + "/run/student-0.log").find("stopped by signal"), std::string::npos)
      << ReadFile(dir + "/run/student-0.log");
}

TEST(LauncherRelaunchE2eTest, ASecondLauncherOnARunDirectoryInUseIsRefused) {
  const std::string dir = testing::ScratchDir("launcher_locked");
  const std::string config = testing::WriteTinyRunConfig(dir, LongRun());
  const std::string out = dir + "/run";
  Subprocess first({Launcher(), "--config=" + config, "--noplot"}, dir + "/launch1.log");
  ASSERT_TRUE(WaitForFileWhileRunning(first, out + "/teacher-0.log", 60s)) << first.Log();

  const auto start = Clock::now();
  Subprocess second({Launcher(), "--config=" + config, "--noplot"}, dir + "/launch2.log");
  auto st = second.Wait(30s);
  ASSERT_TRUE(st.has_value()) << "the second launcher did not give up\n" << second.Log();
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 2) << second.Log();
  EXPECT_EQ(second.Log(), absl::StrCat("e3_launch: error: ", out, " is in use by e3_launch pid ",
                                       first.pid(), "\n"));
  std::printf("lock e2e: refused after %.1f s\n", SecondsSince(start));
  // It touched nothing of the first launch's.
  EXPECT_FALSE(PathExists(out + "/teacher-0.log.1"));
  EXPECT_TRUE(first.Wait(0ms) == std::nullopt) << first.Log();

  first.Signal(SIGTERM);
  auto fst = first.Wait(90s);
  ASSERT_TRUE(fst.has_value()) << first.Log();
  EXPECT_TRUE(WIFEXITED(*fst) && WEXITSTATUS(*fst) == 130) << first.Log();
}

}  // namespace
}  // namespace e3
