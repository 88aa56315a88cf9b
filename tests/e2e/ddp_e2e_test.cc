// Student data parallelism end to end: one teacher_server process and two
// student_trainer processes (RANK 0 and 1 of WORLD_SIZE 2) meeting on a
// c10d store. Each rank subscribes with its own rank and trains its shard;
// gradients are averaged over Gloo every step; rank 0 alone checkpoints and
// exports; the teacher's ledger shows every sample committed exactly once,
// by the rank that owns it.
#include <gtest/gtest.h>

#include <chrono>

#include "common/base/file_util.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"
#include "tests/free_port.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::FreePort;
using testing::ReadFile;
using testing::Subprocess;


TEST(DdpE2eTest, TwoStudentRanksTrainTheirShardsInLockstep) {
  const std::string dir = testing::ScratchDir("ddp_e2e");
  Subprocess teacher(testing::TinyTeacherArgv(dir, {"--max_samples=80", "--max_seq_len=256", "--tokens_per_batch=512",
                                                    "--draft_vocab_size=512", "--ledger=" + dir + "/ledger.jsonl",
                                                    "--exit_when_done"}),
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");
  const std::string master_port = std::to_string(FreePort());
  std::vector<std::unique_ptr<Subprocess>> students;
  for (int r = 0; r < 2; ++r) {
    students.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{testing::StudentBinary(), "--teacher=127.0.0.1:" + port, "--rank=" + std::to_string(r),
                                 "--world_size=2", "--master_port=" + master_port, "--lr=2e-3", "--warmup_steps=2",
                                 "--checkpoint_dir=" + dir + "/ckpt", "--checkpoint_every=10",
                                 "--output_dir=" + dir + "/export", "--summary_json=" + dir + "/summary" +
                                 std::to_string(r) + ".json", "--log_every=5", "--threads=1", "--metrics_port=-1"},
        dir + "/student" + std::to_string(r) + ".log"));
  }
  for (int r = 0; r < 2; ++r) {
    auto st = students[r]->Wait(300s);
    ASSERT_TRUE(st.has_value()) << "rank " << r << " did not finish\n" << students[r]->Log();
    ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << students[r]->Log();
    EXPECT_NE(students[r]->Log().find("data parallel over 2 ranks"), std::string::npos) << students[r]->Log();
  }
  auto tst = teacher.Wait(30s);
  ASSERT_TRUE(tst.has_value()) << "teacher did not exit when done\n" << teacher.Log();
  EXPECT_TRUE(WIFEXITED(*tst) && WEXITSTATUS(*tst) == 0) << teacher.Log();

  auto s0 = nlohmann::json::parse(ReadFile(dir + "/summary0.json"));
  auto s1 = nlohmann::json::parse(ReadFile(dir + "/summary1.json"));
  std::printf("ddp e2e: %ld steps per rank, rank 0 loss %.3f -> %.3f, acc_0 %.3f -> %.3f\n",
              static_cast<long>(s0["steps"].get<int64_t>()), s0["first"]["loss"].get<double>(),
              s0["last"]["loss"].get<double>(), s0["first"]["acc"][0].get<double>(),
              s0["last"]["acc"][0].get<double>());
  EXPECT_EQ(s0["steps"], s1["steps"]) << "ranks step in lockstep";
  EXPECT_GE(s0["steps"].get<int64_t>(), 15);
  EXPECT_LT(s0["last"]["loss"].get<double>(), s0["first"]["loss"].get<double>());
  EXPECT_EQ(s0["export_dir"], dir + "/export");
  EXPECT_EQ(s1["export_dir"], "") << "only rank 0 exports";
  EXPECT_TRUE(IsRegularFile(dir + "/export/model.safetensors"));
  const std::string tlog = teacher.Log();
  EXPECT_NE(tlog.find("\"samples_committed_twice\":0"), std::string::npos) << tlog;
  EXPECT_NE(tlog.find("\"samples_never_committed\":0"), std::string::npos) << tlog;
}

}  // namespace
}  // namespace e3
