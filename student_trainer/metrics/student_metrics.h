// The student's Prometheus families (DESIGN.md "Operations").
#ifndef E3_STUDENT_TRAINER_METRICS_STUDENT_METRICS_H_
#define E3_STUDENT_TRAINER_METRICS_STUDENT_METRICS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace e3 {

struct StepReport {
  int64_t tokens = 0;
  double step_seconds = 0;
  double data_wait_seconds = 0;
  double loss = 0;
  double learning_rate = 0;
  double tau = 1;
  std::vector<double> acc;
  std::vector<double> ploss;
};

// Each scrape sees whole steps: Record and RecordAcceptance update their
// families under the lock that collection takes, so one scrape's steps,
// tokens, seconds, loss and acc_j all belong to the same step (a ratio such
// as data wait / step time, or a sample compared with the step log, never
// mixes two steps).
class StudentMetrics {
 public:
  StudentMetrics(int rank, int ttt_length);
  // What /metrics serves (MetricsServer::Start, RenderMetrics).
  std::shared_ptr<prometheus::Collectable> registry() const { return registry_; }
  void Record(const StepReport& r);
  // The real acceptance length measured on the eval set
  // (e3_student_eval_acceptance_length, labelled by chain length).
  void RecordAcceptance(const std::vector<int64_t>& chain_lengths, const std::vector<double>& tau);

 private:
  class LockedRegistry : public prometheus::Collectable {
   public:
    std::vector<prometheus::MetricFamily> Collect() const override;
    prometheus::Registry registry;
    mutable std::mutex mu;
  };
  std::shared_ptr<LockedRegistry> registry_;
  prometheus::Counter* steps_;
  prometheus::Counter* tokens_;
  prometheus::Counter* step_seconds_;
  prometheus::Counter* wait_seconds_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* lr_;
  prometheus::Gauge* tau_;
  std::vector<prometheus::Gauge*> acc_;
  std::vector<prometheus::Gauge*> ploss_;
  prometheus::Family<prometheus::Gauge>* eval_tau_;
  prometheus::Labels base_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_METRICS_STUDENT_METRICS_H_
