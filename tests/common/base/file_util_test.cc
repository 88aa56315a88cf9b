// WriteFileAtomically on real files: it replaces a file whole, and a write
// that fails (here the file size limit, as a full disk would) keeps the old
// file, leaves no temporary behind and says how far it got.
#include "common/base/file_util.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

namespace e3 {
namespace {

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = MakeTempDir("file_util_test_");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  void TearDown() override { (void)RemoveAll(dir_); }
  std::string dir_;
};

TEST_F(FileUtilTest, WriteFileAtomicallyReplacesTheWholeFile) {
  const std::string path = JoinPath(dir_, "state.json");
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second, longer").ok());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "second, longer");
  auto entries = ListDir(dir_);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, std::vector<std::string>{"state.json"}) << "no temporary left";
}

// In a child process, whose file size limit (RLIMIT_FSIZE, SIGXFSZ
// ignored, so write() returns EFBIG) stands in for a full disk.
TEST_F(FileUtilTest, AFailedWriteKeepsTheOldFile) {
  const std::string path = JoinPath(dir_, "weights.bin");
  ASSERT_TRUE(WriteFileAtomically(path, "old contents").ok());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(3);
    const absl::Status st = WriteFileAtomically(path, std::string(1 << 20, 'x'));
    const bool named = std::string(st.message()).find("4096 of 1048576 bytes") != std::string::npos;
    ::_exit(st.code() == absl::StatusCode::kDataLoss && named ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the write did not fail as DataLoss naming how far it got";
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "old contents");
  auto entries = ListDir(dir_);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, std::vector<std::string>{"weights.bin"}) << "no temporary left";
}

}  // namespace
}  // namespace e3
