#include "launcher/child_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "launcher/status_board.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;

std::string Temp(const std::string& name) {
  return testing::ScratchPath(name);
}

TEST(ChildProcessTest, LogsOutputPassesEnvironmentAndReportsTheExit) {
  const std::string log = Temp("child.log");
  auto child =
      ChildProcess::Start({"/bin/sh", "-c", "echo hello $E3_TEST_VALUE; echo oops >&2; exit 3"},
                          {{"E3_TEST_VALUE", "world"}}, log);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->WaitFor(10s));
  EXPECT_FALSE((*child)->Running());
  EXPECT_FALSE((*child)->Succeeded());
  EXPECT_EQ((*child)->DescribeEnd(), "exit 3");
  EXPECT_EQ(TailLines(log, 5), (std::vector<std::string>{"hello world", "oops"}));
}

TEST(ChildProcessTest, ASignalledEndIsNamed) {
  auto child = ChildProcess::Start({"/bin/sleep", "30"}, {}, Temp("sleep.log"));
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_TRUE((*child)->Running());
  (*child)->Signal(SIGKILL);
  ASSERT_TRUE((*child)->WaitFor(10s));
  EXPECT_EQ((*child)->DescribeEnd(), "signal 9 (Killed)");
  auto missing = ChildProcess::Start({"/nonexistent/teacher_server"}, {}, Temp("missing.log"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "/nonexistent/teacher_server: not an executable (build it first?)");
}

// Whether `pid` has ended: gone, or a zombie its new parent has not reaped.
bool Ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t name_end = line.rfind(')');  // the state follows the command's name
  return name_end == std::string::npos || line.compare(name_end + 2, 1, "Z") == 0;
}

TEST(ChildProcessTest, ALauncherKilledWithSigkillTakesItsChildrenAlong) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string log = Temp("orphan.log");
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    auto child = ChildProcess::Start({"/bin/sleep", "60"}, {}, log);
    const pid_t pid = child.ok() ? (*child)->pid() : -1;
    (void)!::write(fds[1], &pid, sizeof(pid));
    while (true) ::pause();  // until the test kills it
  }
  ::close(fds[1]);
  pid_t child = -1;
  ASSERT_EQ(::read(fds[0], &child, sizeof(child)), static_cast<ssize_t>(sizeof(child)));
  ::close(fds[0]);
  ASSERT_GT(child, 0);
  EXPECT_FALSE(Ended(child));
  ::kill(launcher, SIGKILL);
  ASSERT_EQ(::waitpid(launcher, nullptr, 0), launcher);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!Ended(child) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  const bool ended = Ended(child);
  if (!ended) ::kill(child, SIGKILL);
  EXPECT_TRUE(ended) << "the child outlived its launcher by 10 s";
}

TEST(ChildProcessTest, TailLinesShowsWhatATerminalWouldOfProgressLines) {
  const std::string path = Temp("progress.log");
  std::ofstream(path) << "first\nloading 1/3\rloading 2/3\rloading 3/3\r\nlast\r\n\n";
  EXPECT_EQ(TailLines(path, 2), (std::vector<std::string>{"loading 3/3", "last"}));
  EXPECT_EQ(TailLines(path, 10).size(), 3u);
  EXPECT_TRUE(TailLines(Temp("absent.log"), 3).empty());
}

TEST(StatusBoardTest, IntoAFileOnlyChangedLinesArePrinted) {
  const std::string path = Temp("board.txt");
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  StatusBoard board(f, /*terminal=*/false, 0ms);
  ProcessStatus teacher{"teacher-0", "cpu", "serving", 12, "teacher: serving on 0.0.0.0:4000"};
  ProcessStatus student{"student-0", "cpu", "running", 10, "student[0]: step 10/80 | loss 16.1"};
  board.Show({teacher, student});
  student.last_line = "student[0]: step 20/80 | loss 14.2";
  teacher.seconds = 22;  // time alone is no change
  board.Show({teacher, student});
  std::fclose(f);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "e3_launch: teacher-0        cpu     serving          0m12s  teacher: serving on "
            "0.0.0.0:4000");
  EXPECT_NE(lines[2].find("step 20/80"), std::string::npos);
  EXPECT_EQ(FormatStatusLine(student, 30), "student-0        cpu     ru...");
}

TEST(StatusBoardTest, IntoAFileLinesAreNeverCut) {
  const std::string path = Temp("board_long.txt");
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  StatusBoard board(f, /*terminal=*/false, 0ms);
  const std::string last =
      "student[0]: step 120/800 | loss 3.2114 | acc_0 0.612 acc_1 0.488 acc_2 0.391 acc_3 0.322 "
      "acc_4 0.270 acc_5 0.231 acc_6 0.200 | grad 0.412 | lr 9.87e-05 | 41233 tok/s";
  board.Show({{"student-0", "cuda:4", "running", 600, last}}, /*force=*/true);
  std::fclose(f);
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_GT(line.size(), 160u);
  EXPECT_EQ(line.substr(line.size() - last.size()), last);
}

}  // namespace
}  // namespace e3
