// The real acceptance length end to end on loopback: a teacher_server
// process with --eval_prompts generates its greedy continuations (KV
// cache) while a student_trainer process trains against it; the student
// measures tau during training and at the end, with the untrained draft
// beside it, and reports it in the summary, the step log and /metrics.
// tools/acceptance_crosscheck.py then measures the same exported draft on
// the same eval set the serving way (one token at a time with a KV cache,
// in PyTorch: Debian's python3-torch) and must agree within 0.01.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <regex>

#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"
#include "tests/e2e/training_run.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;

TEST(AcceptanceE2eTest, TauDuringTrainingAtTheEndAndAgainstAnIndependentMeasurement) {
  const std::string dir = testing::ScratchDir("acceptance_e2e");
  Subprocess teacher({testing::TeacherBinary(), "--model_dir=" + kSrc + "/examples/tiny-code-llama",
                      "--data=" + kSrc + "/examples/data/train_conversations.jsonl", "--max_samples=120",
                      "--max_seq_len=256", "--tokens_per_batch=512", "--draft_vocab_size=512",
                      "--eval_prompts=" + kSrc + "/examples/data/eval_prompts.jsonl", "--eval_samples=8",
                      "--eval_max_new_tokens=48", "--listen=127.0.0.1:0", "--port_file=" + dir + "/port",
                      "--metrics_port=-1", "--threads=1"},
                     dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 60s)) << teacher.Log();
  const std::string port = testing::ReadPortFile(dir + "/port");
  Subprocess student({testing::StudentBinary(), "--teacher=127.0.0.1:" + port, "--lr=2e-3", "--warmup_steps=2",
                      "--max_steps=30", "--eval_every=10", "--eval_dump=" + dir + "/eval.safetensors",
                      "--output_dir=" + dir + "/export", "--export_dtype=float32",
                      "--summary_json=" + dir + "/summary.json", "--step_log=" + dir + "/steps.jsonl",
                      "--log_every=10", "--threads=1"},
                     dir + "/student.log");
  // /metrics carries the measurement by the end of the run.
  std::smatch m;
  std::string log;
  for (int i = 0; i < 600 && !std::regex_search(log, m, std::regex("metrics on :(\\d+)")); ++i) {
    std::this_thread::sleep_for(100ms);
    log = student.Log();
  }
  ASSERT_EQ(m.size(), 2u) << log;
  const int metrics_port = std::stoi(m[1]);
  bool scraped = false;
  for (int i = 0; i < 1200 && !scraped; ++i) {
    httplib::Client c("127.0.0.1", metrics_port);
    c.set_connection_timeout(1);
    auto res = c.Get("/metrics");
    scraped = res && res->status == 200 &&
              res->body.find("e3_student_eval_acceptance_length{chain=\"7\",rank=\"0\"}") != std::string::npos;
    if (!scraped) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(scraped) << "no e3_student_eval_acceptance_length on /metrics";
  auto st = student.Wait(300s);
  ASSERT_TRUE(st.has_value()) << "student did not finish in 300 s\n" << student.Log();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << student.Log();
  EXPECT_NE(teacher.Log().find("eval set ready: 8 prompts"), std::string::npos) << teacher.Log();

  const auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  ASSERT_TRUE(summary.contains("eval")) << summary.dump(2);
  ASSERT_TRUE(summary.contains("eval_untrained")) << summary.dump(2);
  EXPECT_EQ(summary["eval"]["chains"], nlohmann::json::parse("[3, 5, 7]"));
  EXPECT_EQ(summary["eval"]["prompts"].get<int64_t>(), 8);
  for (const char* k : {"3", "5", "7"}) {
    const double tau = summary["eval"]["tau"][k], untrained = summary["eval_untrained"]["tau"][k];
    EXPECT_GE(tau, 1.0) << k;
    EXPECT_LE(tau, 8.0) << k;
    EXPECT_GE(untrained, 1.0) << k;
    EXPECT_GT(summary["eval"]["rounds"][k].get<int64_t>(), 0) << k;
  }
  std::printf("e2e: real tau (chain 7) %.3f trained, %.3f untrained; simulated tau %.3f\n",
              summary["eval"]["tau"]["7"].get<double>(), summary["eval_untrained"]["tau"]["7"].get<double>(),
              summary["last"]["simulated_tau"].get<double>());
  // The step log holds the measurements at steps 10, 20 and 30 (the
  // teacher's set may still be generating at the first).
  int eval_lines = 0;
  std::ifstream steps(dir + "/steps.jsonl");
  for (std::string line; std::getline(steps, line);) eval_lines += nlohmann::json::parse(line).contains("eval");
  EXPECT_GE(eval_lines, 2);

  // The same tau, measured independently from the export and the dump.
  testing::ExpectCrosscheckAgrees(dir, summary["eval"]);
}

}  // namespace
}  // namespace e3
