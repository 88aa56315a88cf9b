#include "launcher/run_directory.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "common/base/file_util.h"
#include "launcher/child_process.h"
#include "tests/scratch_dir.h"
#include "tests/wait_for.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;

std::string Read(const std::string& path) { return ReadFileToString(path).value_or("<absent>"); }

// Waits until `pid` runs `program` (ChildProcess::Start returns after the
// fork; the exec, which closes the close-on-exec descriptors, follows).
bool WaitForExec(pid_t pid, const std::string& program) {
  const std::string cmdline = "/proc/" + std::to_string(pid) + "/cmdline";
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (Read(cmdline).rfind(program + '\0', 0) != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(RunDirectoryTest, OneLauncherHoldsTheLockAndIsNamedToTheNext) {
  const std::string out = testing::ScratchDir("run_directory_lock");
  auto first = RunDirectoryLock::Acquire(out);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Read(out + "/e3_launch.lock"), std::to_string(::getpid()) + "\n");
  // flock conflicts between two opens even in one process.
  auto second = RunDirectoryLock::Acquire(out);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(),
            out + " is in use by e3_launch pid " + std::to_string(::getpid()));
  first->reset();
  EXPECT_TRUE(RunDirectoryLock::Acquire(out).ok()) << "released with its holder";
}

TEST(RunDirectoryTest, AStaleLockFileBlocksNothingAndChildrenDoNotHoldTheLock) {
  const std::string out = testing::ScratchDir("run_directory_stale");
  // What a launcher killed with -9 leaves: the file, naming a dead pid.
  std::ofstream(out + "/e3_launch.lock") << "999999999\n";
  auto lock = RunDirectoryLock::Acquire(out);
  ASSERT_TRUE(lock.ok()) << lock.status();
  // A process started while the lock is held does not inherit it: once
  // the launcher lets go, the directory is free although the child runs.
  auto child = ChildProcess::Start({"/bin/sleep", "30"}, {}, out + "/sleep.log");
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(WaitForExec((*child)->pid(), "/bin/sleep"));
  lock->reset();
  EXPECT_TRUE((*child)->Running());
  EXPECT_TRUE(RunDirectoryLock::Acquire(out).ok()) << "the child holds the lock";
}

TEST(RunDirectoryTest, ATokenIsFreshPrivateAndReplacesTheOldFile) {
  const std::string dir = testing::ScratchDir("run_directory_token");
  const std::string path = dir + "/auth_token";
  std::ofstream(path) << "old\n";
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  ASSERT_TRUE(WriteAuthToken(path).ok());
  const std::string first = Read(path);
  EXPECT_EQ(first.size(), 65u) << first;  // 32 bytes in hex, and a newline
  EXPECT_EQ(first.find_first_not_of("0123456789abcdef"), 64u);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_TRUE(WriteAuthToken(path).ok());
  EXPECT_NE(Read(path), first);
  // A link left at the path is replaced, not written through.
  const std::string target = dir + "/elsewhere";
  std::ofstream(target) << "keep\n";
  ASSERT_EQ(::unlink(path.c_str()), 0);
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0);
  ASSERT_TRUE(WriteAuthToken(path).ok());
  EXPECT_EQ(Read(target), "keep\n");
  EXPECT_EQ(Read(path).size(), 65u);
}

TEST(RunDirectoryTest, LogsRotateToTheNextFreeNumber) {
  const std::string dir = testing::ScratchDir("run_directory_logs");
  const std::string log = dir + "/student-0.log";
  auto none = RotateLog(log);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
  std::ofstream(log) << "first start\n";
  EXPECT_EQ(RotateLog(log).value_or(""), log + ".1");
  std::ofstream(log) << "second start\n";
  EXPECT_EQ(RotateLog(log).value_or(""), log + ".2");
  EXPECT_FALSE(PathExists(log));
  EXPECT_EQ(Read(log + ".1"), "first start\n");
  EXPECT_EQ(Read(log + ".2"), "second start\n");
  // A gap is filled; nothing is overwritten.
  ASSERT_EQ(::unlink((log + ".1").c_str()), 0);
  std::ofstream(log) << "third start\n";
  EXPECT_EQ(RotateLog(log).value_or(""), log + ".1");
  EXPECT_EQ(Read(log + ".2"), "second start\n");
}

TEST(RunDirectoryTest, StaleFilesGoAndTheProcessesOfARunAreFound) {
  const std::string dir = testing::ScratchDir("run_directory_stale_files");
  const std::string port = dir + "/teacher-0.port";
  std::ofstream(port) << "43210\n";
  EXPECT_TRUE(RemoveStale(port).ok());
  EXPECT_FALSE(PathExists(port));
  EXPECT_TRUE(RemoveStale(port).ok()) << "an absent file is fine";
  const std::string arg = "--config=" + dir + "/run.yaml";
  auto child = ChildProcess::Start({"/bin/sh", "-c", "sleep 30", "sh", arg}, {}, dir + "/sh.log");
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(WaitForExec((*child)->pid(), "/bin/sh"));
  // The shell forks `sleep`, and until that child execs it is a copy of
  // the shell, arguments included: wait for it to become `sleep`.
  const std::vector<pid_t> just_the_shell = {(*child)->pid()};
  EXPECT_TRUE(testing::WaitFor([&] { return ProcessesWithArgument(arg) == just_the_shell; }))
      << ProcessesWithArgument(arg).size() << " processes carry the argument";
  EXPECT_TRUE(ProcessesWithArgument(arg + "x").empty());
  (*child)->Signal(SIGKILL);
  ASSERT_TRUE((*child)->WaitFor(10s));
  EXPECT_TRUE(ProcessesWithArgument(arg).empty());
}

}  // namespace
}  // namespace e3
