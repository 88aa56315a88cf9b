// Bad situations end with a clear message and a normal non-zero exit,
// never a hang or a crash: a wrong teacher address, and a teacher that
// goes away mid-stream and stays away (the student waits --teacher_wait_s
// for it, saying so, then gives up).
#include <gtest/gtest.h>

#include <chrono>

#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;

TEST(FailureE2eTest, WrongTeacherAddressFailsClearly) {
  const std::string dir = testing::ScratchDir("wrong_addr");
  auto t0 = std::chrono::steady_clock::now();
  Subprocess student({testing::StudentBinary(), "--teacher=127.0.0.1:1", "--connect_attempts=3",
                      "--initial_backoff_s=0.1", "--metrics_port=-1"},
                     dir + "/student.log");
  auto st = student.Wait(30s);
  ASSERT_TRUE(st.has_value()) << "hung\n" << student.Log();
  ASSERT_TRUE(WIFEXITED(*st)) << "crashed\n" << student.Log();
  EXPECT_EQ(WEXITSTATUS(*st), 1);
  const std::string log = student.Log();
  EXPECT_NE(log.find("127.0.0.1:1 unreachable after 3 attempts"), std::string::npos) << log;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

TEST(FailureE2eTest, TeacherVanishingMidStreamIsWaitedForThenReported) {
  const std::string dir = testing::ScratchDir("vanish");
  Subprocess teacher({testing::TeacherBinary(), "--model_dir=" + kSrc + "/examples/tiny-code-llama",
                      "--data=" + kSrc + "/examples/data/train_conversations.jsonl", "--max_samples=200",
                      "--max_seq_len=128", "--tokens_per_batch=256", "--draft_vocab_size=256",
                      "--listen=127.0.0.1:0", "--port_file=" + dir + "/port", "--threads=1"},
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");
  Subprocess student({testing::StudentBinary(), "--teacher=127.0.0.1:" + port, "--connect_attempts=3",
                      "--teacher_wait_s=3", "--initial_backoff_s=0.2", "--log_every=1", "--metrics_port=-1",
                      "--threads=1"},
                     dir + "/student.log");
  for (int i = 0; i < 1200 && student.Log().find("step 2/") == std::string::npos; ++i) {
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_NE(student.Log().find("step 2/"), std::string::npos) << student.Log();
  teacher.Signal(SIGKILL);
  auto st = student.Wait(60s);
  ASSERT_TRUE(st.has_value()) << "student hung after the teacher died\n" << student.Log();
  ASSERT_TRUE(WIFEXITED(*st)) << "student crashed\n" << student.Log();
  EXPECT_EQ(WEXITSTATUS(*st), 1);
  const std::string log = student.Log();
  EXPECT_NE(log.find("unreachable"), std::string::npos) << "no wait was announced\n" << log;
  EXPECT_NE(log.find("--teacher_wait_s=3"), std::string::npos) << log;
  EXPECT_NE(log.find("student_trainer: error: "), std::string::npos) << log;
  EXPECT_NE(log.find("127.0.0.1:" + port), std::string::npos) << log;
}

}  // namespace
}  // namespace e3
