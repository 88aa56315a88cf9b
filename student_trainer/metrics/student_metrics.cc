#include "student_trainer/metrics/student_metrics.h"

namespace e3 {

std::vector<prometheus::MetricFamily> StudentMetrics::LockedRegistry::Collect() const {
  std::lock_guard<std::mutex> lock(mu);
  return registry.Collect();
}

StudentMetrics::StudentMetrics(int rank, int ttt_length) : registry_(std::make_shared<LockedRegistry>()) {
  prometheus::Registry* const reg = &registry_->registry;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  const prometheus::Labels base{{"rank", std::to_string(rank)}};
  steps_ = &BuildCounter().Name("e3_student_steps_total").Help("Optimizer steps.").Register(*reg).Add(base);
  tokens_ = &BuildCounter().Name("e3_student_tokens_total").Help("Tokens trained on.").Register(*reg).Add(base);
  step_seconds_ = &BuildCounter().Name("e3_student_step_seconds_total").Help("Wall seconds in training steps (wait included).")
                       .Register(*reg).Add(base);
  wait_seconds_ = &BuildCounter().Name("e3_student_data_wait_seconds_total").Help("Wall seconds blocked waiting for data.")
                       .Register(*reg).Add(base);
  loss_ = &BuildGauge().Name("e3_student_loss").Help("Weighted TTT loss of the last step.").Register(*reg).Add(base);
  lr_ = &BuildGauge().Name("e3_student_learning_rate").Help("Learning rate of the last step.").Register(*reg).Add(base);
  tau_ = &BuildGauge().Name("e3_student_tau").Help("Simulated acceptance length 1 + sum_k prod_{i<=k} acc_i.")
              .Register(*reg).Add(base);
  eval_tau_ = &BuildGauge()
                   .Name("e3_student_eval_acceptance_length")
                   .Help("Real acceptance length (tokens per verify round) of chain drafting on the eval set.")
                   .Register(*reg);
  base_ = base;
  auto& acc = BuildGauge().Name("e3_student_acc").Help("Top-1 agreement with the target at TTT step j.").Register(*reg);
  auto& ploss = BuildGauge().Name("e3_student_ploss").Help("Soft cross-entropy at TTT step j.").Register(*reg);
  for (int j = 0; j < ttt_length; ++j) {
    prometheus::Labels l = base;
    l["step"] = std::to_string(j);
    acc_.push_back(&acc.Add(l));
    ploss_.push_back(&ploss.Add(l));
  }
}

void StudentMetrics::Record(const StepReport& r) {
  std::lock_guard<std::mutex> lock(registry_->mu);
  steps_->Increment();
  tokens_->Increment(static_cast<double>(r.tokens));
  step_seconds_->Increment(r.step_seconds);
  wait_seconds_->Increment(r.data_wait_seconds);
  loss_->Set(r.loss);
  lr_->Set(r.learning_rate);
  tau_->Set(r.tau);
  for (size_t j = 0; j < acc_.size() && j < r.acc.size(); ++j) acc_[j]->Set(r.acc[j]);
  for (size_t j = 0; j < ploss_.size() && j < r.ploss.size(); ++j) ploss_[j]->Set(r.ploss[j]);
}

void StudentMetrics::RecordAcceptance(const std::vector<int64_t>& chain_lengths, const std::vector<double>& tau) {
  std::lock_guard<std::mutex> lock(registry_->mu);
  for (size_t i = 0; i < chain_lengths.size() && i < tau.size(); ++i) {
    prometheus::Labels l = base_;
    l["chain"] = std::to_string(chain_lengths[i]);
    eval_tau_->Add(l).Set(tau[i]);
  }
}

}  // namespace e3
