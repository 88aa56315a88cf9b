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
#include "student_trainer/checkpoint/best_draft.h"
#include "student_trainer/checkpoint/checkpoint_manager.h"
#include "student_trainer/draft/draft_export.h"
#include "student_trainer/draft_builder.h"
#include "student_trainer/feed/teacher_pool.h"
#include "student_trainer/optim/data_parallel.h"
#include "student_trainer/optim/lr_schedule.h"
#include "student_trainer/step/train_step.h"

namespace e3 {
namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json WindowJson(const WindowStats& w) {
  return {{"steps", w.steps}, {"loss", w.loss}, {"simulated_tau", w.tau}, {"acc", w.acc}};
}

class Trainer {
 public:
  Trainer(const TrainerOptions& o, StudentMetrics* prometheus) : o_(o), prometheus_(prometheus) {}

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

  int rank() const { return o_.client.rank; }
  bool Stopping() const { return o_.stop != nullptr && o_.stop->load(); }

  const TrainerOptions o_;
  StudentMetrics* prometheus_;
  const Clock::time_point start_ = Clock::now();
  at::Device device_{at::kCPU};
  std::unique_ptr<TeacherPool> teachers_;
  std::unique_ptr<ProcessGroup> group_;
  BuiltDraft draft_;
  std::unique_ptr<CheckpointManager> checkpoints_;
  std::unique_ptr<AcceptanceEval> acceptance_;
  std::optional<BestDraft> best_;
  std::unique_ptr<MetricsProcessor> metrics_;
  LrSchedule schedule_;
  TttOptions ttt_;
  TrainerState state_;
  TrainSummary summary_;
};

absl::Status Trainer::BuildTeachersAndDraft() {
  std::vector<std::string> addresses = o_.teachers;
  if (addresses.empty()) addresses.push_back(o_.client.address);
  E3_ASSIGN_OR_RETURN(device_, ParseStudentDevice(o_.device));
  TeacherClientOptions client = o_.client;
  client.device = o_.device;
  E3_ASSIGN_OR_RETURN(teachers_, TeacherPool::Connect(addresses, client));
  E3_ASSIGN_OR_RETURN(ttt_.loss, ParseTttLoss(o_.ttt_loss));
  E3_ASSIGN_OR_RETURN(const FrozenWeights frozen, teachers_->FetchWeights(NeedsFullTargetHead(ttt_.loss)));

  // Data parallelism: every rank starts from rank 0's weights, and the
  // optimizer averages gradients over the ranks before each update.
  LaunchEnv launch;
  launch.rank = rank();
  launch.world_size = o_.client.world_size;
  launch.master_addr = o_.master_addr;
  launch.master_port = o_.master_port;
  launch.rendezvous_file = o_.rendezvous_file;
  E3_ASSIGN_OR_RETURN(group_, JoinDataParallelGroup(launch, device_));

  DraftBuildOptions d;
  d.device = device_;
  d.dtype = o_.dtype;
  d.init_seed = o_.init_seed;
  d.intermediate_size = o_.intermediate_size;
  if (!o_.init_from.empty() && d.intermediate_size == 0) {
    // A warm start takes the draft's own width unless one is asked for.
    E3_ASSIGN_OR_RETURN(const Eagle3DraftConfig from, ReadDraftConfig(JoinPath(o_.init_from, kDraftConfigFile)));
    d.intermediate_size = from.intermediate_size;
  }
  d.keep_full_target_head = NeedsFullTargetHead(ttt_.loss);
  E3_ASSIGN_OR_RETURN(d.kernels, ParseTttKernels(o_.student_kernels));
  d.optimizer.beta1 = o_.beta1;
  d.optimizer.beta2 = o_.beta2;
  d.optimizer.weight_decay = o_.weight_decay;
  d.optimizer.grad_clip = o_.grad_clip;
  E3_ASSIGN_OR_RETURN(draft_, BuildDraft(teachers_->info(), frozen, d, group_.get()));
  summary_.device = device_.str();
  summary_.dtype = draft_.dtype_name;
  std::printf("student[%d]: draft on %s, compute %s%s, %s kernels\n", rank(), device_.str().c_str(),
              draft_.dtype_name.c_str(),
              draft_.master.has_value() ? " with fp32 master weights" : "",
              d.kernels == TttKernels::kFast ? "fast" : "reference");

  ttt_.length = o_.ttt_length;
  ttt_.kernels = d.kernels;
  E3_ASSIGN_OR_RETURN(ttt_.positions, ParseTttPositions(o_.ttt_positions));
  ttt_.kl_scale = o_.kl_scale;
  ttt_.kl_decay = o_.kl_decay;
  ttt_.defer_metrics = true;  // read after the optimizer step: one synchronisation per step
  return absl::OkStatus();
}

absl::Status Trainer::Resume() {
  CheckpointManagerOptions c;
  c.dir = o_.checkpoint_dir;
  c.every = o_.checkpoint_every;
  c.keep = o_.keep_checkpoints;
  E3_ASSIGN_OR_RETURN(c.on_save_error, ParseOnCheckpointSaveError(o_.on_checkpoint_save_error));
  E3_ASSIGN_OR_RETURN(c.on_load_error, ParseOnCheckpointLoadError(o_.on_checkpoint_load_error));
  c.rank = rank();
  c.group = group_.get();
  c.device = device_;
  checkpoints_ = std::make_unique<CheckpointManager>(c);
  state_.subscriber_id = o_.client.subscriber_id;
  state_.cursors.assign(teachers_->size(), StreamCursor(0, 0, {}, /*consumed=*/0));
  E3_ASSIGN_OR_RETURN(std::optional<TrainerState> resumed,
                      checkpoints_->Resume(draft_.trained(), *draft_.optimizer, teachers_->size()));
  if (resumed.has_value()) {
    state_ = *resumed;
    summary_.resumed = true;
    summary_.resumed_from_step = state_.step;
  } else if (!o_.init_from.empty()) {
    E3_RETURN_IF_ERROR(WarmStart());
  }
  return BroadcastTrainedWeights(group_.get(), draft_.trained(), *draft_.optimizer);
}

absl::Status Trainer::WarmStart() {
  // Every rank reads the export (it is small), so no broadcast of a
  // half-loaded draft can happen; the broadcast after it keeps them equal.
  E3_RETURN_IF_ERROR(LoadDraftExport(draft_.trained(), o_.init_from, OtherTarget::kWarn));
  draft_.init_from = o_.init_from;
  summary_.warm_started_from = o_.init_from;
  std::printf("student[%d]: warm start from the draft in %s (fresh optimizer state and data stream)\n", rank(),
              o_.init_from.c_str());
  return absl::OkStatus();
}

absl::Status Trainer::BuildScheduleAndMetrics() {
  const int64_t planned = o_.max_steps > 0 ? o_.max_steps : teachers_->planned_batches();
  schedule_.peak = o_.learning_rate;
  schedule_.min_ratio = o_.min_lr_ratio;
  schedule_.total_steps = planned;
  schedule_.warmup_steps =
      o_.warmup_steps >= 0 ? o_.warmup_steps : static_cast<int64_t>(o_.warmup_ratio * planned);
  E3_ASSIGN_OR_RETURN(acceptance_, AcceptanceEval::Create(teachers_->first(), o_.eval, group_.get(),
                                                          rank(), o_.client.world_size, device_));
  if (acceptance_->enabled() && rank() == 0) {
    const std::string when = o_.eval.every > 0
                                 ? absl::StrCat("every ", o_.eval.every, " steps and at the end")
                                 : "at the end";
    std::printf("student[0]: real acceptance length on %s's eval set %s (chains %s)\n",
                teachers_->address(0).c_str(), when.c_str(),
                absl::StrJoin(acceptance_->chain_lengths(), ", ").c_str());
  }
  BestDraftOptions b;
  b.dir = o_.best_dir;
  b.chain = o_.eval.chain;
  b.patience = o_.early_stop_patience;
  E3_ASSIGN_OR_RETURN(b.dtype, ParseComputeScalarType(o_.export_dtype));
  b.writer = rank() == 0;
  E3_ASSIGN_OR_RETURN(BestDraft best, BestDraft::Open(b));
  best_ = std::move(best);
  MetricsOptions m;
  m.rank = rank();
  m.world_size = o_.client.world_size;
  m.step_log = o_.step_log;
  m.log_every = o_.log_every;
  m.planned_steps = planned;
  m.tensorboard_dir = rank() == 0 ? o_.tensorboard_dir : "";
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
  const double lr = schedule_.At(state_.step);
  E3_ASSIGN_OR_RETURN(
      const TttOutput out,
      TrainStep(*draft_.draft, *draft_.optimizer, batch.num_tokens > 0 ? &batch.tensors : nullptr,
                ttt_, lr, state_.step));
  E3_RETURN_IF_ERROR(teachers_->Ack(pooled.teacher, batch));
  state_.step += 1;
  state_.tokens += batch.num_tokens;
  cursor.epoch = batch.epoch;
  cursor.next_batch = batch.index + 1;
  summary_.transport = TransportName(batch.transport);

  StepRecord r;
  r.step = state_.step;
  r.tokens = batch.num_tokens;
  r.loss = out.loss_value;
  r.tau = out.tau;
  r.acc = out.acc;
  r.ploss = out.ploss;
  r.acceptance_rate = out.acceptance_rate;
  r.lr = lr;
  r.started = started;
  r.wait_seconds = pooled.wait_seconds;
  metrics_->RecordStep(r);

  if (checkpoints_->Due(state_.step)) {
    E3_RETURN_IF_ERROR(checkpoints_->Save(state_, draft_.trained(), *draft_.optimizer, *teachers_));
  }
  E3_ASSIGN_OR_RETURN(std::optional<AcceptanceReport> measured,
                      acceptance_->AtStep(state_.step, draft_.trained()));
  if (measured.has_value()) E3_RETURN_IF_ERROR(Measured(state_.step, *measured, ""));
  return true;
}

absl::Status Trainer::Measured(int64_t step, const AcceptanceReport& report, const char* what) {
  metrics_->RecordAcceptance(step, report, what);
  E3_RETURN_IF_ERROR(best_->Consider(step, report, draft_.trained()));
  if (best_->ShouldStop() && !summary_.stopped_early) {
    summary_.stopped_early = true;
    if (rank() == 0) {
      std::printf("student[0]: stopping early: tau has not improved for %ld measurements (best %.3f at step %ld)\n",
                  static_cast<long>(best_->measurements_since_best()), best_->tau(),
                  static_cast<long>(best_->step()));
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::MeasureAtEnd() {
  E3_ASSIGN_OR_RETURN(summary_.eval, acceptance_->Final(state_.step, draft_.trained()));
  if (!summary_.eval.has_value()) return absl::OkStatus();
  if (acceptance_->measured_at() != state_.step)
    E3_RETURN_IF_ERROR(Measured(state_.step, *summary_.eval, " (final)"));
  E3_RETURN_IF_ERROR(acceptance_->Dump(draft_.trained(), *summary_.eval));
  if (!o_.eval.untrained) return absl::OkStatus();
  E3_ASSIGN_OR_RETURN(Eagle3Draft untrained, draft_.Initial());
  E3_ASSIGN_OR_RETURN(summary_.eval_untrained, acceptance_->Measure(*untrained));
  if (summary_.eval_untrained.has_value() && rank() == 0) {
    std::printf("student[0]: acceptance of the %s draft: %s\n",
                draft_.init_from.empty() ? "untrained" : "warm-start", summary_.eval_untrained->Summary().c_str());
  }
  return absl::OkStatus();
}

absl::Status Trainer::Export() {
  if (o_.output_dir.empty() || rank() != 0) return absl::OkStatus();
  DraftExportOptions exp;
  E3_ASSIGN_OR_RETURN(exp.dtype, ParseComputeScalarType(o_.export_dtype));
  E3_RETURN_IF_ERROR(ExportDraft(draft_.trained(), o_.output_dir, exp));
  summary_.export_dir = o_.output_dir;
  return absl::OkStatus();
}

TrainSummary Trainer::Summary() {
  summary_.steps = state_.step;
  summary_.tokens = state_.tokens;
  summary_.run_steps = state_.step - summary_.resumed_from_step;
  summary_.run_tokens = metrics_->tokens();
  summary_.best_tau = best_->tau();
  summary_.best_step = best_->step();
  if (best_->step() >= 0) summary_.best_dir = o_.best_dir;
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
  while ((o_.max_steps == 0 || state_.step < o_.max_steps) && !summary_.stopped_early) {
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
  E3_RETURN_IF_ERROR(checkpoints_->Save(state_, draft_.trained(), *draft_.optimizer, *teachers_,
                                        /*last=*/!by_signal, /*final_report=*/by_signal));
  if (!by_signal) E3_RETURN_IF_ERROR(MeasureAtEnd());
  E3_RETURN_IF_ERROR(Export());
  const TrainSummary summary = Summary();
  if (!o_.summary_json.empty()) std::ofstream(o_.summary_json) << summary.ToJson() << "\n";
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

absl::StatusOr<TrainSummary> RunTrainer(const TrainerOptions& options, StudentMetrics* metrics) {
  Trainer trainer(options, metrics);
  E3_RETURN_IF_ERROR(trainer.Build());
  return trainer.Train();
}

}  // namespace e3
