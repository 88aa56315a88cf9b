// Kill the student (SIGKILL, no chance to clean up) between checkpoints and
// restart it from its checkpoint directory. The teacher's ledger must show
// that every sample of the epoch was committed exactly once: none lost,
// none trained twice into surviving weights, although some batches were
// delivered twice.
#include <gtest/gtest.h>

#include <chrono>

#include "tests/e2e/ledger_scan.h"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::Subprocess;

constexpr int kSamples = 60;

using testing::LedgerScan;
LedgerScan Scan(const std::string& path) { return testing::ScanLedger(path); }

std::vector<std::string> StudentArgs(const std::string& port, const std::string& dir) {
  return {testing::StudentBinary(), "--teacher=127.0.0.1:" + port, "--lr=1e-3", "--checkpoint_dir=" + dir + "/ckpt",
          "--checkpoint_every=4", "--output_dir=" + dir + "/export", "--summary_json=" + dir + "/summary.json",
          "--log_every=2", "--threads=1", "--credit_window=3"};
}

TEST(ResumeE2eTest, KilledStudentResumesWithNoSampleLostOrTrainedTwice) {
  const std::string dir = testing::ScratchDir("resume_e2e");
  Subprocess teacher(testing::TinyTeacherArgv(dir, {"--max_samples=" + std::to_string(kSamples), "--max_seq_len=192",
                                                    "--tokens_per_batch=384", "--draft_vocab_size=256",
                                                    "--ledger=" + dir + "/ledger.jsonl", "--exit_when_done",
                                                    "--subscriber_timeout_s=2"}),
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");

  {
    Subprocess first(StudentArgs(port, dir), dir + "/student1.log");
    // Wait until a checkpoint committed through batch 7 and at least two
    // more batches went out, then kill without warning.
    bool ready = false;
    for (int i = 0; i < 2400 && !ready; ++i) {
      LedgerScan s = Scan(dir + "/ledger.jsonl");
      ready = s.max_committed_index >= 7 && s.deliveries >= s.max_committed_index + 3;
      if (!ready) std::this_thread::sleep_for(100ms);
      ASSERT_TRUE(first.running()) << first.Log();
    }
    ASSERT_TRUE(ready) << "no checkpoint committed in 240 s\n" << first.Log();
    first.Signal(SIGKILL);
    ASSERT_TRUE(first.Wait(10s).has_value());
  }
  LedgerScan at_kill = Scan(dir + "/ledger.jsonl");

  Subprocess second(StudentArgs(port, dir), dir + "/student2.log");
  auto st = second.Wait(300s);
  ASSERT_TRUE(st.has_value()) << "restarted student did not finish\n" << second.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << second.Log();
  EXPECT_NE(second.Log().find("resumed from"), std::string::npos) << second.Log();
  auto tst = teacher.Wait(30s);
  ASSERT_TRUE(tst.has_value()) << teacher.Log();

  LedgerScan end = Scan(dir + "/ledger.jsonl");
  std::printf("resume e2e: killed after commit through batch %ld with %ld deliveries; %ld redeliveries in all\n",
              static_cast<long>(at_kill.max_committed_index), static_cast<long>(at_kill.deliveries),
              static_cast<long>(end.redeliveries));
  EXPECT_GT(end.redeliveries, 0) << "the kill should have cost some uncommitted batches";
  ASSERT_EQ(end.committed.size(), static_cast<size_t>(kSamples)) << "samples lost";
  for (const auto& [sample, times] : end.committed) EXPECT_EQ(times, 1) << "sample " << sample;
  const std::string tlog = teacher.Log();
  EXPECT_NE(tlog.find("\"samples_committed_twice\":0"), std::string::npos) << tlog;
  EXPECT_NE(tlog.find("\"samples_never_committed\":0"), std::string::npos) << tlog;
}

}  // namespace
}  // namespace e3
