#include "student_trainer/metrics/metrics_processor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

std::string Temp(const std::string& name) {
  const std::string path = testing::ScratchPath(name);
  std::remove(path.c_str());
  return path;
}

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

StepRecord MakeStepRecord(int64_t step, int64_t tokens, double loss) {
  StepRecord r;
  r.step = step;
  r.tokens = tokens;
  r.loss = loss;
  r.tau = 1 + loss / 100;
  r.acc = {loss / 100, loss / 200};
  r.lr = 1e-3;
  r.started = MetricsProcessor::Clock::now();
  r.wait_seconds = 0.25;
  return r;
}

TEST(StepWindowTest, AveragesTheLastStepsAdded) {
  StepWindow w(2);
  EXPECT_EQ(w.Stats().steps, 0);
  w.Add(4, 1.5, {0.5, 0.1});
  EXPECT_FALSE(w.full());
  w.Add(2, 1.1, {0.3, 0.3});
  w.Add(6, 1.3, {0.1, 0.5});
  EXPECT_TRUE(w.full());
  const WindowStats s = w.Stats();
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.loss, 4);
  EXPECT_DOUBLE_EQ(s.tau, 1.2);
  EXPECT_EQ(s.acc, (std::vector<double>{0.2, 0.4}));
}

TEST(MetricsProcessorTest, StepsGoToTheWindowsAndTheStepLog) {
  MetricsOptions o;
  o.step_log = Temp("steps.jsonl");
  o.log_every = 0;
  o.planned_steps = 20;  // windows of 5
  auto m = MetricsProcessor::Create(o, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  for (int64_t s = 1; s <= 12; ++s) (*m)->RecordStep(MakeStepRecord(s, 100, 20 - s));
  // An empty data-parallel share: counted in the time and the wait, not in
  // the curves.
  (*m)->RecordStep(MakeStepRecord(13, 0, 0));
  EXPECT_EQ((*m)->tokens(), 1200);
  EXPECT_DOUBLE_EQ((*m)->wait_seconds(), 13 * 0.25);
  EXPECT_GE((*m)->train_seconds(), 0);
  EXPECT_EQ((*m)->first().steps, 5);
  EXPECT_DOUBLE_EQ((*m)->first().loss, 17);  // steps 1..5: 19..15
  EXPECT_DOUBLE_EQ((*m)->last().loss, 10);   // steps 8..12: 12..8

  AcceptanceReport r;
  r.chain_lengths = {3};
  r.counts.resize(1);
  r.samples = 4;
  (*m)->RecordAcceptance(12, r, "");
  const std::vector<nlohmann::json> lines = ReadLines(o.step_log);
  ASSERT_EQ(lines.size(), 13u);  // 12 steps and the measurement
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_DOUBLE_EQ(lines[0]["loss"].get<double>(), 19);
  EXPECT_EQ(lines[0]["tokens"], 100);
  EXPECT_DOUBLE_EQ(lines[0]["data_wait_seconds"].get<double>(), 0.25);
  EXPECT_EQ(lines[0]["acc"].size(), 2u);
  EXPECT_EQ(lines[12]["step"], 12);
  EXPECT_EQ(lines[12]["eval"]["prompts"], 4);
  EXPECT_EQ(lines[12]["eval"]["chains"], nlohmann::json::array({3}));
}

TEST(MetricsProcessorTest, UnderDataParallelismEachRankLogsToItsOwnFile) {
  MetricsOptions o;
  o.layout = *ParallelLayout::DataParallel(/*rank=*/1, /*world_size=*/2);
  o.step_log = Temp("dp_steps.jsonl");
  testing::ScratchPath("dp_steps.jsonl", ".rank1");  // the file rank 1 writes: removed with the test
  o.log_every = 0;
  auto m = MetricsProcessor::Create(o, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->RecordStep(MakeStepRecord(1, 10, 5));
  EXPECT_EQ(ReadLines(o.step_log + ".rank1").size(), 1u);

  o.step_log = "/nonexistent/dir/steps.jsonl";
  auto bad = MetricsProcessor::Create(o, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--step_log /nonexistent/dir/steps.jsonl.rank1: cannot open for append");
}

}  // namespace
}  // namespace e3
