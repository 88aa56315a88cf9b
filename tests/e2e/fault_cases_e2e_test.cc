// Faults a careless or hostile user causes, against the real binaries:
// a second teacher on a running one's port or ledger, a disk that fills
// under the ledger, a checkpoint whose cursor was edited, a resume against
// a teacher capturing other layers, and a checkpoint with flipped bytes.
// Each ends in a clear error naming what is wrong, and nothing that was
// acknowledged is missing from the record.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/ledger_scan.h"
#include "tests/e2e/subprocess.h"
#include "tests/e2e/training_run.h"
#include "tests/free_port.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

constexpr int kSamples = 40;

std::vector<std::string> Teacher(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--max_samples=" + std::to_string(kSamples), "--max_seq_len=192",
                                    "--tokens_per_batch=384", "--draft_vocab_size=256",
                                    "--ledger=" + dir + "/ledger.jsonl", "--subscriber_timeout_s=2"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return testing::TinyTeacherArgv(dir, flags);
}

std::vector<std::string> Student(const std::string& dir, const std::string& port, std::vector<std::string> extra) {
  std::vector<std::string> argv = {testing::StudentBinary(), "--teacher=127.0.0.1:" + port, "--lr=1e-3",
                                   "--checkpoint_dir=" + dir + "/ckpt", "--checkpoint_every=2", "--log_every=2",
                                   "--threads=1", "--connect_attempts=2", "--teacher_wait_s=20"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Starts a teacher and waits until it serves; its port.
std::string Serve(Subprocess& teacher, const std::string& dir) {
  EXPECT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  return testing::ReadPortFile(dir + "/port");
}

int ExitCode(Subprocess& p, std::chrono::seconds bound) {
  auto st = p.Wait(bound);
  EXPECT_TRUE(st.has_value()) << "did not exit within " << bound.count() << " s\n" << p.Log();
  if (!st.has_value()) return -1;
  return WIFEXITED(*st) ? WEXITSTATUS(*st) : 128 + WTERMSIG(*st);
}

// gRPC's default SO_REUSEPORT lets a second teacher bind a running one's
// port, and both would take students; one ledger could take two writers.
TEST(FaultCasesE2eTest, ASecondTeacherOnARunningOnesPortOrLedgerIsRefused) {
  const std::string dir = testing::ScratchDir("fault_two_teachers");
  const int port = testing::FreePort();
  Subprocess first(testing::TinyTeacherArgv(dir, {"--listen=127.0.0.1:" + std::to_string(port),
                                                  "--max_samples=20", "--ledger=" + dir + "/ledger.jsonl"}),
                   dir + "/first.log");
  Serve(first, dir);

  const std::string other = dir + "/other";
  ASSERT_TRUE(MakeDirs(other).ok());
  Subprocess same_port(testing::TinyTeacherArgv(other, {"--listen=127.0.0.1:" + std::to_string(port),
                                                        "--max_samples=20", "--ledger=" + other + "/ledger.jsonl"}),
                       other + "/teacher.log");
  EXPECT_EQ(ExitCode(same_port, 120s), 1) << same_port.Log();
  EXPECT_NE(same_port.Log().find(absl::StrCat("cannot listen on 127.0.0.1:", port)), std::string::npos)
      << same_port.Log();

  Subprocess same_ledger(testing::TinyTeacherArgv(other, {"--listen=127.0.0.1:0", "--max_samples=20",
                                                          "--ledger=" + dir + "/ledger.jsonl"}),
                         other + "/ledger_teacher.log");
  EXPECT_EQ(ExitCode(same_ledger, 120s), 1) << same_ledger.Log();
  EXPECT_NE(same_ledger.Log().find("the ledger is in use by another process"), std::string::npos)
      << same_ledger.Log();

  EXPECT_TRUE(first.running()) << first.Log();
  first.Signal(SIGTERM);
  EXPECT_EQ(ExitCode(first, 60s), 0) << first.Log();
}

// A ledger that cannot grow (a file-size limit stands in for a full disk)
// stops the commit path: the student cannot commit and fails naming the
// ledger, the teacher exits non-zero, the file holds exactly what was
// acknowledged with no torn line, and once there is room again the run
// resumes and ends with every sample committed exactly once.
TEST(FaultCasesE2eTest, AFullDiskUnderTheLedgerStopsCommitsAndTheResumeFinishesExactlyOnce) {
  const std::string dir = testing::ScratchDir("fault_full_ledger");
  testing::SubprocessLimits limits;
  limits.file_size_bytes = 1100;  // the open, a few deliveries and commits, then no more
  {
    // Inline batches: shm segments are files too, and the limit would stop them first.
    Subprocess teacher(Teacher(dir, {"--exit_when_done", "--transports=inline"}), dir + "/teacher1.log", limits);
    const std::string port = Serve(teacher, dir);
    Subprocess student(Student(dir, port, {"--teacher_wait_s=8"}), dir + "/student1.log");
    EXPECT_NE(ExitCode(student, 240s), 0) << student.Log();
    EXPECT_NE(student.Log().find("ledger " + dir + "/ledger.jsonl"), std::string::npos) << student.Log();
    teacher.Signal(SIGTERM);
    EXPECT_EQ(ExitCode(teacher, 60s), 1) << teacher.Log();
    EXPECT_NE(teacher.Log().find("the ledger misses what this teacher could not write"), std::string::npos)
        << teacher.Log();
  }
  const std::string ledger = ReadFile(dir + "/ledger.jsonl");
  ASSERT_FALSE(ledger.empty());
  EXPECT_EQ(ledger.back(), '\n') << "a torn line stayed in the ledger";
  testing::LedgerScan partial = testing::ScanLedger(dir + "/ledger.jsonl");
  EXPECT_GT(partial.commits, 0);
  EXPECT_LT(static_cast<int>(partial.committed.size()), kSamples);
  for (const auto& [sample, times] : partial.committed) EXPECT_EQ(times, 1) << "sample " << sample;

  (void)RemoveAll(dir + "/port");
  Subprocess teacher(Teacher(dir, {"--exit_when_done"}), dir + "/teacher2.log");
  const std::string port = Serve(teacher, dir);
  Subprocess student(Student(dir, port, {}), dir + "/student2.log");
  ASSERT_NO_FATAL_FAILURE(testing::ExpectTrainingRunEnds(student, teacher, 300s));
  EXPECT_NE(student.Log().find("resumed from"), std::string::npos) << student.Log();
  testing::LedgerScan end = testing::ScanLedger(dir + "/ledger.jsonl");
  EXPECT_TRUE(end.ExactlyOnce()) << end.Describe();
}

// Checkpoints at steps 2 and 4 to resume from, trained against the teacher
// on `port`, which keeps serving.
void TrainFourSteps(const std::string& dir, const std::string& port) {
  Subprocess student(Student(dir, port, {"--max_steps=4"}), dir + "/student1.log");
  ASSERT_EQ(ExitCode(student, 240s), 0) << student.Log();
  ASSERT_TRUE(IsDirectory(dir + "/ckpt/step-00000004")) << student.Log();
}

void EditState(const std::string& checkpoint, int64_t step, int64_t next_batch, int64_t consumed) {
  const std::string path = checkpoint + "/trainer_state.json";
  nlohmann::json j = nlohmann::json::parse(ReadFile(path));
  j["step"] = step;
  j["cursors"][0]["next_batch"] = next_batch;
  j["cursors"][0]["consumed"] = consumed;
  std::ofstream(path) << j.dump(2);
  // A determined edit also drops the manifest that would name the change.
  ASSERT_TRUE(RemoveAll(checkpoint + "/checksums.json").ok());
}

// The student resumed at an edited cursor and the ledger then showed
// commits of batches never delivered. Now the student checks the cursor
// against its steps, and the teacher checks it against its deliveries.
TEST(FaultCasesE2eTest, AnEditedCheckpointCursorIsRefused) {
  const std::string dir = testing::ScratchDir("fault_edited_cursor");
  Subprocess teacher(Teacher(dir, {}), dir + "/teacher.log");
  const std::string port = Serve(teacher, dir);
  ASSERT_NO_FATAL_FAILURE(TrainFourSteps(dir, port));
  const std::string checkpoint = dir + "/ckpt/step-00000004";
  ASSERT_TRUE(RemoveAll(dir + "/ckpt/step-00000002").ok());  // no older checkpoint to fall back to

  EditState(checkpoint, 4, 30, 4);
  Subprocess by_student(Student(dir, port, {"--max_steps=6"}), dir + "/student2.log");
  EXPECT_NE(ExitCode(by_student, 120s), 0) << by_student.Log();
  EXPECT_NE(by_student.Log().find("cursors[0] is at 0:30, but 4 batches were taken from that stream"),
            std::string::npos)
      << by_student.Log();

  // Consistent with itself, not with what the teacher sent.
  EditState(checkpoint, 30, 30, 30);
  ASSERT_TRUE(RenamePath(checkpoint, dir + "/ckpt/step-00000030").ok());
  Subprocess by_teacher(Student(dir, port, {"--max_steps=32"}), dir + "/student3.log");
  EXPECT_NE(ExitCode(by_teacher, 120s), 0) << by_teacher.Log();
  EXPECT_NE(by_teacher.Log().find("is past every batch this teacher delivered to rank 0"), std::string::npos)
      << by_teacher.Log();
  testing::LedgerScan scan = testing::ScanLedger(dir + "/ledger.jsonl");
  EXPECT_LE(scan.max_committed_index, 3) << "a batch never delivered was committed: " << scan.Describe();
  teacher.Signal(SIGTERM);
  EXPECT_EQ(ExitCode(teacher, 60s), 0) << teacher.Log();
}

// A checkpoint made on layers [1, 3, 4]: against a teacher that captures
// [2, 4, 5] the student (still reading [1, 3, 4]) stops before it
// subscribes, naming the layers missing; asking for [2, 4, 5] instead,
// its checkpoint's export is refused for the layers it was trained on.
// (Once, such a resume exited 0 and labelled the export [2, 4, 5].)
TEST(FaultCasesE2eTest, AResumeAgainstOtherAuxLayersIsRefused) {
  const std::string dir = testing::ScratchDir("fault_aux_layers");
  {
    Subprocess teacher(Teacher(dir, {"--aux_layer_ids=1,3,4"}), dir + "/teacher1.log");
    const std::string port = Serve(teacher, dir);
    ASSERT_NO_FATAL_FAILURE(TrainFourSteps(dir, port));
    teacher.Signal(SIGTERM);
    ASSERT_EQ(ExitCode(teacher, 60s), 0) << teacher.Log();
  }
  (void)RemoveAll(dir + "/port");
  Subprocess teacher(Teacher(dir, {"--aux_layer_ids=2,4,5"}), dir + "/teacher2.log");
  const std::string port = Serve(teacher, dir);
  Subprocess student(Student(dir, port, {"--max_steps=6"}), dir + "/student2.log");
  EXPECT_NE(ExitCode(student, 120s), 0) << student.Log();
  EXPECT_NE(student.Log().find("the draft reads aux layers [1, 3, 4], but the teacher does not capture [1, 3]: it "
                               "captures [2, 4, 5]"),
            std::string::npos)
      << student.Log();
  Subprocess other_plan(Student(dir, port, {"--max_steps=6", "--aux_layer_ids=2,4,5"}), dir + "/student3.log");
  EXPECT_NE(ExitCode(other_plan, 120s), 0) << other_plan.Log();
  EXPECT_NE(other_plan.Log().find("trained on aux layers [1, 3, 4], but this draft reads [2, 4, 5]"),
            std::string::npos)
      << other_plan.Log();
  teacher.Signal(SIGTERM);
  EXPECT_EQ(ExitCode(teacher, 60s), 0) << teacher.Log();
}

// Flip bytes inside fc.weight of the newest checkpoint: it parses as well
// as before, and loaded silently. Its checksum now names it, and the
// resume falls back to the checkpoint before it.
TEST(FaultCasesE2eTest, AFlippedCheckpointByteFallsBackToTheCheckpointBefore) {
  const std::string dir = testing::ScratchDir("fault_flipped_byte");
  Subprocess teacher(Teacher(dir, {}), dir + "/teacher.log");
  const std::string port = Serve(teacher, dir);
  ASSERT_NO_FATAL_FAILURE(TrainFourSteps(dir, port));
  const std::string weights = dir + "/ckpt/step-00000004/model.safetensors";
  std::string bytes = ReadFile(weights);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof(header));
  const nlohmann::json j = nlohmann::json::parse(bytes.substr(8, header));
  const size_t begin = 8 + header + j["fc.weight"]["data_offsets"][0].get<size_t>();
  for (size_t i = 0; i < 4000; ++i) bytes[begin + i] = static_cast<char>(bytes[begin + i] ^ 0x40);
  std::ofstream(weights, std::ios::binary | std::ios::trunc) << bytes;

  Subprocess student(Student(dir, port, {"--max_steps=6"}), dir + "/student2.log");
  EXPECT_EQ(ExitCode(student, 240s), 0) << student.Log();
  const std::string log = student.Log();
  EXPECT_NE(log.find(weights + ": CRC-32C"), std::string::npos) << log;
  EXPECT_NE(log.find("fell back to the older checkpoint " + dir + "/ckpt/step-00000002"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + dir + "/ckpt/step-00000002 at step 2"), std::string::npos) << log;
  teacher.Signal(SIGTERM);
  EXPECT_EQ(ExitCode(teacher, 60s), 0) << teacher.Log();
}

// Settings that would crash or quietly do something else end with an
// error naming the flag: a port past 65535 (bound modulo 2^16), and a GPU
// device in a build or on a machine without it (an uncaught exception,
// SIGABRT). Both are refused before the model loads.
TEST(FaultCasesE2eTest, ImpossibleListenPortsAndDevicesAreClearErrors) {
  const std::string dir = testing::ScratchDir("fault_bad_flags");
  Subprocess port(testing::TinyTeacherArgv(dir, {"--listen=127.0.0.1:99999"}), dir + "/port.log");
  EXPECT_EQ(ExitCode(port, 60s), 2) << port.Log();
  EXPECT_NE(port.Log().find("--listen: teachers.listen: expected host:port, [ipv6]:port or unix:path, with a "
                            "port in [0, 65535], got \"127.0.0.1:99999\""),
            std::string::npos)
      << port.Log();
  Subprocess device(testing::TinyTeacherArgv(dir, {"--device=cuda:99"}), dir + "/device.log");
  EXPECT_EQ(ExitCode(device, 60s), 1) << device.Log();
  EXPECT_NE(device.Log().find("teacher_server: error: --device=cuda:99: "), std::string::npos) << device.Log();
}

}  // namespace
}  // namespace e3
