#include "launcher/child_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>

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

}  // namespace
}  // namespace e3
