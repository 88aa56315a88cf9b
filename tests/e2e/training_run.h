// One training run end to end, as the training tests (train_e2e_test.cc,
// gpt_oss_train_e2e_test.cc) make it: a teacher serving a model until its
// data ends, one student training a draft against it and exporting, and
// the checks of how the run ended.
#ifndef E3_TESTS_E2E_TRAINING_RUN_H_
#define E3_TESTS_E2E_TRAINING_RUN_H_

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"

namespace e3::testing {

// The teacher of a training run: `model_dir` on the first `max_samples`
// conversations, samples of at most 256 tokens in batches of 512, a draft
// vocabulary of 512, its ledger in `dir`, and an exit once every sample is
// committed.
inline std::vector<std::string> TrainingTeacherArgv(const std::string& dir, const std::string& model_dir,
                                                    int max_samples) {
  return TeacherArgv(dir, model_dir,
                     {"--max_samples=" + std::to_string(max_samples), "--max_seq_len=256", "--tokens_per_batch=512",
                      "--draft_vocab_size=512", "--ledger=" + dir + "/ledger.jsonl", "--exit_when_done"});
}

// The student of a training run against the teacher on loopback `port`:
// a learning rate that moves the tiny drafts within a few dozen steps,
// checkpoints every 10 steps (each commits its batches in the ledger), the
// export, summary and log under `dir`, one thread (CI has two cores).
inline std::vector<std::string> TrainingStudentArgv(const std::string& dir, const std::string& port) {
  return {StudentBinary(),
          "--teacher=127.0.0.1:" + port,
          "--lr=2e-3",
          "--warmup_steps=2",
          "--checkpoint_dir=" + dir + "/ckpt",
          "--checkpoint_every=10",
          "--output_dir=" + dir + "/export",
          "--summary_json=" + dir + "/summary.json",
          "--log_every=5",
          "--threads=1"};
}

// tools/acceptance_crosscheck.py re-measures the run's export
// (<dir>/export) on its eval dump (<dir>/eval.safetensors) the serving
// way: its tau of every chain the student measured (`eval`, the summary's
// "eval") must lie within 0.01 of the student's.
inline void ExpectCrosscheckAgrees(const std::string& dir, const nlohmann::json& eval) {
  const std::string cmd = "/usr/bin/python3 " + std::string(E3_SOURCE_DIR) +
                          "/tools/acceptance_crosscheck.py --draft=" + dir + "/export --eval_dump=" + dir +
                          "/eval.safetensors --json_out=" + dir + "/crosscheck.json > " + dir +
                          "/crosscheck.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << ReadFile(dir + "/crosscheck.log");
  const auto cross = nlohmann::json::parse(ReadFile(dir + "/crosscheck.json"));
  for (const auto& k : eval["chains"]) {
    const std::string key = std::to_string(k.get<int64_t>());
    std::printf("chain %s: C++ tau %.4f, crosscheck tau %.4f\n", key.c_str(), eval["tau"][key].get<double>(),
                cross["tau"][key].get<double>());
    EXPECT_NEAR(cross["tau"][key].get<double>(), eval["tau"][key].get<double>(), 0.01) << key;
  }
}

// How many times longer a run may take in this build. The bound catches a
// run that hangs, not a slow one, and under ThreadSanitizer the student
// runs several times slower.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define E3_TESTS_UNDER_TSAN 1
#endif
#endif
#if defined(E3_TESTS_UNDER_TSAN) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderThreadSanitizer = true;
inline constexpr int kRunTimeScale = 3;
#else
inline constexpr bool kUnderThreadSanitizer = false;
inline constexpr int kRunTimeScale = 1;
#endif

// The samples a training run takes in this build: under ThreadSanitizer a
// quarter of `samples`. There the run looks for races between the
// student's threads (stream reader, prefetch, metrics, checkpoints,
// export), which every step repeats; whether the draft learns is checked
// by the same test in the plain build. (Full runs under TSan would take
// most of CI's TSan stage.)
inline int TrainingSamples(int samples) { return kUnderThreadSanitizer ? samples / 4 : samples; }

// The run's end: the student exits 0 within `timeout` (times kRunTimeScale),
// then the teacher, whose data is done, exits 0 within 30 s. Fatal
// failures return early: call under ASSERT_NO_FATAL_FAILURE.
inline void ExpectTrainingRunEnds(Subprocess& student, Subprocess& teacher, std::chrono::seconds timeout) {
  timeout *= kRunTimeScale;
  auto st = student.Wait(timeout);
  ASSERT_TRUE(st.has_value()) << "student did not finish in " << timeout.count() << " s\n" << student.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << student.Log() << teacher.Log();
  auto tst = teacher.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(tst.has_value()) << "teacher did not exit when done\n" << teacher.Log();
  EXPECT_TRUE(WIFEXITED(*tst) && WEXITSTATUS(*tst) == 0) << teacher.Log();
}

// The teacher's closing ledger summary (its log) shows every sample of the
// epoch committed exactly once.
inline void ExpectEverySampleCommittedOnce(const std::string& teacher_log) {
  EXPECT_NE(teacher_log.find("\"samples_committed_twice\":0"), std::string::npos) << teacher_log;
  EXPECT_NE(teacher_log.find("\"samples_never_committed\":0"), std::string::npos) << teacher_log;
}

}  // namespace e3::testing

#endif  // E3_TESTS_E2E_TRAINING_RUN_H_
