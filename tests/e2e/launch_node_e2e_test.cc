// The one-node launcher (tools/launch_node.sh) as a user runs it: two
// teacher devices (each a teacher_server serving one data shard) and two
// student devices (a data-parallel pair of student_trainer ranks, each
// subscribed to both teachers), here all on the CPU. The command returns
// 0; the ranks step in lockstep; rank 0 exports; each teacher's ledger
// shows its shard committed exactly once.
#include <gtest/gtest.h>

#include <chrono>

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
  EXPECT_NE(launch.Log().find("2 teacher(s) at 127.0.0.1:"), std::string::npos) << launch.Log();

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

}  // namespace
}  // namespace e3
