// SIGTERM to the teacher and both student ranks at the same moment, as
// Slurm's scancel (or a Kubernetes delete) sends it: the students finish
// their step, agree to stop, checkpoint and export, and the draining
// teacher keeps taking their final commits, so that its ledger holds
// exactly the batches in the students' last checkpoint, no more, no less.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>
#include <sstream>

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


// Global batch indices the ledger shows committed, per rank.
std::map<int, std::multiset<int64_t>> Commits(const std::string& path) {
  std::map<int, std::multiset<int64_t>> out;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || j["event"] != "commit") continue;
    out[j["rank"].get<int>()].insert(j["index"].get<int64_t>());
  }
  return out;
}

TEST(SigtermE2eTest, StudentsCheckpointAndTheDrainingTeacherRecordsTheirFinalCommit) {
  const std::string dir = testing::ScratchDir("sigterm_e2e");
  Subprocess teacher(testing::TinyTeacherArgv(dir, {"--max_samples=200", "--max_seq_len=192", "--tokens_per_batch=384",
                                                    "--draft_vocab_size=256", "--ledger=" + dir + "/ledger.jsonl",
                                                    "--metrics_port=-1"}),
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");
  const std::string master_port = std::to_string(FreePort());
  std::vector<std::unique_ptr<Subprocess>> students;
  for (int r = 0; r < 2; ++r) {
    students.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{testing::StudentBinary(), "--teacher=127.0.0.1:" + port, "--rank=" + std::to_string(r),
                                 "--world_size=2", "--master_port=" + master_port, "--lr=2e-3",
                                 "--checkpoint_dir=" + dir + "/ckpt", "--checkpoint_every=3",
                                 "--output_dir=" + dir + "/export", "--summary_json=" + dir + "/summary" +
                                 std::to_string(r) + ".json", "--log_every=1", "--threads=1", "--metrics_port=-1",
                                 "--credit_window=2"},
        dir + "/student" + std::to_string(r) + ".log"));
  }
  // After the first periodic checkpoint (step 3: three commits per rank),
  // everyone gets SIGTERM at once.
  bool ready = false;
  for (int i = 0; i < 2400 && !ready; ++i) {
    auto c = Commits(dir + "/ledger.jsonl");
    ready = c[0].size() >= 3 && c[1].size() >= 3;
    if (!ready) std::this_thread::sleep_for(50ms);
    for (auto& s : students) ASSERT_TRUE(s->running()) << s->Log();
  }
  ASSERT_TRUE(ready) << "no checkpoint committed in 120 s\n" << students[0]->Log();
  teacher.Signal(SIGTERM);
  for (auto& s : students) s->Signal(SIGTERM);

  int64_t steps = -1;
  for (int r = 0; r < 2; ++r) {
    auto st = students[r]->Wait(60s);
    ASSERT_TRUE(st.has_value()) << "rank " << r << " did not stop within 60 s of SIGTERM\n" << students[r]->Log();
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << students[r]->Log();
    EXPECT_NE(students[r]->Log().find("stopped by signal after checkpointing"), std::string::npos)
        << students[r]->Log();
    auto summary = nlohmann::json::parse(ReadFile(dir + "/summary" + std::to_string(r) + ".json"));
    EXPECT_TRUE(summary["stopped_by_signal"].get<bool>());
    if (r == 0) steps = summary["steps"].get<int64_t>();
    EXPECT_EQ(summary["steps"].get<int64_t>(), steps) << "the ranks stopped at different steps";
  }
  auto tst = teacher.Wait(30s);
  ASSERT_TRUE(tst.has_value()) << "teacher did not drain\n" << teacher.Log();
  EXPECT_TRUE(WIFEXITED(*tst) && WEXITSTATUS(*tst) == 0) << teacher.Log();
  // No rank was given up on, whether the final commits arrived before the
  // teacher began to wait or while it waited. The ledger below proves they
  // arrived.
  EXPECT_NE(teacher.Log().find("every draining rank committed its final checkpoint"), std::string::npos)
      << teacher.Log();
  EXPECT_EQ(teacher.Log().find("sent no final commit"), std::string::npos) << teacher.Log();
  EXPECT_TRUE(IsRegularFile(dir + "/export/model.safetensors"));

  // The last checkpoint holds `steps` global batches; the ledger committed
  // exactly those, once each, for each rank.
  std::multiset<int64_t> want;
  for (int64_t i = 0; i < steps; ++i) want.insert(i);
  auto commits = Commits(dir + "/ledger.jsonl");
  for (int r = 0; r < 2; ++r) EXPECT_EQ(commits[r], want) << "rank " << r;
  std::printf("sigterm e2e: both ranks stopped at step %ld; the teacher recorded their final commits\n",
              static_cast<long>(steps));
}

}  // namespace
}  // namespace e3
