// The student's training run, in the shape of torchtitan's Trainer: its
// components are built from one options struct, each deciding its own
// timing, and the loop reads as Train() -> TrainOneBatch() -> TrainStep():
//   teacher_pool.h        connect, agree, round-robin, cursors
//   draft_builder.h       the draft, fp32 master weights, the optimizer
//   data_parallel.h       the c10d group, the initial broadcast
//   train_step.h          forward, backward, optimizer step
//   checkpoint_manager.h  resume, periodic saves, commits at the teachers
//   metrics_processor.h   windows, step log, Prometheus, the console line
//   acceptance_eval.h     the real acceptance length
//   best_draft.h          the best-tau export, early stopping
//   draft_export.h        the SGLang/vLLM export at the end
#ifndef E3_STUDENT_TRAINER_TRAINER_H_
#define E3_STUDENT_TRAINER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "student_trainer/eval/acceptance_eval.h"
#include "student_trainer/feed/teacher_client.h"
#include "student_trainer/metrics/metrics_processor.h"

namespace e3 {

struct TrainerOptions {
  TeacherClientOptions client;  // client.address is used when `teachers` is empty
  // Several teachers, each serving a shard of the data (teacher_server
  // --num_data_shards/--data_shard): batches are taken round-robin.
  std::vector<std::string> teachers;
  int ttt_length = 7;
  // "fast" (the fused step and optimizer, fast_step.h and fused_adamw.h) or
  // "reference" (the plain LibTorch op sequence and torch::optim::AdamW).
  std::string student_kernels = "fast";
  // "advancing" (TTT step j at positions t + j, as at inference) or
  // "fixed" (position t at every step, SpecForge v0.2).
  std::string ttt_positions = "advancing";
  // Each TTT step's loss: "soft_ce", or the LK losses "lk_alpha" /
  // "lk_lambda" (ttt_step.h), which also fetch the target head's other rows.
  std::string ttt_loss = "soft_ce";
  double kl_scale = 1.0, kl_decay = 1.0;  // lk_lambda's weight of the soft CE
  std::string device = "cpu";  // cpu or cuda:N
  // Data parallelism (client.world_size > 1): a c10d process group meets
  // at master_addr:master_port (rank 0 listens), or through
  // rendezvous_file when set (nothing listens); gradients are averaged
  // over ranks every step, and only rank 0 writes checkpoints and the export.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string rendezvous_file;
  // Compute dtype of the draft; empty: bfloat16 on GPU, float32 on CPU.
  // Below float32, AdamW updates fp32 master weights (master_weights.h).
  std::string dtype;
  double learning_rate = 1e-4;  // SpecForge's default
  double min_lr_ratio = 0.5;  // best of 0, 0.1, 0.5 on the real tau (bench/README.md)
  double warmup_ratio = 0.02;   // of the planned steps
  int64_t warmup_steps = -1;    // >= 0 overrides warmup_ratio
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999;  // 0.999 beat 0.95 on the real tau (bench/README.md)
  double grad_clip = 0.5;       // max global grad norm; 0 disables
  int64_t max_steps = 0;        // 0: until the teacher's data ends
  std::string checkpoint_dir;   // empty: no checkpoints (and no resume)
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 2;     // >= 2: the newest and its fallback
  // A checkpoint that cannot be written: "stop" or "continue" training.
  std::string on_checkpoint_save_error = "stop";
  // No checkpoint in checkpoint_dir loads: "stop" or "start_fresh".
  std::string on_checkpoint_load_error = "stop";
  std::string output_dir;       // final export; empty: none
  std::string export_dtype = "bfloat16";
  // Warm start: a draft export whose weights (and, at the teacher, vocab
  // map) start this run when no checkpoint resumes it; the optimizer state
  // and the data stream start fresh.
  std::string init_from;
  // Export the draft with the best real tau here at each measurement that
  // beats the last best (best_draft.h); empty: none.
  std::string best_dir;
  // Stop once this many real-tau measurements in a row brought no better
  // tau; 0: never.
  int64_t early_stop_patience = 0;
  // TensorBoard event files of rank 0's step scalars; empty: none.
  std::string tensorboard_dir;
  int log_every = 10;
  uint64_t init_seed = 0;  // the draft's initialisation
  int64_t intermediate_size = 0;  // 0: the target's
  std::string summary_json;       // write the run summary here
  // Append one JSON line per step here (this rank's loss, tau, acc_j, lr,
  // tokens): the full training curve, for plots and backend comparisons.
  // With more than one rank each writes `<step_log>.rank<r>`.
  std::string step_log;
  // The real acceptance length on the teacher's eval set (acceptance_eval.h);
  // measured where the first teacher has one.
  AcceptanceEvalOptions eval;
  const std::atomic<bool>* stop = nullptr;  // set by SIGTERM: checkpoint and return
};

struct TrainSummary {
  int64_t steps = 0;       // since step 0, across resumes
  int64_t tokens = 0;      // since step 0, across resumes
  int64_t run_steps = 0;   // by this process
  int64_t run_tokens = 0;  // by this process
  double seconds = 0;        // wall time of the run, connecting and fetching weights included
  double train_seconds = 0;  // first step's start to the last step's end (the rates use this)
  double data_wait_seconds = 0;
  WindowStats first, last;  // averages over the first and last windows
  std::string export_dir;
  std::string last_checkpoint;
  int64_t checkpoint_failures = 0;  // not written (--on_checkpoint_save_error=continue)
  bool resumed = false;
  int64_t resumed_from_step = 0;
  std::string warm_started_from;  // the init_from export, when no checkpoint resumed the run
  bool stopped_by_signal = false;
  // Stopped because tau stopped improving (early_stop_patience).
  bool stopped_early = false;
  // The best real tau measured and where its draft went (best_dir).
  double best_tau = 0;
  int64_t best_step = -1;
  std::string best_dir;
  std::string device;     // where the draft trained
  std::string dtype;      // its compute dtype
  std::string transport;  // how the last batch arrived
  // The real acceptance length at the end, of the trained draft and of the
  // draft as initialised (when the teacher has an eval set).
  std::optional<AcceptanceReport> eval, eval_untrained;
  std::string ToJson() const;
};

// Connects, builds the draft, resumes, trains until max_steps, the end of
// the data or *stop, then checkpoints, measures and exports. `metrics` may
// be null.
absl::StatusOr<TrainSummary> RunTrainer(const TrainerOptions& options, StudentMetrics* metrics);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_TRAINER_H_
