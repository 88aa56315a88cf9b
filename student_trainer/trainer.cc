#include "student_trainer/trainer.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "nlohmann/json.hpp"
#include "student_trainer/algorithm/draft_algorithm.h"
#include "student_trainer/checkpoint/best_draft.h"
#include "student_trainer/checkpoint/checkpoint_manager.h"
#include "student_trainer/feed/teacher_pool.h"
#include "student_trainer/optim/data_parallel.h"
#include "student_trainer/optim/lr_schedule.h"

namespace e3 {
namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json WindowJson(const WindowStats& w) {
  return {{"steps", w.steps}, {"loss", w.loss}, {"simulated_tau", w.tau}, {"acc", w.acc}};
}

class Trainer {
 public:
  Trainer(const RunConfig& config, const StudentProcess& process, StudentMetrics* prometheus)
      : config_(config), process_(process), prometheus_(prometheus) {}

  // The components, in the order they depend on each other.
  absl::Status Build();
  // The loop, then what ends a run.
  absl::StatusOr<TrainSummary> Train();

 private:
  absl::Status BuildTeachersAndDraft();
  absl::Status Resume();
  // No checkpoint resumed the run: start from init_from's weights.
  absl::Status WarmStart();
  absl::Status BuildScheduleAndMetrics();
  // One batch from the pool: trained, or (an empty share on one rank)
  // acked; false once every teacher's data has ended or any rank was
  // stopped by a signal.
  absl::StatusOr<bool> TrainOneBatch();
  // A real-tau measurement after `step`: logged, and kept when the best.
  absl::Status Measured(int64_t step, const AcceptanceReport& report, const char* what);
  absl::Status MeasureAtEnd();
  absl::Status Export();
  TrainSummary Summary();

  int rank() const { return process_.layout.rank(); }
  bool Stopping() const { return process_.stop != nullptr && process_.stop->load(); }
  const ScheduleSettings& schedule() const { return config_.schedule; }
  const StudentsSettings& students() const { return config_.students; }

  const RunConfig& config_;
  const StudentProcess& process_;
  StudentMetrics* prometheus_;
  const Clock::time_point start_ = Clock::now();
  at::Device device_{at::kCPU};
  std::unique_ptr<TeacherPool> teachers_;
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<DraftAlgorithm> algorithm_;
  std::unique_ptr<CheckpointManager> checkpoints_;
  std::unique_ptr<AcceptanceEval> acceptance_;
  std::optional<BestDraft> best_;
  std::unique_ptr<MetricsProcessor> metrics_;
  LrSchedule lr_;
  TrainerState state_;
  TrainSummary summary_;
};

absl::Status Trainer::BuildTeachersAndDraft() {
  E3_ASSIGN_OR_RETURN(device_, ParseUsableDevice(process_.device, "--device"));
  E3_ASSIGN_OR_RETURN(algorithm_, CreateDraftAlgorithm(config_.draft, schedule(), device_));
  TeacherClientOptions client = TeacherClientOptions::FromSettings(students(), schedule());
  client.layout = process_.layout;
  client.subscriber_id = process_.subscriber_id;
  client.transports = process_.transports;
  client.host = process_.host;
  client.device = process_.device;
  client.stop = process_.stop;
  E3_ASSIGN_OR_RETURN(teachers_, TeacherPool::Connect(process_.teachers, client));
  // The draft declares what it reads; every teacher must capture it, and
  // sends it only that.
  E3_ASSIGN_OR_RETURN(const TeacherNeeds needs, algorithm_->needs(teachers_->info().config));
  E3_RETURN_IF_ERROR(teachers_->RequestFeatures(needs.features));
  std::printf("student[%d]: reads aux layers [%s] and %s of every batch%s\n", rank(),
              absl::StrJoin(needs.features.aux_layer_ids, ", ").c_str(), FeatureTensorsText(needs.features).c_str(),
              students().group.empty() ? "" : absl::StrCat(" (student group ", students().group, ")").c_str());
  E3_ASSIGN_OR_RETURN(const FrozenWeights frozen, teachers_->FetchWeights(needs.target_head_rest));
  // Data parallelism: every rank starts from rank 0's weights, and the
  // optimizer averages gradients over the ranks before each update.
  E3_ASSIGN_OR_RETURN(group_, JoinDataParallelGroup(process_.launch, device_));
  E3_RETURN_IF_ERROR(algorithm_->Build(teachers_->info(), frozen, group_.get()));
  summary_.device = device_.str();
  summary_.dtype = algorithm_->compute_dtype();
  std::printf("student[%d]: %s\n", rank(), algorithm_->Describe().c_str());
  return absl::OkStatus();
}

absl::Status Trainer::Resume() {
  CheckpointManagerOptions c;
  c.dir = students().checkpoint_dir;
  c.every = schedule().checkpoint_every;
  c.keep = static_cast<int>(schedule().keep_checkpoints);
  E3_ASSIGN_OR_RETURN(c.on_save_error, ParseOnCheckpointSaveError(schedule().on_checkpoint_save_error));
  E3_ASSIGN_OR_RETURN(c.on_load_error, ParseOnCheckpointLoadError(schedule().on_checkpoint_load_error));
  c.layout = process_.layout;
  c.group = group_.get();
  c.device = device_;
  checkpoints_ = std::make_unique<CheckpointManager>(c);
  state_.subscriber_id = process_.subscriber_id;
  state_.cursors.assign(teachers_->size(), StreamCursor(0, 0, {}, /*consumed=*/0));
  E3_ASSIGN_OR_RETURN(std::optional<TrainerState> resumed,
                      checkpoints_->Resume(algorithm_->trained(), algorithm_->optimizer(), teachers_->size()));
  if (resumed.has_value()) {
    state_ = *resumed;
    summary_.resumed = true;
    summary_.resumed_from_step = state_.step;
  } else if (!config_.draft.init_from.empty()) {
    E3_RETURN_IF_ERROR(WarmStart());
  }
  return BroadcastTrainedWeights(group_.get(), algorithm_->trained(), algorithm_->optimizer());
}

absl::Status Trainer::WarmStart() {
  // Every rank reads the export (it is small), so no broadcast of a
  // half-loaded draft can happen; the broadcast after it keeps them equal.
  const std::string& from = config_.draft.init_from;
  E3_RETURN_IF_ERROR(algorithm_->WarmStart(from));
  summary_.warm_started_from = from;
  std::printf("student[%d]: warm start from the draft in %s (fresh optimizer state and data stream)\n", rank(),
              from.c_str());
  return absl::OkStatus();
}

absl::Status Trainer::BuildScheduleAndMetrics() {
  const int64_t planned = schedule().max_steps > 0 ? schedule().max_steps : teachers_->planned_batches();
  lr_ = LrSchedule::From(schedule(), planned);
  AcceptanceEvalOptions eval;
  eval.every = schedule().eval_every;
  eval.chain = algorithm_->eval_chain();
  eval.wait_s = schedule().eval_wait_s;
  eval.untrained = schedule().eval_untrained;
  eval.dump = students().eval_dump;
  E3_ASSIGN_OR_RETURN(acceptance_,
                      AcceptanceEval::Create(teachers_->first(), eval, group_.get(), process_.layout, device_));
  if (acceptance_->enabled() && process_.layout.is_first()) {
    const std::string when = eval.every > 0
                                 ? absl::StrCat("every ", eval.every, " steps and at the end")
                                 : "at the end";
    std::printf("student[0]: real acceptance length on %s's eval set %s (chains %s)\n",
                teachers_->address(0).c_str(), when.c_str(),
                absl::StrJoin(acceptance_->chain_lengths(), ", ").c_str());
  }
  BestDraftOptions b;
  b.dir = students().best_dir;
  b.chain = algorithm_->eval_chain();
  b.patience = schedule().early_stop_patience;
  E3_ASSIGN_OR_RETURN(b.dtype, ParseComputeScalarType(config_.draft.export_dtype));
  b.writer = process_.layout.is_first();
  E3_ASSIGN_OR_RETURN(BestDraft best, BestDraft::Open(b));
  best_ = std::move(best);
  MetricsOptions m;
  m.layout = process_.layout;
  m.step_log = students().step_log;
  m.log_every = static_cast<int>(schedule().log_every);
  m.planned_steps = planned;
  m.tensorboard_dir = process_.layout.is_first() ? students().tensorboard_dir : "";
  E3_ASSIGN_OR_RETURN(metrics_, MetricsProcessor::Create(m, prometheus_));
  return absl::OkStatus();
}

absl::Status Trainer::Build() {
  E3_RETURN_IF_ERROR(BuildTeachersAndDraft());
  E3_RETURN_IF_ERROR(Resume());
  E3_RETURN_IF_ERROR(BuildScheduleAndMetrics());
  // Each teacher streams from the cursor the checkpoint holds for it; the
  // checkpoints keep the data stream each cursor belongs to with it.
  E3_RETURN_IF_ERROR(teachers_->Start(state_.cursors));
  for (size_t i = 0; i < state_.cursors.size(); ++i) state_.cursors[i].data = teachers_->fingerprint(i);
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::TrainOneBatch() {
  const Clock::time_point started = Clock::now();
  absl::StatusOr<std::optional<PooledBatch>> next = teachers_->Next();
  // A signal stops every rank at the same batch: this one is neither
  // trained nor acked, so the teacher delivers it again after a resume.
  // (A teacher drained by the same signal may also have refused the
  // resubscription by now.)
  const bool interrupted = !next.ok() && Stopping();
  if (!next.ok() && !interrupted) return next.status();
  E3_ASSIGN_OR_RETURN(const bool stop, AnyRank(group_.get(), interrupted || Stopping(), device_));
  if (stop) {
    summary_.stopped_by_signal = true;
    return false;
  }
  if (!next->has_value()) return false;
  const PooledBatch& pooled = **next;
  const StudentBatch& batch = pooled.batch;
  // Only the position moves: the cursor keeps its data stream's fingerprint.
  StreamCursor& cursor = state_.cursors[pooled.teacher];
  if (cursor.consumed >= 0) ++cursor.consumed;
  if (batch.num_tokens == 0 &&
      group_ == nullptr) {  // this rank's share of a small global batch was empty
    cursor.epoch = batch.epoch;
    cursor.next_batch = batch.index + 1;
    ++state_.skipped_batches;
    E3_RETURN_IF_ERROR(teachers_->Ack(pooled.teacher, batch));
    return true;
  }
  const double lr = lr_.At(state_.step);
  E3_ASSIGN_OR_RETURN(const DraftStepOutput out,
                      algorithm_->Step(batch.num_tokens > 0 ? &batch.tensors : nullptr, lr, state_.step));
  E3_RETURN_IF_ERROR(teachers_->Ack(pooled.teacher, batch));
  state_.step += 1;
  state_.tokens += batch.num_tokens;
  cursor.epoch = batch.epoch;
  cursor.next_batch = batch.index + 1;
  summary_.transport = TransportName(batch.transport);

  StepRecord r;
  r.step = state_.step;
  r.tokens = batch.num_tokens;
  r.loss = out.loss;
  r.tau = out.tau;
  r.acc = out.acc;
  r.ploss = out.ploss;
  r.acceptance_rate = out.acceptance_rate;
  r.lr = lr;
  r.started = started;
  r.wait_seconds = pooled.wait_seconds;
  metrics_->RecordStep(r);

  // The last step's checkpoint is Train's final one, taken once the eval
  // set is held: its commit may be what lets an --exit_when_done teacher
  // leave, and the final measurement still needs that teacher's eval set.
  const bool last_step = schedule().max_steps > 0 && state_.step >= schedule().max_steps;
  if (checkpoints_->Due(state_.step) && !last_step) {
    E3_RETURN_IF_ERROR(checkpoints_->Save(state_, algorithm_->trained(), algorithm_->optimizer(), *teachers_));
  }
  E3_ASSIGN_OR_RETURN(std::optional<AcceptanceReport> measured,
                      acceptance_->AtStep(state_.step, algorithm_->trained()));
  if (measured.has_value()) E3_RETURN_IF_ERROR(Measured(state_.step, *measured, ""));
  return true;
}

absl::Status Trainer::Measured(int64_t step, const AcceptanceReport& report, const char* what) {
  metrics_->RecordAcceptance(step, report, what);
  E3_RETURN_IF_ERROR(best_->Consider(step, report, algorithm_->trained()));
  if (best_->ShouldStop() && !summary_.stopped_early) {
    summary_.stopped_early = true;
    if (process_.layout.is_first()) {
      std::printf("student[0]: stopping early: tau has not improved for %ld measurements (best %.3f at step %ld)\n",
                  static_cast<long>(best_->measurements_since_best()), best_->tau(),
                  static_cast<long>(best_->step()));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::MeasureAtEnd() {
  E3_ASSIGN_OR_RETURN(summary_.eval, acceptance_->Final(state_.step, algorithm_->trained()));
  if (!summary_.eval.has_value()) return absl::OkStatus();
  if (acceptance_->measured_at() != state_.step)
    E3_RETURN_IF_ERROR(Measured(state_.step, *summary_.eval, " (final)"));
  E3_RETURN_IF_ERROR(acceptance_->Dump(algorithm_->trained(), *summary_.eval));
  if (!schedule().eval_untrained) return absl::OkStatus();
  E3_ASSIGN_OR_RETURN(const std::shared_ptr<DraftModel> untrained, algorithm_->Initial());
  E3_ASSIGN_OR_RETURN(summary_.eval_untrained, acceptance_->Measure(*untrained));
  if (summary_.eval_untrained.has_value() && process_.layout.is_first()) {
    std::printf("student[0]: acceptance of the %s draft: %s\n",
                summary_.warm_started_from.empty() ? "untrained" : "warm-start",
                summary_.eval_untrained->Summary().c_str());
  }
  return absl::OkStatus();
}

absl::Status Trainer::Export() {
  const std::string& dir = students().output_dir;
  if (dir.empty() || !process_.layout.is_first()) return absl::OkStatus();
  DraftExportOptions exp;
  E3_ASSIGN_OR_RETURN(exp.dtype, ParseComputeScalarType(config_.draft.export_dtype));
  E3_RETURN_IF_ERROR(algorithm_->trained().Export(dir, exp));
  summary_.export_dir = dir;
  return absl::OkStatus();
}

TrainSummary Trainer::Summary() {
  summary_.steps = state_.step;
  summary_.tokens = state_.tokens;
  summary_.run_steps = state_.step - summary_.resumed_from_step;
  summary_.run_tokens = metrics_->tokens();
  summary_.best_tau = best_->tau();
  summary_.best_step = best_->step();
  if (best_->step() >= 0) summary_.best_dir = students().best_dir;
  summary_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  summary_.train_seconds = metrics_->train_seconds();
  summary_.data_wait_seconds = metrics_->wait_seconds();
  summary_.first = metrics_->first();
  summary_.last = metrics_->last();
  summary_.last_checkpoint = checkpoints_->last_path();
  summary_.checkpoint_failures = checkpoints_->failures();
  return summary_;
}

absl::StatusOr<TrainSummary> Trainer::Train() {
  const int64_t max_steps = schedule().max_steps;
  while ((max_steps == 0 || state_.step < max_steps) && !summary_.stopped_early) {
    E3_ASSIGN_OR_RETURN(const bool trained, TrainOneBatch());
    if (!trained) break;
  }
  // The last commit waits for a teacher that is away, unless a signal
  // asked to stop: the checkpoint holds the cursor, and a restarted student
  // reports it with its first Subscribe. Stopped by a signal, the cursors
  // are reported even if a teacher has them (a draining teacher waits for
  // each rank's last word), and nothing is measured against a teacher that
  // is draining too; the export still holds the weights just checkpointed.
  const bool by_signal = summary_.stopped_by_signal;
  if (!by_signal) E3_RETURN_IF_ERROR(acceptance_->AwaitSet().status());
  E3_RETURN_IF_ERROR(checkpoints_->Save(state_, algorithm_->trained(), algorithm_->optimizer(), *teachers_,
                                        /*last=*/!by_signal, /*final_report=*/by_signal));
  if (!by_signal) E3_RETURN_IF_ERROR(MeasureAtEnd());
  E3_RETURN_IF_ERROR(Export());
  const TrainSummary summary = Summary();
  if (!students().summary_json.empty()) std::ofstream(students().summary_json) << summary.ToJson() << "\n";
  return summary;
}

}  // namespace

std::string TrainSummary::ToJson() const {
  nlohmann::json j = {
      {"steps", steps},
      {"tokens", tokens},
      {"run_steps", run_steps},
      {"run_tokens", run_tokens},
      {"seconds", seconds},
      {"train_seconds", train_seconds},
      {"tokens_per_second", train_seconds > 0 ? run_tokens / train_seconds : 0.0},
      {"data_wait_seconds", data_wait_seconds},
      {"data_wait_share", train_seconds > 0 ? data_wait_seconds / train_seconds : 0.0},
      {"first", WindowJson(first)},
      {"last", WindowJson(last)},
      {"export_dir", export_dir},
      {"last_checkpoint", last_checkpoint},
      {"checkpoint_failures", checkpoint_failures},
      {"resumed", resumed},
      {"resumed_from_step", resumed_from_step},
      {"warm_started_from", warm_started_from},
      {"stopped_by_signal", stopped_by_signal},
      {"stopped_early", stopped_early},
      {"best_tau", best_tau},
      {"best_step", best_step},
      {"best_dir", best_dir},
      {"device", device},
      {"dtype", dtype},
      {"transport", transport}};
  if (eval.has_value()) j["eval"] = AcceptanceJson(*eval);
  if (eval_untrained.has_value()) j["eval_untrained"] = AcceptanceJson(*eval_untrained);
  return j.dump(2);
}

absl::StatusOr<TrainSummary> RunTrainer(const RunConfig& config, const StudentProcess& process,
                                        StudentMetrics* metrics) {
  Trainer trainer(config, process, metrics);
  E3_RETURN_IF_ERROR(trainer.Build());
  return trainer.Train();
}

}  // namespace e3
