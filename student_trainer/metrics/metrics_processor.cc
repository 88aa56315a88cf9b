#include "student_trainer/metrics/metrics_processor.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace e3 {
namespace {

std::string AccString(const std::vector<double>& acc) {
  std::vector<std::string> parts;
  for (double a : acc) parts.push_back(absl::StrFormat("%.2f", a));
  return absl::StrJoin(parts, " ");
}

double Seconds(MetricsProcessor::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

void StepWindow::Add(double loss, double tau, const std::vector<double>& acc) {
  items_.push_back({loss, tau, acc});
  if (items_.size() > size_) items_.pop_front();
}

WindowStats StepWindow::Stats() const {
  WindowStats s;
  s.steps = static_cast<int64_t>(items_.size());
  if (items_.empty()) return s;
  s.acc.assign(items_.front().acc.size(), 0.0);
  for (const auto& it : items_) {
    s.loss += it.loss;
    s.tau += it.tau;
    for (size_t j = 0; j < s.acc.size() && j < it.acc.size(); ++j) s.acc[j] += it.acc[j];
  }
  s.loss /= s.steps;
  s.tau /= s.steps;
  for (double& a : s.acc) a /= s.steps;
  return s;
}

nlohmann::json AcceptanceJson(const AcceptanceReport& r) {
  nlohmann::json j = {{"chains", r.chain_lengths}, {"prompts", r.samples}, {"seconds", r.seconds}};
  for (size_t i = 0; i < r.chain_lengths.size(); ++i) {
    const std::string k = std::to_string(r.chain_lengths[i]);
    j["tau"][k] = r.counts[i].tau();
    j["rounds"][k] = r.counts[i].rounds;
  }
  return j;
}

MetricsProcessor::MetricsProcessor(const MetricsOptions& options, StudentMetrics* prometheus,
                                   size_t window)
    : options_(options), prometheus_(prometheus), first_(window), last_(window) {}

absl::StatusOr<std::unique_ptr<MetricsProcessor>> MetricsProcessor::Create(
    const MetricsOptions& options, StudentMetrics* prometheus) {
  // 5 to 50 steps: a tenth of the run.
  const size_t window =
      static_cast<size_t>(std::max<int64_t>(5, std::min<int64_t>(50, options.planned_steps / 10)));
  std::unique_ptr<MetricsProcessor> m(new MetricsProcessor(options, prometheus, window));
  if (!options.step_log.empty()) {
    const std::string path = options.layout.data_parallel()
                                 ? absl::StrCat(options.step_log, ".rank", options.layout.rank())
                                 : options.step_log;
    m->step_log_.open(path, std::ios::app);
    if (!m->step_log_) {
      return absl::FailedPreconditionError(
          absl::StrCat("--step_log ", path, ": cannot open for append"));
    }
  }
  if (!options.tensorboard_dir.empty()) {
    absl::StatusOr<std::unique_ptr<EventFileWriter>> tb = EventFileWriter::Open(options.tensorboard_dir);
    if (!tb.ok()) return tb.status();
    m->tensorboard_ = std::move(tb).value();
  }
  return m;
}

void MetricsProcessor::TensorBoardFailed(const absl::Status& status) {
  if (status.ok() || tensorboard_failed_) return;
  tensorboard_failed_ = true;
  std::fprintf(stderr, "student[%d]: warning: TensorBoard: %s; training goes on\n", options_.layout.rank(),
               std::string(status.message()).c_str());
}

// TensorBoard's tags: one chart per quantity, grouped as the step log is.
void MetricsProcessor::WriteScalars(const StepRecord& r, double seconds) {
  if (tensorboard_ == nullptr) return;
  std::vector<std::pair<std::string, double>> scalars = {
      {"train/loss", r.loss},
      {"train/simulated_tau", r.tau},
      {"train/lr", r.lr},
      {"train/tokens_per_second", seconds > 0 ? static_cast<double>(r.tokens) / seconds : 0.0},
      {"train/data_wait_seconds", r.wait_seconds}};
  for (size_t j = 0; j < r.acc.size(); ++j) scalars.emplace_back(absl::StrCat("train/acc_", j), r.acc[j]);
  for (const auto& [tag, value] : scalars) TensorBoardFailed(tensorboard_->AddScalar(tag, r.step, value));
  if (options_.log_every > 0 && r.step % options_.log_every == 0) TensorBoardFailed(tensorboard_->Flush());
}

double MetricsProcessor::train_seconds() const {
  if (!first_start_.has_value() || !last_end_.has_value()) return 0;
  return Seconds(*last_end_ - *first_start_);
}

void MetricsProcessor::WriteLine(const nlohmann::json& line) {
  if (!step_log_.is_open()) return;
  step_log_ << line.dump() << "\n";
  step_log_.flush();
}

void MetricsProcessor::RecordStep(const StepRecord& r) {
  const Clock::time_point end = Clock::now();
  if (!first_start_.has_value()) first_start_ = r.started;
  last_end_ = end;
  tokens_ += r.tokens;
  wait_ += r.wait_seconds;
  const double seconds = Seconds(end - r.started);
  if (r.tokens > 0) {  // an empty data-parallel share has no loss or accuracy
    if (!first_.full()) first_.Add(r.loss, r.tau, r.acc);
    last_.Add(r.loss, r.tau, r.acc);
    nlohmann::json line = {{"step", r.step},
                           {"loss", r.loss},
                           {"simulated_tau", r.tau},
                           {"acc", r.acc},
                           {"lr", r.lr},
                           {"tokens", r.tokens},
                           {"seconds", seconds},
                           {"data_wait_seconds", r.wait_seconds}};
    if (!r.acceptance_rate.empty()) line["acceptance_rate"] = r.acceptance_rate;
    WriteLine(line);
    WriteScalars(r, seconds);
    if (prometheus_ != nullptr) {
      StepReport p;
      p.tokens = r.tokens;
      p.step_seconds = seconds;
      p.data_wait_seconds = r.wait_seconds;
      p.loss = r.loss;
      p.learning_rate = r.lr;
      p.tau = r.tau;
      p.acc = r.acc;
      p.ploss = r.ploss;
      prometheus_->Record(p);
    }
  }
  MaybeLog(r);
}

void MetricsProcessor::MaybeLog(const StepRecord& r) {
  if (options_.log_every <= 0 || r.step % options_.log_every != 0) return;
  const double dt = std::max(Seconds(Clock::now() - last_log_), 1e-9);
  const std::string expected = r.acceptance_rate.empty()
                                   ? ""
                                   : " | expected acceptance " + AccString(r.acceptance_rate);
  std::printf(
      "student[%d]: step %ld/%ld | loss %.3f | acc %s%s | simulated tau %.2f | lr %.2e | %.0f tok/s "
      "| wait %.0f%%\n",
      options_.layout.rank(), static_cast<long>(r.step), static_cast<long>(options_.planned_steps), r.loss,
      AccString(r.acc).c_str(), expected.c_str(), r.tau, r.lr, (tokens_ - tokens_at_log_) / dt,
      100.0 * (wait_ - wait_at_log_) / dt);
  std::fflush(stdout);
  last_log_ = Clock::now();
  tokens_at_log_ = tokens_;
  wait_at_log_ = wait_;
}

void MetricsProcessor::RecordAcceptance(int64_t step, const AcceptanceReport& r, const char* what) {
  if (options_.layout.is_first()) {
    std::printf("student[0]: step %ld acceptance%s: %s\n", static_cast<long>(step), what,
                r.Summary().c_str());
    std::fflush(stdout);
  }
  WriteLine({{"step", step}, {"eval", AcceptanceJson(r)}});
  if (tensorboard_ != nullptr) {
    for (size_t i = 0; i < r.chain_lengths.size(); ++i) {
      TensorBoardFailed(
          tensorboard_->AddScalar(absl::StrCat("eval/tau_chain_", r.chain_lengths[i]), step, r.counts[i].tau()));
    }
    TensorBoardFailed(tensorboard_->Flush());
  }
  if (prometheus_ != nullptr) {
    std::vector<double> tau;
    for (const AcceptanceCounts& c : r.counts) tau.push_back(c.tau());
    prometheus_->RecordAcceptance(r.chain_lengths, tau);
  }
}

}  // namespace e3
