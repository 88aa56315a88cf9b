#include "student_trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "nlohmann/json.hpp"
#include "student_trainer/checkpoint.h"
#include "common/torch/process_group.h"
#include "student_trainer/draft_export.h"
#include "student_trainer/eagle3_draft.h"
#include "student_trainer/draft_optimizer.h"
#include "student_trainer/lr_schedule.h"
#include "student_trainer/student_metrics.h"
#include "student_trainer/ttt.h"

namespace e3 {
namespace {

using Clock = std::chrono::steady_clock;

// Averages over a window of steps (the first and last N of the run).
class Window {
 public:
  explicit Window(size_t size) : size_(size) {}
  void Add(double loss, double tau, const std::vector<double>& acc) {
    items_.push_back({loss, tau, acc});
    if (items_.size() > size_) items_.pop_front();
  }
  bool full() const { return items_.size() >= size_; }
  WindowStats Stats() const {
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

 private:
  struct Item {
    double loss, tau;
    std::vector<double> acc;
  };
  size_t size_;
  std::deque<Item> items_;
};

nlohmann::json WindowJson(const WindowStats& w) {
  return {{"steps", w.steps}, {"loss", w.loss}, {"simulated_tau", w.tau}, {"acc", w.acc}};
}

// {"chains": [3, 5, 7], "tau": {"3": ...}, "rounds": {...}, "prompts": n}
nlohmann::json AcceptanceJson(const AcceptanceReport& r) {
  nlohmann::json j = {{"chains", r.chain_lengths}, {"prompts", r.samples}, {"seconds", r.seconds}};
  for (size_t i = 0; i < r.chain_lengths.size(); ++i) {
    const std::string k = std::to_string(r.chain_lengths[i]);
    j["tau"][k] = r.counts[i].tau();
    j["rounds"][k] = r.counts[i].rounds;
  }
  return j;
}

std::string AccString(const std::vector<double>& acc) {
  std::vector<std::string> parts;
  for (double a : acc) parts.push_back(absl::StrFormat("%.2f", a));
  return absl::StrJoin(parts, " ");
}

}  // namespace

std::string TrainSummary::ToJson() const {
  nlohmann::json j = {{"steps", steps},
                      {"tokens", tokens},
                      {"seconds", seconds},
                      {"train_seconds", train_seconds},
                      {"tokens_per_second", train_seconds > 0 ? tokens / train_seconds : 0.0},
                      {"data_wait_seconds", data_wait_seconds},
                      {"data_wait_share", train_seconds > 0 ? data_wait_seconds / train_seconds : 0.0},
                      {"first", WindowJson(first)},
                      {"last", WindowJson(last)},
                      {"export_dir", export_dir},
                      {"last_checkpoint", last_checkpoint},
                      {"resumed", resumed},
                      {"resumed_from_step", resumed_from_step},
                      {"stopped_by_signal", stopped_by_signal},
                      {"device", device},
                      {"dtype", dtype},
                      {"transport", transport}};
  if (eval.has_value()) j["eval"] = AcceptanceJson(*eval);
  if (eval_untrained.has_value()) j["eval_untrained"] = AcceptanceJson(*eval_untrained);
  return j.dump(2);
}

absl::StatusOr<TrainSummary> RunTrainer(const TrainerOptions& o, StudentMetrics* metrics) {
  const auto t_start = Clock::now();
  std::vector<std::string> addresses = o.teachers;
  if (addresses.empty()) addresses.push_back(o.client.address);
  std::vector<std::unique_ptr<TeacherClient>> clients;
  for (const std::string& address : addresses) {
    TeacherClientOptions co = o.client;
    co.address = address;
    co.device = o.device;
    E3_ASSIGN_OR_RETURN(auto client, TeacherClient::Connect(co));
    clients.push_back(std::move(client));
  }
  const TeacherInfo& info = clients[0]->info();
  int64_t planned_batches = 0;
  for (size_t i = 0; i < clients.size(); ++i) {
    const TeacherInfo& ti = clients[i]->info();
    std::printf("student[%d/%d]: teacher %s: %s L=%ld H=%ld (TP=%d, EP=%d), aux layers [%s], draft vocab %ld, "
                "%ld samples, %ld batches/epoch x %ld\n",
                o.client.rank, o.client.world_size, addresses[i].c_str(), ti.config.architecture_name.c_str(),
                static_cast<long>(ti.config.num_hidden_layers), static_cast<long>(ti.config.hidden_size),
                ti.raw.layout().tp_size(), ti.raw.layout().ep_size(),
                absl::StrJoin(ti.aux_layer_ids, ",").c_str(), static_cast<long>(ti.draft_vocab_size),
                static_cast<long>(ti.raw.dataset_samples()), static_cast<long>(ti.batches_per_epoch),
                static_cast<long>(ti.epochs));
    planned_batches += ti.batches_per_epoch * ti.epochs;
    if (ti.config.hidden_size != info.config.hidden_size || ti.config.num_hidden_layers != info.config.num_hidden_layers ||
        ti.config.vocab_size != info.config.vocab_size || ti.aux_layer_ids != info.aux_layer_ids ||
        ti.draft_vocab_size != info.draft_vocab_size) {
      return absl::FailedPreconditionError(absl::StrCat("teachers ", addresses[0], " and ", addresses[i],
                                                        " serve different models, aux layers or draft vocabs"));
    }
  }
  E3_ASSIGN_OR_RETURN(const TttLoss ttt_loss, ParseTttLoss(o.ttt_loss));
  const bool full_target_head = NeedsFullTargetHead(ttt_loss);
  E3_ASSIGN_OR_RETURN(FrozenWeights frozen, clients[0]->FetchWeights(full_target_head));
  for (size_t i = 1; i < clients.size(); ++i) {
    E3_ASSIGN_OR_RETURN(FrozenWeights other, clients[i]->FetchWeights());
    if (other.vocab.d2t != frozen.vocab.d2t || !other.target_head.equal(frozen.target_head)) {
      return absl::FailedPreconditionError(
          absl::StrCat("teachers ", addresses[0], " and ", addresses[i],
                       " serve different draft vocabs or heads (calibrate once, or pass the same --vocab_map)"));
    }
  }

  ModelConfig target = info.config;
  if (o.intermediate_size > 0) target.intermediate_size = o.intermediate_size;
  E3_ASSIGN_OR_RETURN(Eagle3DraftConfig dcfg, DraftConfigFromTarget(target, info.draft_vocab_size, info.aux_layer_ids));
  at::Device device(at::kCPU);
  try {
    device = at::Device(o.device);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("device '", o.device, "': ", e.what_without_backtrace()));
  }
  std::string dtype_name = o.dtype.empty() ? (device.is_cuda() ? "bfloat16" : "float32") : o.dtype;
  Eagle3DraftOptions dopts;
  dopts.config = dcfg;
  dopts.seed = o.seed;
  dopts.device = device;
  dopts.keep_full_target_head = full_target_head;
  E3_ASSIGN_OR_RETURN(dopts.dtype, ParseComputeScalarType(dtype_name));
  // The frozen tensors go to the device once, in the dtypes the draft keeps
  // them in, so the working draft and the fp32 master share them.
  Eagle3FrozenTensors ft;
  try {
    ft = {frozen.embed_tokens.to(device), frozen.target_head.to(device, dopts.target_head_dtype), frozen.vocab};
    if (frozen.target_head_rest.defined()) ft.target_head_rest = frozen.target_head_rest.to(device, dopts.target_head_dtype);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("moving the frozen weights to ", o.device, ": ", e.what_without_backtrace()));
  }
  E3_ASSIGN_OR_RETURN(auto draft, CreateEagle3Draft(dopts, ft));
  // Below fp32 the optimizer updates fp32 masters; `trained` is what the
  // optimizer, checkpoints and the export see.
  std::optional<Eagle3Draft> master;
  if (dopts.dtype != at::kFloat) {
    Eagle3DraftOptions mopts = dopts;
    mopts.dtype = at::kFloat;
    mopts.keep_full_target_head = false;  // the master is never run
    E3_ASSIGN_OR_RETURN(master, CreateEagle3Draft(mopts, ft));
  }
  Eagle3DraftImpl& trained = master.has_value() ? **master : *draft;
  E3_ASSIGN_OR_RETURN(const TttKernels kernels, ParseTttKernels(o.student_kernels));
  const bool fast = kernels == TttKernels::kFast;
  TrainSummary summary;
  summary.device = device.str();
  summary.dtype = dtype_name;
  std::printf("student[%d]: draft on %s, compute %s%s, %s kernels\n", o.client.rank, device.str().c_str(),
              dtype_name.c_str(), master.has_value() ? " with fp32 master weights" : "", fast ? "fast" : "reference");

  // Data parallelism: every rank starts from rank 0's weights, and the
  // optimizer averages gradients over the ranks before each update.
  const int rank = o.client.rank, world = o.client.world_size;
  std::unique_ptr<ProcessGroup> group;
  if (world > 1) {
    ProcessGroupOptions po;
    po.master_addr = o.master_addr;
    po.master_port = o.master_port;
    po.rank = rank;
    po.world_size = world;
    po.cuda = device.is_cuda();
    E3_ASSIGN_OR_RETURN(group, ProcessGroup::Create(po));
    std::printf("student[%d]: data parallel over %d ranks (c10d %s at %s:%d)\n", rank, world,
                device.is_cuda() ? "NCCL" : "Gloo", o.master_addr.c_str(), o.master_port);
  }
  DraftOptimizerOptions adam;
  adam.beta1 = o.beta1;
  adam.beta2 = o.beta2;
  adam.weight_decay = o.weight_decay;
  adam.grad_clip = o.grad_clip;
  E3_ASSIGN_OR_RETURN(std::unique_ptr<DraftOptimizer> optimizer,
                      CreateDraftOptimizer(fast ? DraftOptimizerKind::kFused : DraftOptimizerKind::kReference, *draft,
                                           master.has_value() ? &**master : nullptr, group.get(), adam));
  auto sync_weights = [&]() -> absl::Status {
    if (group != nullptr) {
      torch::NoGradGuard no_grad;
      for (const at::Tensor& p : trained.parameters()) E3_RETURN_IF_ERROR(group->Broadcast(p.detach(), 0));
    }
    optimizer->SyncWorkingWeights();
    return absl::OkStatus();
  };

  TrainerState state;
  state.subscriber_id = o.client.subscriber_id;
  state.cursors.resize(clients.size());
  if (!o.checkpoint_dir.empty()) {
    E3_ASSIGN_OR_RETURN(auto resumed, LoadLatestCheckpoint(o.checkpoint_dir, trained, *optimizer));
    if (resumed.has_value()) {
      if (resumed->cursors.size() != clients.size()) {
        return absl::FailedPreconditionError(absl::StrCat(o.checkpoint_dir, " holds cursors for ", resumed->cursors.size(),
                                                          " teachers, but ", clients.size(), " are given"));
      }
      state = *resumed;
      summary.resumed = true;
      summary.resumed_from_step = state.step;
      std::printf("student[%d]: resumed from %s at step %ld, cursor %ld:%ld\n", o.client.rank, o.checkpoint_dir.c_str(),
                  static_cast<long>(state.step), static_cast<long>(state.cursors[0].epoch),
                  static_cast<long>(state.cursors[0].next_batch));
    }
  }

  E3_RETURN_IF_ERROR(sync_weights());
  const int64_t planned = o.max_steps > 0 ? o.max_steps : planned_batches;
  LrSchedule schedule;
  schedule.peak = o.learning_rate;
  schedule.min_ratio = o.min_lr_ratio;
  schedule.total_steps = planned;
  schedule.warmup_steps = o.warmup_steps >= 0 ? o.warmup_steps : static_cast<int64_t>(o.warmup_ratio * planned);

  E3_ASSIGN_OR_RETURN(std::unique_ptr<AcceptanceEval> acceptance,
                      AcceptanceEval::Create(clients[0].get(), o.eval, group.get(), rank, world, device));
  if (acceptance->enabled() && rank == 0) {
    const std::string when = o.eval.every > 0 ? absl::StrCat("every ", o.eval.every, " steps and at the end") : "at the end";
    std::printf("student[0]: real acceptance length on %s's eval set %s (chains %s)\n", addresses[0].c_str(),
                when.c_str(), absl::StrJoin(acceptance->chain_lengths(), ", ").c_str());
  }
  for (size_t i = 0; i < clients.size(); ++i) E3_RETURN_IF_ERROR(clients[i]->Start(state.cursors[i]));
  std::vector<bool> ended(clients.size(), false);
  size_t turn = 0;
  TttOptions ttt;
  ttt.length = o.ttt_length;
  ttt.kernels = fast ? TttKernels::kFast : TttKernels::kReference;
  E3_ASSIGN_OR_RETURN(ttt.positions, ParseTttPositions(o.ttt_positions));
  ttt.loss = ttt_loss;
  ttt.kl_scale = o.kl_scale;
  ttt.kl_decay = o.kl_decay;
  ttt.defer_metrics = true;  // read after the optimizer step: one synchronisation per step
  std::ofstream step_log;
  if (!o.step_log.empty()) {
    // Under data parallelism each rank logs its own steps to its own file.
    const std::string path = world > 1 ? absl::StrCat(o.step_log, ".rank", rank) : o.step_log;
    step_log.open(path, std::ios::app);
    if (!step_log) return absl::FailedPreconditionError(absl::StrCat("--step_log ", path, ": cannot open for append"));
  }
  const size_t window = static_cast<size_t>(std::max<int64_t>(5, std::min<int64_t>(50, planned / 10)));
  Window first(window), last(window);
  int64_t run_steps = 0, run_tokens = 0;
  std::optional<Clock::time_point> first_step_start, last_step_end;
  double run_wait = 0;
  auto last_log = Clock::now();
  int64_t tokens_at_log = 0;
  double wait_at_log = 0;

  // What each teacher has been told is committed: a teacher that saw its
  // whole shard committed may exit (--exit_when_done), so it is not asked
  // again, and a final checkpoint identical to the last one is skipped.
  // A measurement goes to the log, the step log and Prometheus.
  auto report_acceptance = [&](const AcceptanceReport& r, const char* what) {
    if (rank == 0) {
      std::printf("student[0]: step %ld acceptance%s: %s\n", static_cast<long>(state.step), what, r.Summary().c_str());
      std::fflush(stdout);
    }
    if (step_log.is_open()) {
      step_log << nlohmann::json{{"step", state.step}, {"eval", AcceptanceJson(r)}}.dump() << "\n";
      step_log.flush();
    }
    if (metrics != nullptr) {
      std::vector<double> tau;
      for (const AcceptanceCounts& c : r.counts) tau.push_back(c.tau());
      metrics->RecordAcceptance(r.chain_lengths, tau);
    }
  };

  std::vector<StreamCursor> committed = state.cursors;
  int64_t checkpointed_step = summary.resumed ? state.step : -1;
  auto checkpoint = [&]() -> absl::Status {
    if (o.checkpoint_dir.empty() || state.step == checkpointed_step) return absl::OkStatus();
    checkpointed_step = state.step;
    // Ranks step in lockstep, so rank 0's checkpoint (weights, optimizer,
    // cursors) is every rank's; the others commit once it is written.
    if (rank == 0) {
      E3_ASSIGN_OR_RETURN(summary.last_checkpoint, SaveCheckpoint(o.checkpoint_dir, state, trained, *optimizer));
    }
    if (group != nullptr) {  // a barrier (NCCL needs a tensor on the device)
      E3_RETURN_IF_ERROR(group->Broadcast(torch::zeros({1}, torch::TensorOptions().device(device)), 0));
    }
    // Only now are the batches before each cursor committed.
    for (size_t i = 0; i < clients.size(); ++i) {
      if (state.cursors[i].epoch == committed[i].epoch && state.cursors[i].next_batch == committed[i].next_batch) continue;
      E3_RETURN_IF_ERROR(clients[i]->Ack({}, state.cursors[i]).status());
      committed[i] = state.cursors[i];
    }
    return absl::OkStatus();
  };

  while (o.max_steps == 0 || state.step < o.max_steps) {
    if (o.stop != nullptr && o.stop->load()) {
      summary.stopped_by_signal = true;
      break;
    }
    // Round-robin over the teachers that still have data.
    size_t k = 0;
    while (k < clients.size() && ended[turn % clients.size()]) {
      ++turn;
      ++k;
    }
    if (k == clients.size()) break;
    const size_t ci = turn % clients.size();
    TeacherClient* client = clients[ci].get();
    const auto t0 = Clock::now();
    if (!first_step_start.has_value()) first_step_start = t0;
    double wait = 0;
    E3_ASSIGN_OR_RETURN(StudentBatch batch, client->Next(&wait));
    if (batch.end_of_data) {
      ended[ci] = true;
      continue;
    }
    ++turn;
    if (batch.num_tokens == 0 && group == nullptr) {  // this rank's share of a small global batch was empty
      state.cursors[ci] = {batch.epoch, batch.index + 1};
      E3_RETURN_IF_ERROR(client->Ack({batch.batch_id}, std::nullopt).status());
      continue;
    }
    const double lr = schedule.At(state.step);
    optimizer->BeginStep();
    TttOutput out;
    if (batch.num_tokens > 0) {
      E3_ASSIGN_OR_RETURN(out, RunTtt(*draft, batch.tensors, ttt));
    } else {
      // An empty share under data parallelism: no loss here, but the step
      // (and its all-reduce, with zero gradients) runs in lockstep.
      out.loss = torch::zeros({}, torch::TensorOptions().device(device).requires_grad(true));
    }
    try {
      out.loss.backward();
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("training step ", state.step, ": ", e.what_without_backtrace()));
    }
    E3_RETURN_IF_ERROR(optimizer->FinishStep(lr));
    try {
      // The step's one synchronisation: an asynchronous device error of the
      // step surfaces here.
      ResolveTttMetrics(&out);
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("training step ", state.step, ": ", e.what_without_backtrace()));
    }
    const double loss = out.loss_value;
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("loss is ", loss, " at step ", state.step, " (batch ", batch.batch_id, ")"));
    }
    E3_RETURN_IF_ERROR(client->Ack({batch.batch_id}, std::nullopt).status());
    state.step += 1;
    state.tokens += batch.num_tokens;
    state.cursors[ci] = {batch.epoch, batch.index + 1};
    summary.transport = TransportName(batch.transport);
    run_steps += 1;
    run_tokens += batch.num_tokens;
    last_step_end = Clock::now();
    run_wait += wait;
    if (batch.num_tokens > 0) {  // an empty data-parallel share has no loss or accuracy
      if (!first.full()) first.Add(loss, out.tau, out.acc);
      last.Add(loss, out.tau, out.acc);
    }
    const double step_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step_log.is_open() && batch.num_tokens > 0) {
      nlohmann::json line = {{"step", state.step}, {"loss", loss}, {"simulated_tau", out.tau}, {"acc", out.acc},
                             {"lr", lr}, {"tokens", batch.num_tokens}, {"seconds", step_seconds},
                             {"data_wait_seconds", wait}};
      if (!out.acceptance_rate.empty()) line["acceptance_rate"] = out.acceptance_rate;
      step_log << line.dump() << "\n";
      step_log.flush();
    }
    if (metrics != nullptr && batch.num_tokens > 0) {
      StepReport r;
      r.tokens = batch.num_tokens;
      r.step_seconds = step_seconds;
      r.data_wait_seconds = wait;
      r.loss = loss;
      r.learning_rate = lr;
      r.tau = out.tau;
      r.acc = out.acc;
      r.ploss = out.ploss;
      metrics->Record(r);
    }
    if (o.log_every > 0 && state.step % o.log_every == 0) {
      const double dt = std::chrono::duration<double>(Clock::now() - last_log).count();
      const std::string expected =
          out.acceptance_rate.empty() ? "" : absl::StrCat(" | expected acceptance ", AccString(out.acceptance_rate));
      std::printf("student[%d]: step %ld/%ld | loss %.3f | acc %s%s | simulated tau %.2f | lr %.2e | %.0f tok/s | wait %.0f%%\n",
                  o.client.rank, static_cast<long>(state.step), static_cast<long>(planned), loss,
                  AccString(out.acc).c_str(), expected.c_str(), out.tau, lr,
                  (run_tokens - tokens_at_log) / std::max(dt, 1e-9), 100.0 * (run_wait - wait_at_log) / std::max(dt, 1e-9));
      std::fflush(stdout);
      last_log = Clock::now();
      tokens_at_log = run_tokens;
      wait_at_log = run_wait;
    }
    if (o.checkpoint_every > 0 && state.step % o.checkpoint_every == 0) E3_RETURN_IF_ERROR(checkpoint());
    E3_ASSIGN_OR_RETURN(std::optional<AcceptanceReport> measured, acceptance->AtStep(state.step, trained));
    if (measured.has_value()) report_acceptance(*measured, "");
  }
  E3_RETURN_IF_ERROR(checkpoint());
  E3_ASSIGN_OR_RETURN(summary.eval, acceptance->Final(state.step, trained));
  if (summary.eval.has_value()) {
    if (acceptance->measured_at() != state.step) report_acceptance(*summary.eval, " (final)");
    E3_RETURN_IF_ERROR(acceptance->Dump(trained, *summary.eval));
    if (o.eval.untrained) {
      // The same seed rebuilds the draft as it started.
      Eagle3DraftOptions initial = dopts;
      initial.dtype = trained.options().dtype;
      initial.keep_full_target_head = false;  // only drafts, never trains
      E3_ASSIGN_OR_RETURN(Eagle3Draft untrained, CreateEagle3Draft(initial, ft));
      E3_ASSIGN_OR_RETURN(summary.eval_untrained, acceptance->Measure(*untrained));
      if (summary.eval_untrained.has_value() && rank == 0) {
        std::printf("student[0]: acceptance of the untrained draft: %s\n", summary.eval_untrained->Summary().c_str());
      }
    }
  }
  if (!o.output_dir.empty() && rank == 0) {
    DraftExportOptions exp;
    E3_ASSIGN_OR_RETURN(exp.dtype, ParseComputeScalarType(o.export_dtype));
    E3_RETURN_IF_ERROR(ExportDraft(trained, o.output_dir, exp));
    summary.export_dir = o.output_dir;
  }
  summary.steps = state.step;
  summary.tokens = run_tokens;
  summary.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (first_step_start.has_value() && last_step_end.has_value()) {
    summary.train_seconds = std::chrono::duration<double>(*last_step_end - *first_step_start).count();
  }
  summary.data_wait_seconds = run_wait;
  summary.first = first.Stats();
  summary.last = last.Stats();
  if (!o.summary_json.empty()) {
    std::ofstream(o.summary_json) << summary.ToJson() << "\n";
  }
  return summary;
}

}  // namespace e3
