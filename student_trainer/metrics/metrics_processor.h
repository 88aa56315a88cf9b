// Where a student's step and acceptance measurements go: averages over
// the run's first and last windows of steps (for the summary), the step
// log (one JSON line per step and per measurement: the training curve
// tools/plot_run.py draws), Prometheus (student_metrics.h), and a console
// line every `log_every` steps with the throughput and data wait since the
// last one.
#ifndef E3_STUDENT_TRAINER_METRICS_METRICS_PROCESSOR_H_
#define E3_STUDENT_TRAINER_METRICS_METRICS_PROCESSOR_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/parallel_layout.h"
#include "common/tensorboard/event_writer.h"
#include "nlohmann/json.hpp"
#include "student_trainer/eval/acceptance.h"
#include "student_trainer/metrics/student_metrics.h"

namespace e3 {

struct WindowStats {
  int64_t steps = 0;
  double loss = 0;
  double tau = 0;
  std::vector<double> acc;
};

// Averages over the last `size` steps added.
class StepWindow {
 public:
  explicit StepWindow(size_t size) : size_(size) {}
  void Add(double loss, double tau, const std::vector<double>& acc);
  bool full() const { return items_.size() >= size_; }
  WindowStats Stats() const;

 private:
  struct Item {
    double loss, tau;
    std::vector<double> acc;
  };
  size_t size_;
  std::deque<Item> items_;
};

// {"chains": [3, 5, 7], "tau": {"3": ...}, "rounds": {...}, "prompts": n}
nlohmann::json AcceptanceJson(const AcceptanceReport& r);

struct MetricsOptions {
  ParallelLayout layout;  // the data-parallel ranks
  // Append JSON lines here; under data parallelism each rank to
  // <step_log>.rank<r>. Empty: no step log.
  std::string step_log;
  int log_every = 10;
  int64_t planned_steps = 0;  // shown in the console line; sizes the windows
  // The step log's scalars as TensorBoard event files here; empty: none.
  std::string tensorboard_dir;
};

struct StepRecord {
  int64_t step = 0;    // the step just finished (1-based)
  int64_t tokens = 0;  // 0: an empty data-parallel share, with no loss or accuracy
  double loss = 0;
  double tau = 1;
  std::vector<double> acc, ploss;
  std::vector<double> acceptance_rate;  // the LK losses' expected acceptance per step (else empty)
  double lr = 0;
  std::chrono::steady_clock::time_point started;  // before waiting for the batch
  double wait_seconds = 0;
};

class MetricsProcessor {
 public:
  using Clock = std::chrono::steady_clock;
  // `prometheus` may be null.
  static absl::StatusOr<std::unique_ptr<MetricsProcessor>> Create(const MetricsOptions& options,
                                                                  StudentMetrics* prometheus);

  void RecordStep(const StepRecord& r);
  // A real acceptance measurement after step `step`; `what` qualifies it
  // in the console line (e.g. " (final)").
  void RecordAcceptance(int64_t step, const AcceptanceReport& r, const char* what);

  WindowStats first() const { return first_.Stats(); }
  WindowStats last() const { return last_.Stats(); }
  int64_t tokens() const { return tokens_; }
  double wait_seconds() const { return wait_; }
  // From the first step's start to the last step's end.
  double train_seconds() const;

 private:
  MetricsProcessor(const MetricsOptions& options, StudentMetrics* prometheus, size_t window);
  void WriteLine(const nlohmann::json& line);
  void WriteScalars(const StepRecord& r, double seconds);
  // A TensorBoard write that fails is said once; training goes on.
  void TensorBoardFailed(const absl::Status& status);
  void MaybeLog(const StepRecord& r);

  MetricsOptions options_;
  StudentMetrics* prometheus_;
  std::ofstream step_log_;
  std::unique_ptr<EventFileWriter> tensorboard_;
  bool tensorboard_failed_ = false;
  StepWindow first_, last_;
  int64_t tokens_ = 0;
  double wait_ = 0;
  std::optional<Clock::time_point> first_start_, last_end_;
  Clock::time_point last_log_ = Clock::now();
  int64_t tokens_at_log_ = 0;
  double wait_at_log_ = 0;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_METRICS_METRICS_PROCESSOR_H_
