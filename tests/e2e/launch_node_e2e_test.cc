// The one-node launcher (tools/launch_node.sh) as a user runs it: two
// teacher devices (each a teacher_server serving one data shard) and two
// student devices (a data-parallel pair of student_trainer ranks, each
// subscribed to both teachers), here all on the CPU. The command returns
// 0; the ranks step in lockstep; rank 0 exports; each teacher's ledger
// shows its shard committed exactly once. The second test runs one teacher
// sharded with tensor parallelism over two (CPU) devices: two
// teacher_server processes on a Gloo group, rank 0 serving.
#include <gtest/gtest.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"
#include "tests/free_port.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;

TEST(LaunchNodeE2eTest, TwoTeachersAndTwoStudentRanksFromOneCommand) {
  const std::string dir = testing::ScratchDir("launch_node_e2e");
  Subprocess launch({"/bin/bash", kSrc + "/tools/launch_node.sh", "--build_dir", testing::BuildDir(),
                     "--teacher_devices", "cpu,cpu", "--student_devices", "cpu,cpu", "--model_dir",
                     kSrc + "/examples/tiny-code-llama", "--data", kSrc + "/examples/data/train_conversations.jsonl",
                     "--out", dir + "/run", "--master_port", std::to_string(testing::FreePort()), "--teacher_args",
                     "--max_samples=80 --max_seq_len=256 --tokens_per_batch=256 --draft_vocab_size=512 --threads=1",
                     "--student_args", "--lr=2e-3 --warmup_steps=2 --log_every=5 --threads=1 --checkpoint_every=10"},
                    dir + "/launch.log");
  auto st = launch.Wait(360s);
  ASSERT_TRUE(st.has_value()) << "launcher did not finish\n" << launch.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << launch.Log();
  EXPECT_NE(launch.Log().find("2 teacher(s) of TP=1 at 127.0.0.1:"), std::string::npos) << launch.Log();

  auto s0 = nlohmann::json::parse(ReadFile(dir + "/run/summary-0.json"));
  auto s1 = nlohmann::json::parse(ReadFile(dir + "/run/summary-1.json"));
  std::printf("launch_node e2e: %ld steps per rank, rank 0 loss %.3f -> %.3f\n",
              static_cast<long>(s0["steps"].get<int64_t>()), s0["first"]["loss"].get<double>(),
              s0["last"]["loss"].get<double>());
  EXPECT_EQ(s0["steps"], s1["steps"]);
  EXPECT_GE(s0["steps"].get<int64_t>(), 10);
  EXPECT_TRUE(IsRegularFile(dir + "/run/draft/model.safetensors"));
  for (int i = 0; i < 2; ++i) {
    const std::string tlog = ReadFile(dir + "/run/teacher-" + std::to_string(i) + ".log");
    EXPECT_NE(tlog.find("\"samples_committed_twice\":0"), std::string::npos) << tlog;
    EXPECT_NE(tlog.find("\"samples_never_committed\":0"), std::string::npos) << tlog;
  }
}

// Runs the launcher with one teacher of TP=`tp` over `tp` CPU devices and
// two student ranks; returns rank 0's summary.
nlohmann::json LaunchWithTeacherTp(int tp, const std::string& dir) {
  EXPECT_TRUE(MakeDirs(dir).ok());
  std::string devices = "cpu";
  for (int i = 1; i < tp; ++i) devices += ",cpu";
  Subprocess launch({"/bin/bash", kSrc + "/tools/launch_node.sh", "--build_dir", testing::BuildDir(),
                     "--teacher_devices", devices, "--teacher_tp", std::to_string(tp), "--student_devices",
                     "cpu,cpu", "--model_dir", kSrc + "/examples/tiny-code-llama", "--data",
                     kSrc + "/examples/data/train_conversations.jsonl", "--out", dir + "/run", "--master_port",
                     std::to_string(testing::FreePort()), "--teacher_args",
                     "--max_samples=60 --max_seq_len=256 --tokens_per_batch=256 --draft_vocab_size=512 --threads=1",
                     "--student_args", "--lr=2e-3 --warmup_steps=2 --log_every=5 --threads=1"},
                    dir + "/launch.log");
  auto st = launch.Wait(300s);
  EXPECT_TRUE(st.has_value() && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << launch.Log();
  EXPECT_NE(launch.Log().find(absl::StrCat("1 teacher(s) of TP=", tp, " at 127.0.0.1:")), std::string::npos)
      << launch.Log();
  const std::string tlog = ReadFile(dir + "/run/teacher-0.log");
  EXPECT_NE(tlog.find("\"samples_committed_twice\":0"), std::string::npos) << tlog;
  EXPECT_NE(tlog.find("\"samples_never_committed\":0"), std::string::npos) << tlog;
  if (!IsRegularFile(dir + "/run/summary-0.json")) return nlohmann::json::object();
  return nlohmann::json::parse(ReadFile(dir + "/run/summary-0.json"));
}

TEST(LaunchNodeE2eTest, ATensorParallelTeacherTrainsLikeAnUnshardedOne) {
#ifdef E3_HAS_CUDA
  GTEST_SKIP() << "a CPU tensor-parallel teacher needs Gloo, which pip's LibTorch lacks";
#endif
  const std::string dir = testing::ScratchDir("launch_node_tp_e2e");
  const nlohmann::json tp2 = LaunchWithTeacherTp(2, dir + "/tp2");
  // The students learn the teacher's layout from GetInfo.
  EXPECT_NE(ReadFile(dir + "/tp2/run/student-0.log").find("(TP=2, EP=1)"), std::string::npos);
  const std::string follower = ReadFile(dir + "/tp2/run/teacher-0-rank1.log");
  EXPECT_NE(follower.find("leader shut down after"), std::string::npos) << follower;
  const nlohmann::json tp1 = LaunchWithTeacherTp(1, dir + "/tp1");
  ASSERT_FALSE(tp2.empty() || tp1.empty());
  std::printf("student rank 0 behind a TP=2 teacher: %ld steps, loss %.6f -> %.6f, acc_0 %.4f -> %.4f\n"
              "                behind a TP=1 teacher: %ld steps, loss %.6f -> %.6f, acc_0 %.4f -> %.4f\n",
              static_cast<long>(tp2["steps"].get<int64_t>()), tp2["first"]["loss"].get<double>(),
              tp2["last"]["loss"].get<double>(), tp2["first"]["acc"][0].get<double>(),
              tp2["last"]["acc"][0].get<double>(), static_cast<long>(tp1["steps"].get<int64_t>()),
              tp1["first"]["loss"].get<double>(), tp1["last"]["loss"].get<double>(),
              tp1["first"]["acc"][0].get<double>(), tp1["last"]["acc"][0].get<double>());
  EXPECT_EQ(tp2["steps"], tp1["steps"]);
  EXPECT_GE(tp2["steps"].get<int64_t>(), 10);
  EXPECT_GT(tp2["last"]["acc"][0].get<double>(), tp2["first"]["acc"][0].get<double>());
  // The same data in the same order, states equal to ~1e-6 (fp32 TP
  // reduction order): the training must agree to far better than 1e-3.
  for (const char* w : {"first", "last"}) {
    EXPECT_NEAR(tp2[w]["loss"].get<double>(), tp1[w]["loss"].get<double>(), 1e-3 * tp1[w]["loss"].get<double>());
    for (int j = 0; j < 7; ++j) {
      EXPECT_NEAR(tp2[w]["acc"][j].get<double>(), tp1[w]["acc"][j].get<double>(), 1e-3) << w << " acc_" << j;
    }
  }
}

}  // namespace
}  // namespace e3
