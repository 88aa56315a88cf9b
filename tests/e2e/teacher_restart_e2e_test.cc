// A teacher that goes away mid-run and comes back does not end the run:
// killed with SIGKILL, or drained with SIGTERM, then restarted on the same
// port and ledger, its students wait (--teacher_wait_s), see the same
// model and data stream in GetInfo, resubscribe at their cursor and
// finish. The ledger, written by both teacher processes, must show every
// sample committed exactly once, and the export must load. Also: one of
// two sharded teachers restarted, and a teacher restarted with other data
// (another --data_seed), which the student refuses, naming what differs.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/model/safetensors.h"
#include "student_trainer/draft/draft_export.h"
#include "tests/e2e/ledger_scan.h"
#include "tests/e2e/subprocess.h"
#include "tests/free_port.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::LedgerScan;
using testing::ScanLedger;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;
constexpr int kSamples = 36;

struct TeacherSpec {
  std::string dir;
  int port = 0;
  std::string tag = "0";  // names its ledger and logs
  int shard = 0, shards = 1;
  std::string data_seed = "42";
};

std::vector<std::string> TeacherArgs(const TeacherSpec& t) {
  return {testing::TeacherBinary(), "--model_dir=" + kSrc + "/examples/tiny-code-llama",
          "--data=" + kSrc + "/examples/data/train_conversations.jsonl", "--max_samples=" + std::to_string(kSamples),
          "--max_seq_len=128", "--tokens_per_batch=256", "--draft_vocab_size=256",
          "--num_data_shards=" + std::to_string(t.shards), "--data_shard=" + std::to_string(t.shard),
          "--data_seed=" + t.data_seed, "--listen=127.0.0.1:" + std::to_string(t.port),
          "--ledger=" + t.dir + "/ledger" + t.tag + ".jsonl", "--exit_when_done", "--subscriber_timeout_s=2",
          "--metrics_port=-1", "--threads=1"};
}

std::vector<std::string> StudentArgs(const std::string& dir, const std::string& teachers) {
  return {testing::StudentBinary(), "--teacher=" + teachers, "--lr=1e-3", "--checkpoint_dir=" + dir + "/ckpt",
          "--checkpoint_every=3", "--output_dir=" + dir + "/export", "--log_every=1", "--threads=1",
          "--credit_window=2", "--teacher_wait_s=120", "--initial_backoff_s=0.2", "--metrics_port=-1",
          "--eval_untrained=false"};
}

// Waits until the teacher on `port` answers (its log says it serves).
bool WaitServing(Subprocess& teacher, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end && !teacher.Wait(0ms).has_value()) {
    if (teacher.Log().find("teacher: serving on") != std::string::npos) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

// Until the ledger holds a commit and at least two deliveries past it:
// the teacher dies with batches delivered and not committed.
bool WaitCommittedWithMoreInFlight(const std::string& ledger, Subprocess& student, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end && !student.Wait(0ms).has_value()) {
    LedgerScan s = ScanLedger(ledger);
    if (s.commits > 0 && s.deliveries >= s.max_committed_index + 3) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

void ExpectExportLoads(const std::string& dir) {
  auto cfg = ReadDraftConfig(dir + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->draft_vocab_size, 256);
  auto weights = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (const char* name : {"fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight", "d2t", "t2d"}) {
    EXPECT_TRUE((*weights)->Get(name).ok()) << name;
  }
}

void ExpectStudentFinished(Subprocess& student) {
  auto st = student.Wait(240s);
  ASSERT_TRUE(st.has_value()) << "the student did not finish\n" << student.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << student.Log();
}

// Kills (or drains) the teacher mid-run, restarts it a moment later, and
// checks that the student finished with the ledger exactly once.
void RestartMidRun(int signal, const std::string& name) {
  const std::string dir = testing::ScratchDir(name);
  TeacherSpec spec{dir, testing::FreePort()};
  auto first = std::make_unique<Subprocess>(TeacherArgs(spec), dir + "/teacher-first.log");
  ASSERT_TRUE(WaitServing(*first, 120s)) << first->Log();
  Subprocess student(StudentArgs(dir, "127.0.0.1:" + std::to_string(spec.port)), dir + "/student.log");
  ASSERT_TRUE(WaitCommittedWithMoreInFlight(dir + "/ledger0.jsonl", student, 180s)) << student.Log();
  const LedgerScan at_stop = ScanLedger(dir + "/ledger0.jsonl");
  first->Signal(signal);
  auto st = first->Wait(30s);
  ASSERT_TRUE(st.has_value()) << first->Log();
  if (signal == SIGTERM) {
    ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << first->Log();
    EXPECT_NE(first->Log().find("draining"), std::string::npos) << first->Log();
  }
  // The student waits for it, saying so.
  for (int i = 0; i < 200 && student.Log().find("unreachable") == std::string::npos; ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(student.Log().find("127.0.0.1:" + std::to_string(spec.port) + " unreachable"), std::string::npos)
      << student.Log();
  ASSERT_FALSE(student.Wait(0ms).has_value()) << student.Log();

  Subprocess second(TeacherArgs(spec), dir + "/teacher-second.log");
  ExpectStudentFinished(student);
  auto ts = second.Wait(30s);
  ASSERT_TRUE(ts.has_value()) << "the restarted teacher did not see every commit\n" << second.Log();
  const std::string slog = student.Log();
  EXPECT_NE(slog.find("is back after"), std::string::npos) << slog;
  EXPECT_NE(second.Log().find("ledger " + dir + "/ledger0.jsonl: a world of 1"), std::string::npos) << second.Log();

  const LedgerScan end = ScanLedger(dir + "/ledger0.jsonl");
  std::printf("%s: stopped after %ld commits with %ld deliveries; at the end %s\n", name.c_str(),
              static_cast<long>(at_stop.commits), static_cast<long>(at_stop.deliveries), end.Describe().c_str());
  EXPECT_EQ(end.opens, 2);
  EXPECT_EQ(end.dataset_samples, kSamples);
  EXPECT_TRUE(end.ExactlyOnce()) << end.Describe();
  EXPECT_NE(second.Log().find("\"samples_committed_twice\":0"), std::string::npos) << second.Log();
  EXPECT_NE(second.Log().find("\"samples_never_committed\":0"), std::string::npos) << second.Log();
  ExpectExportLoads(dir + "/export");
}

TEST(TeacherRestartE2eTest, KilledTeacherRestartsAndTheStudentFinishesExactlyOnce) {
  RestartMidRun(SIGKILL, "teacher_kill_restart");
}

TEST(TeacherRestartE2eTest, DrainedTeacherRestartsAndTheStudentFinishesExactlyOnce) {
  RestartMidRun(SIGTERM, "teacher_drain_restart");
}

TEST(TeacherRestartE2eTest, OneOfTwoShardedTeachersRestarts) {
  const std::string dir = testing::ScratchDir("teacher_restart_sharded");
  TeacherSpec a{dir, testing::FreePort(), "0", 0, 2};
  TeacherSpec b{dir, testing::FreePort(), "1", 1, 2};
  Subprocess ta(TeacherArgs(a), dir + "/teacher0.log");
  auto tb = std::make_unique<Subprocess>(TeacherArgs(b), dir + "/teacher1-first.log");
  ASSERT_TRUE(WaitServing(ta, 120s)) << ta.Log();
  ASSERT_TRUE(WaitServing(*tb, 120s)) << tb->Log();
  Subprocess student(
      StudentArgs(dir, "127.0.0.1:" + std::to_string(a.port) + ",127.0.0.1:" + std::to_string(b.port)),
      dir + "/student.log");
  ASSERT_TRUE(WaitCommittedWithMoreInFlight(dir + "/ledger1.jsonl", student, 180s)) << student.Log();
  tb->Signal(SIGKILL);
  ASSERT_TRUE(tb->Wait(30s).has_value());
  std::this_thread::sleep_for(500ms);
  Subprocess tb2(TeacherArgs(b), dir + "/teacher1-second.log");
  ExpectStudentFinished(student);
  for (Subprocess* t : {&ta, &tb2}) ASSERT_TRUE(t->Wait(30s).has_value()) << t->Log();
  for (const char* tag : {"0", "1"}) {
    const LedgerScan s = ScanLedger(dir + "/ledger" + std::string(tag) + ".jsonl");
    std::printf("sharded restart: teacher %s: %s\n", tag, s.Describe().c_str());
    EXPECT_EQ(s.dataset_samples, kSamples / 2);
    EXPECT_TRUE(s.ExactlyOnce()) << "teacher " << tag << ": " << s.Describe();
  }
  EXPECT_NE(student.Log().find("127.0.0.1:" + std::to_string(b.port) + " is back after"), std::string::npos)
      << student.Log();
  ExpectExportLoads(dir + "/export");
}

std::vector<std::string> WithGrace(std::vector<std::string> args, const std::string& seconds) {
  args.push_back("--exit_grace_s=" + seconds);
  return args;
}

// The end-of-run gap: a teacher killed after the last commit, before its
// students learnt that the data ended, is restarted on a complete ledger.
// It waits (--exit_grace_s) for them to come back for the end instead of
// exiting at once and leaving them waiting for a teacher that is gone;
// the grace bounds the wait when nobody comes.
TEST(TeacherRestartE2eTest, TeacherRestartedAfterTheLastCommitWaitsForItsStudentsToLearnTheEnd) {
  const std::string dir = testing::ScratchDir("teacher_restart_after_end");
  TeacherSpec spec{dir, testing::FreePort()};
  const std::string address = "127.0.0.1:" + std::to_string(spec.port);
  {
    Subprocess first(TeacherArgs(spec), dir + "/teacher-first.log");
    ASSERT_TRUE(WaitServing(first, 120s)) << first.Log();
    Subprocess student(StudentArgs(dir, address), dir + "/student-first.log");
    ExpectStudentFinished(student);
    auto st = first.Wait(30s);
    ASSERT_TRUE(st.has_value()) << first.Log();
    EXPECT_NE(first.Log().find("has the end of its data; exiting"), std::string::npos) << first.Log();
  }
  Subprocess second(WithGrace(TeacherArgs(spec), "120"), dir + "/teacher-second.log");
  ASSERT_TRUE(WaitServing(second, 120s)) << second.Log();
  std::this_thread::sleep_for(1s);
  ASSERT_FALSE(second.Wait(0ms).has_value()) << "exited before its student learnt the end\n" << second.Log();
  EXPECT_NE(second.Log().find("waiting up to 120 s (--exit_grace_s)"), std::string::npos) << second.Log();
  // The student comes back from its last checkpoint (at the end of the
  // data), is handed the end, and finishes; then the teacher exits.
  Subprocess again(StudentArgs(dir, address), dir + "/student-again.log");
  ExpectStudentFinished(again);
  auto ts = second.Wait(30s);
  ASSERT_TRUE(ts.has_value()) << second.Log();
  EXPECT_TRUE(WIFEXITED(*ts) && WEXITSTATUS(*ts) == 0) << second.Log();
  EXPECT_NE(second.Log().find("has the end of its data; exiting"), std::string::npos) << second.Log();

  Subprocess third(WithGrace(TeacherArgs(spec), "1"), dir + "/teacher-third.log");
  auto t3 = third.Wait(120s);
  ASSERT_TRUE(t3.has_value()) << third.Log();
  EXPECT_TRUE(WIFEXITED(*t3) && WEXITSTATUS(*t3) == 0) << third.Log();
  EXPECT_NE(third.Log().find("not every rank came back for the end of its data within 1 s"), std::string::npos)
      << third.Log();
  const LedgerScan end = ScanLedger(dir + "/ledger0.jsonl");
  EXPECT_EQ(end.dataset_samples, kSamples);
  EXPECT_TRUE(end.ExactlyOnce()) << end.Describe();
}

TEST(TeacherRestartE2eTest, TeacherRestartedWithOtherDataStopsTheStudentNamingWhatDiffers) {
  const std::string dir = testing::ScratchDir("teacher_restart_other_data");
  TeacherSpec spec{dir, testing::FreePort()};
  auto first = std::make_unique<Subprocess>(TeacherArgs(spec), dir + "/teacher-first.log");
  ASSERT_TRUE(WaitServing(*first, 120s)) << first->Log();
  Subprocess student(StudentArgs(dir, "127.0.0.1:" + std::to_string(spec.port)), dir + "/student.log");
  ASSERT_TRUE(WaitCommittedWithMoreInFlight(dir + "/ledger0.jsonl", student, 180s)) << student.Log();
  first->Signal(SIGKILL);
  ASSERT_TRUE(first->Wait(30s).has_value());
  spec.data_seed = "7";  // the same file, another order: batch k is other samples
  spec.tag = "-other";
  Subprocess second(TeacherArgs(spec), dir + "/teacher-second.log");
  auto st = student.Wait(120s);
  ASSERT_TRUE(st.has_value()) << "the student kept waiting\n" << student.Log();
  ASSERT_TRUE(WIFEXITED(*st)) << student.Log();
  EXPECT_EQ(WEXITSTATUS(*st), 1) << student.Log();
  const std::string log = student.Log();
  for (const char* part : {"came back serving other data", "sample order (--data_seed): cursor 42, teacher 7"}) {
    EXPECT_NE(log.find(part), std::string::npos) << part << "\n" << log;
  }
  const LedgerScan other = ScanLedger(dir + "/ledger-other.jsonl");
  EXPECT_EQ(other.deliveries, 0) << "the restarted teacher served the old cursor: " << other.Describe();
}

}  // namespace
}  // namespace e3
