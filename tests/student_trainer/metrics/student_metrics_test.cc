// A scrape of the student's families sees whole steps: collections racing
// with Record never mix two steps' values.
#include "student_trainer/metrics/student_metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/metrics/metrics_server.h"

namespace e3 {
namespace {

// The value of the sample line that starts with `series` (name and labels).
double ScrapedSample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no sample " << series << " in\n" << text;
    return -1;
  }
  return std::strtod(text.c_str() + at + series.size() + 2, nullptr);
}

StepReport StepNumber(int n) {
  StepReport r;
  r.tokens = 1;
  r.step_seconds = 1;
  r.data_wait_seconds = 1;
  r.loss = n;
  r.learning_rate = n;
  r.tau = n;
  r.acc = {static_cast<double>(n), static_cast<double>(n)};
  r.ploss = {static_cast<double>(n), static_cast<double>(n)};
  return r;
}

// Returns the first mismatch in one scrape, or "" when every family holds the
// step that e3_student_steps_total counts.
std::string MixedStep(const std::string& text) {
  const double steps = ScrapedSample(text, "e3_student_steps_total{rank=\"3\"}");
  if (steps <= 0) return "no step recorded yet";
  for (const char* series :
       {"e3_student_tokens_total{rank=\"3\"}", "e3_student_step_seconds_total{rank=\"3\"}",
        "e3_student_data_wait_seconds_total{rank=\"3\"}", "e3_student_loss{rank=\"3\"}",
        "e3_student_learning_rate{rank=\"3\"}", "e3_student_tau{rank=\"3\"}",
        "e3_student_acc{rank=\"3\",step=\"0\"}", "e3_student_acc{rank=\"3\",step=\"1\"}",
        "e3_student_ploss{rank=\"3\",step=\"1\"}"}) {
    const double value = ScrapedSample(text, series);
    if (value != steps)
      return std::string(series) + " is " + std::to_string(value) + " in a scrape of step " +
             std::to_string(steps);
  }
  return "";
}

TEST(StudentMetricsTest, EveryScrapeHoldsOneWholeStep) {
  StudentMetrics metrics(/*rank=*/3, /*ttt_length=*/2);
  // Step n sets every gauge to n and adds 1 to every counter; a trainer
  // thread records steps as fast as it can while this one scrapes.
  std::atomic<bool> stop{false}, started{false};
  std::thread trainer([&] {
    for (int n = 1; !stop; ++n) {
      metrics.Record(StepNumber(n));
      started = true;
    }
  });
  while (!started) std::this_thread::yield();
  std::string mismatch;
  for (int scrape = 0; scrape < 3000 && mismatch.empty(); ++scrape) {
    mismatch = MixedStep("\n" + RenderMetrics(*metrics.registry()));
  }
  stop = true;
  trainer.join();
  EXPECT_EQ(mismatch, "");
}

TEST(StudentMetricsTest, AcceptanceLengthPerChain) {
  StudentMetrics metrics(/*rank=*/0, /*ttt_length=*/1);
  metrics.RecordAcceptance({3, 7}, {1.5, 2.25});
  const std::string text = "\n" + RenderMetrics(*metrics.registry());
  EXPECT_EQ(ScrapedSample(text, "e3_student_eval_acceptance_length{chain=\"3\",rank=\"0\"}"), 1.5);
  EXPECT_EQ(ScrapedSample(text, "e3_student_eval_acceptance_length{chain=\"7\",rank=\"0\"}"), 2.25);
}

}  // namespace
}  // namespace e3
