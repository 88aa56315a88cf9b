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
#include "common/base/file_util.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"
#include "tests/e2e/upcycled_moe_model.h"
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

// One teacher for LaunchWithTeacher: its model, its TP x EP layout over
// `tp` CPU devices, and extra teacher flags.
struct TeacherLayout {
  int tp = 1;
  int ep = 1;
  std::string model_dir = kSrc + "/examples/tiny-code-llama";
  std::string extra_args;
};

// Runs the launcher with one teacher laid out as `t` and two student ranks;
// returns rank 0's summary.
nlohmann::json LaunchWithTeacher(const TeacherLayout& t, const std::string& dir) {
  EXPECT_TRUE(MakeDirs(dir).ok());
  std::string devices = "cpu";
  for (int i = 1; i < t.tp; ++i) devices += ",cpu";
  Subprocess launch({"/bin/bash", kSrc + "/tools/launch_node.sh", "--build_dir", testing::BuildDir(),
                     "--teacher_devices", devices, "--teacher_tp", std::to_string(t.tp), "--teacher_ep",
                     std::to_string(t.ep), "--student_devices", "cpu,cpu", "--model_dir", t.model_dir, "--data",
                     kSrc + "/examples/data/train_conversations.jsonl", "--out", dir + "/run", "--master_port",
                     std::to_string(testing::FreePort()), "--teacher_args",
                     "--max_samples=60 --max_seq_len=256 --tokens_per_batch=256 --draft_vocab_size=512 --threads=1" +
                         t.extra_args,
                     "--student_args", "--lr=2e-3 --warmup_steps=2 --log_every=5 --threads=1"},
                    dir + "/launch.log");
  auto st = launch.Wait(300s);
  EXPECT_TRUE(st.has_value() && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << launch.Log();
  EXPECT_NE(launch.Log().find(absl::StrCat("1 teacher(s) of TP=", t.tp, " at 127.0.0.1:")), std::string::npos)
      << launch.Log();
  const std::string tlog = ReadFile(dir + "/run/teacher-0.log");
  EXPECT_NE(tlog.find("\"samples_committed_twice\":0"), std::string::npos) << tlog;
  EXPECT_NE(tlog.find("\"samples_never_committed\":0"), std::string::npos) << tlog;
  if (!IsRegularFile(dir + "/run/summary-0.json")) return nlohmann::json::object();
  return nlohmann::json::parse(ReadFile(dir + "/run/summary-0.json"));
}

// Rank 0's training behind two teachers that compute the same function to
// ~1e-6 (fp32; only reduction orders differ) on the same data in the same
// order: it must make progress and agree to far better than 1e-3.
void ExpectTrainsAlike(const nlohmann::json& a, const char* a_name, const nlohmann::json& b, const char* b_name) {
  ASSERT_FALSE(a.empty() || b.empty());
  for (const auto& [s, name] : {std::pair{&a, a_name}, std::pair{&b, b_name}}) {
    std::printf("student rank 0 behind %s: %ld steps, loss %.6f -> %.6f, acc_0 %.4f -> %.4f\n", name,
                static_cast<long>((*s)["steps"].get<int64_t>()), (*s)["first"]["loss"].get<double>(),
                (*s)["last"]["loss"].get<double>(), (*s)["first"]["acc"][0].get<double>(),
                (*s)["last"]["acc"][0].get<double>());
  }
  EXPECT_EQ(a["steps"], b["steps"]);
  EXPECT_GE(a["steps"].get<int64_t>(), 10);
  EXPECT_GT(a["last"]["acc"][0].get<double>(), a["first"]["acc"][0].get<double>());
  for (const char* w : {"first", "last"}) {
    EXPECT_NEAR(a[w]["loss"].get<double>(), b[w]["loss"].get<double>(), 1e-3 * b[w]["loss"].get<double>()) << w;
    for (int j = 0; j < 7; ++j) {
      EXPECT_NEAR(a[w]["acc"][j].get<double>(), b[w]["acc"][j].get<double>(), 1e-3) << w << " acc_" << j;
    }
  }
}

TEST(LaunchNodeE2eTest, ATensorParallelTeacherTrainsLikeAnUnshardedOne) {
#ifdef E3_HAS_CUDA
  GTEST_SKIP() << "a CPU tensor-parallel teacher needs Gloo, which pip's LibTorch lacks";
#endif
  const std::string dir = testing::ScratchDir("launch_node_tp_e2e");
  TeacherLayout tp2_layout;
  tp2_layout.tp = 2;
  const nlohmann::json tp2 = LaunchWithTeacher(tp2_layout, dir + "/tp2");
  // The students learn the teacher's layout from GetInfo.
  EXPECT_NE(ReadFile(dir + "/tp2/run/student-0.log").find("(TP=2, EP=1)"), std::string::npos);
  const std::string follower = ReadFile(dir + "/tp2/run/teacher-0-rank1.log");
  EXPECT_NE(follower.find("leader shut down after"), std::string::npos) << follower;
  const nlohmann::json tp1 = LaunchWithTeacher(TeacherLayout(), dir + "/tp1");
  ExpectTrainsAlike(tp2, "a TP=2 teacher", tp1, "a TP=1 teacher");
}

// A mixture-of-experts teacher on the sgl backend, its experts split over
// two expert-parallel ranks (TP=2, EP=2: each rank holds two whole experts
// and the combine is the TP all-reduce), trains the draft as its dense
// model does: the upcycled model's experts are copies of the dense MLP, so
// the two teachers' states differ only by rounding, while every token goes
// through routing, the grouped experts of its rank and the combine.
TEST(LaunchNodeE2eTest, AnExpertParallelMoeTeacherTrainsLikeItsDenseModel) {
#ifdef E3_HAS_CUDA
  GTEST_SKIP() << "a CPU tensor-parallel teacher needs Gloo, which pip's LibTorch lacks";
#endif
  const std::string dir = testing::ScratchDir("launch_node_moe_e2e");
  TeacherLayout moe;
  moe.tp = 2;
  moe.ep = 2;
  moe.model_dir = testing::UpcycledMoeModel(kSrc + "/examples/tiny-code-llama", /*experts=*/4, /*top_k=*/2,
                                            /*seed=*/7, dir);
  moe.extra_args = " --backend=sgl";
  const nlohmann::json moe_run = LaunchWithTeacher(moe, dir + "/moe");
  EXPECT_NE(ReadFile(dir + "/moe/run/student-0.log").find("(TP=2, EP=2)"), std::string::npos);
  const std::string teacher_log = ReadFile(dir + "/moe/run/teacher-0.log");
  EXPECT_NE(teacher_log.find("backend sgl"), std::string::npos) << teacher_log;
  const nlohmann::json dense = LaunchWithTeacher(TeacherLayout(), dir + "/dense");
  ExpectTrainsAlike(moe_run, "an upcycled MoE teacher, TP=2 EP=2, sgl", dense, "its dense model, TP=1, hf");
  // The draft is exported against the MoE target as against any other.
  EXPECT_TRUE(IsRegularFile(dir + "/moe/run/draft/model.safetensors"));
}

}  // namespace
}  // namespace e3
