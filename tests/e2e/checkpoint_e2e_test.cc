// A full disk while checkpointing, with the real student_trainer against a
// real teacher_server on loopback (the bundled tiny model). The file size
// limit (RLIMIT_FSIZE) set on the student stands in for the full disk: it
// lets the draft's weights through and stops the optimizer state, so every
// checkpoint fails part-way, as on a disk that fills during the save. The
// failure names the file and the bytes it could not write, and the previous
// checkpoint stays the newest, whole and loadable. --on_checkpoint_save_error
// decides what follows: stop (the default) ends the run with an error;
// continue trains on and exports.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;


class CheckpointE2eTest : public ::testing::Test {
 protected:
  void StartTeacher(const std::string& name) {
    dir_ = testing::ScratchDir(name);
    teacher_ = std::make_unique<Subprocess>(
        testing::TinyTeacherArgv(dir_, {"--max_samples=120", "--max_seq_len=192", "--tokens_per_batch=384",
                                        "--draft_vocab_size=256", "--subscriber_timeout_s=2"}),
        dir_ + "/teacher.log");
    ASSERT_TRUE(testing::WaitForFile(dir_ + "/port", 60s)) << teacher_->Log();
    port_ = testing::ReadPortFile(dir_ + "/port");
  }

  std::vector<std::string> StudentArgs(int64_t max_steps, const std::vector<std::string>& more = {}) const {
    std::vector<std::string> args = {testing::StudentBinary(), "--teacher=127.0.0.1:" + port_, "--lr=1e-3",
                                     "--checkpoint_dir=" + ckpt(), "--checkpoint_every=4",
                                     "--max_steps=" + std::to_string(max_steps), "--log_every=2", "--threads=1"};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  // Runs a student to its end; returns its wait status and log.
  std::pair<int, std::string> Run(const std::string& name, const std::vector<std::string>& args,
                                  const testing::SubprocessLimits& limits = {}) {
    Subprocess student(args, dir_ + "/" + name + ".log", limits);
    auto status = student.Wait(300s);
    EXPECT_TRUE(status.has_value()) << name << " did not finish in 300 s\n" << student.Log();
    return {status.value_or(-1), student.Log()};
  }

  // A first run writes step-4; the limit then lies between its weights'
  // and its optimizer state's sizes (checkpoints of one draft all have the
  // same sizes).
  rlim_t FirstCheckpointThenLimit() {
    auto [status, log] = Run("first", StudentArgs(4));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
    const std::string weights = ReadFile(ckpt() + "/step-00000004/model.safetensors");
    const std::string moments = ReadFile(ckpt() + "/step-00000004/optimizer.safetensors");
    EXPECT_LT(weights.size(), moments.size());
    moments_bytes_ = moments.size();
    return (weights.size() + moments.size()) / 2;
  }

  // The failure names the file, the bytes and the checkpoint kept.
  void ExpectNamedFailure(const std::string& log, int64_t step) const {
    const std::string tmp = ckpt() + absl::StrFormat("/step-%08d.tmp", step);
    EXPECT_NE(log.find(tmp + "/optimizer.safetensors: write failed after"), std::string::npos) << log;
    EXPECT_NE(log.find("of " + std::to_string(moments_bytes_) + " bytes ("), std::string::npos) << log;
    EXPECT_NE(log.find("bytes not written"), std::string::npos) << log;
    EXPECT_NE(log.find("File too large"), std::string::npos) << log;
    EXPECT_NE(log.find("the newest checkpoint is still " + ckpt() + "/step-00000004"), std::string::npos) << log;
  }

  // step-4 is still the newest, and nothing of the failed saves is left.
  void ExpectOnlyTheFirstCheckpoint() const {
    EXPECT_EQ(ReadFile(ckpt() + "/latest"), "step-00000004\n");
    auto entries = ListDir(ckpt());
    ASSERT_TRUE(entries.ok()) << entries.status();
    EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000004"}));
  }

  std::string ckpt() const { return dir_ + "/ckpt"; }

  std::string dir_, port_;
  size_t moments_bytes_ = 0;
  std::unique_ptr<Subprocess> teacher_;
};

TEST_F(CheckpointE2eTest, ByDefaultAFullDiskStopsTheRunAndTheNextResumesFromThePrevious) {
  ASSERT_NO_FATAL_FAILURE(StartTeacher("ckpt_full_stop"));
  const rlim_t limit = FirstCheckpointThenLimit();

  auto [status, log] = Run("full", StudentArgs(8), {limit});
  ASSERT_TRUE(WIFEXITED(status)) << "killed (SIGXFSZ?) instead of failing the checkpoint\n" << log;
  EXPECT_EQ(WEXITSTATUS(status), 1) << log;
  ExpectNamedFailure(log, 8);
  EXPECT_NE(log.find("stopping (--on_checkpoint_save_error=stop)"), std::string::npos) << log;
  ExpectOnlyTheFirstCheckpoint();

  auto [again, again_log] = Run("resumed", StudentArgs(8));
  ASSERT_TRUE(WIFEXITED(again) && WEXITSTATUS(again) == 0) << again_log;
  EXPECT_NE(again_log.find("resumed from " + ckpt() + "/step-00000004 at step 4"), std::string::npos)
      << again_log;
  EXPECT_EQ(ReadFile(ckpt() + "/latest"), "step-00000008\n");
  EXPECT_TRUE(teacher_->running()) << teacher_->Log();
}

TEST_F(CheckpointE2eTest, WithContinueAFullDiskIsReportedAndTrainingGoesOnToTheExport) {
  ASSERT_NO_FATAL_FAILURE(StartTeacher("ckpt_full_continue"));
  const rlim_t limit = FirstCheckpointThenLimit();

  auto [status, log] =
      Run("full", StudentArgs(12, {"--on_checkpoint_save_error=continue", "--output_dir=" + dir_ + "/export",
                                   "--summary_json=" + dir_ + "/summary.json"}),
          {limit});
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  ExpectNamedFailure(log, 8);
  ExpectNamedFailure(log, 12);  // the periodic save at the last step is the final one
  EXPECT_NE(log.find("training goes on (--on_checkpoint_save_error=continue)"), std::string::npos) << log;
  ExpectOnlyTheFirstCheckpoint();
  const auto summary = nlohmann::json::parse(ReadFile(dir_ + "/summary.json"), nullptr, false);
  ASSERT_TRUE(summary.is_object()) << ReadFile(dir_ + "/summary.json");
  EXPECT_EQ(summary["steps"], 12);
  EXPECT_EQ(summary["checkpoint_failures"], 2);
  EXPECT_EQ(summary["last_checkpoint"], ckpt() + "/step-00000004");
  // The bf16 export is under the limit: the trained draft is not lost.
  EXPECT_TRUE(IsRegularFile(dir_ + "/export/model.safetensors"));
  EXPECT_TRUE(IsRegularFile(dir_ + "/export/config.json"));
}

}  // namespace
}  // namespace e3
