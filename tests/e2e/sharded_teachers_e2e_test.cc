// N teachers feeding one student: two teacher processes each serve half of
// the data (--num_data_shards=2); the student takes batches from both,
// round-robin, until both are exhausted. Each teacher's ledger must show
// its whole shard committed exactly once.
#include <gtest/gtest.h>

#include <chrono>

#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;

std::vector<std::string> Teacher(const std::string& dir, int shard) {
  const std::string tag = std::to_string(shard);
  return {testing::TeacherBinary(), "--model_dir=" + kSrc + "/examples/tiny-code-llama",
          "--data=" + kSrc + "/examples/data/train_conversations.jsonl", "--max_samples=40", "--max_seq_len=192",
          "--tokens_per_batch=512", "--draft_vocab_size=256", "--num_data_shards=2", "--data_shard=" + tag,
          "--listen=127.0.0.1:0", "--port_file=" + dir + "/port" + tag, "--exit_when_done", "--threads=1"};
}

TEST(ShardedTeachersE2eTest, OneStudentTrainsOnTwoTeachersShards) {
  const std::string dir = testing::ScratchDir("sharded_e2e");
  Subprocess t0(Teacher(dir, 0), dir + "/teacher0.log");
  Subprocess t1(Teacher(dir, 1), dir + "/teacher1.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port0", 60s)) << t0.Log();
  ASSERT_TRUE(testing::WaitForFile(dir + "/port1", 60s)) << t1.Log();
  const std::string teachers =
      "127.0.0.1:" + testing::ReadPortFile(dir + "/port0") + ",127.0.0.1:" + testing::ReadPortFile(dir + "/port1");
  Subprocess student({testing::StudentBinary(), "--teacher=" + teachers,
                      "--lr=1e-3", "--checkpoint_dir=" + dir + "/ckpt", "--checkpoint_every=5",
                      "--summary_json=" + dir + "/summary.json", "--log_every=5", "--metrics_port=-1", "--threads=1"},
                     dir + "/student.log");
  auto st = student.Wait(300s);
  ASSERT_TRUE(st.has_value()) << student.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << student.Log();
  for (Subprocess* t : {&t0, &t1}) {
    auto ts = t->Wait(30s);
    ASSERT_TRUE(ts.has_value()) << "teacher did not exit when done\n" << t->Log();
    const std::string log = t->Log();
    EXPECT_NE(log.find("serving data shard"), std::string::npos) << log;
    EXPECT_NE(log.find("\"epochs\":1"), std::string::npos) << log;
    EXPECT_NE(log.find("\"samples_committed_twice\":0"), std::string::npos) << log;
    EXPECT_NE(log.find("\"samples_never_committed\":0"), std::string::npos) << log;
    EXPECT_NE(log.find("\"dataset_samples\":20"), std::string::npos) << log;
  }
  auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_GT(summary["steps"].get<int64_t>(), 4);
}

}  // namespace
}  // namespace e3
