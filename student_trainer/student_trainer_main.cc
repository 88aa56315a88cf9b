// student_trainer: trains an EAGLE-3 draft from a teacher's hidden states
// and exports it for SGLang and vLLM. One process per device; the
// torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK) is honoured, with
// explicit flags taking precedence.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/launch_env.h"
#include "common/metrics_server.h"
#include "common/rpc/listen_address.h"
#include "common/run_config.h"
#include "common/service_flags.h"
#include "common/status_macros.h"
#include "student_trainer/checkpoint_manager.h"
#include "student_trainer/student_metrics.h"
#include "student_trainer/trainer.h"

ABSL_FLAG(std::string, config, "",
          "run config (YAML, examples/configs/): sets the flags its keys map to; flags given explicitly on the "
          "command line override the file");
ABSL_FLAG(std::string, teacher, "127.0.0.1:50051",
          "teacher gRPC address, or several comma-separated (teachers serving data shards; round-robin)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the teachers' certificates: talk TLS to them (the system's roots verify when only "
          "--tls_cert is given)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain this student presents (mutual TLS; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name the teachers' certificates carry, when --teacher dials another (an IP, a service alias)");
ABSL_FLAG(std::string, auth_token_file, "",
          "a file whose first line is the teachers' shared token (teacher_server --auth_token_file), sent on "
          "every call");
ABSL_FLAG(int, rank, -1, "data-parallel rank (default: $RANK or 0)");
ABSL_FLAG(int, world_size, -1, "data-parallel world size (default: $WORLD_SIZE or 1)");
ABSL_FLAG(std::string, subscriber_id, "", "stable id of this student (default: rank-<rank>)");
ABSL_FLAG(int, ttt_length, static_cast<int>(e3::RunConfig().draft.ttt_length), "training-time-test steps");
ABSL_FLAG(std::string, ttt_positions, "advancing",
          "rope positions of TTT step j: advancing (t + j, as a serving engine advances each draft step) or fixed "
          "(t at every step, SpecForge v0.2)");
ABSL_FLAG(std::string, ttt_loss, "soft_ce",
          "each TTT step's loss: soft_ce (soft cross-entropy against the target distribution), lk_alpha (-log of the "
          "expected acceptance rate) or lk_lambda (soft CE blended into 1 - acceptance rate as it grows; SpecForge's "
          "LK losses); the LK losses also fetch the target head's rows outside the draft vocab");
ABSL_FLAG(double, kl_scale, 1.0, "--ttt_loss=lk_lambda: the soft CE's weight is kl_scale * exp(-kl_decay * acceptance rate)");
ABSL_FLAG(double, kl_decay, 1.0, "--ttt_loss=lk_lambda: see --kl_scale");
ABSL_FLAG(std::string, student_kernels, "fast",
          "fast: fused kernels, flash attention and a fused AdamW (ATen statements of the same math on the CPU); "
          "reference: the plain LibTorch op sequence and torch::optim::AdamW");
ABSL_FLAG(std::string, master_addr, "", "data parallelism: rank 0's address (default: $MASTER_ADDR or 127.0.0.1)");
ABSL_FLAG(int, master_port, -1, "data parallelism: rank 0's c10d store port (default: $MASTER_PORT or 29500)");
ABSL_FLAG(std::string, rendezvous_file, "",
          "data parallelism: meet through a c10d FileStore at this path (a new file per launch; every rank on this "
          "machine or a filesystem they share) instead of a TCPStore at --master_addr:--master_port; nothing "
          "listens for it");
ABSL_FLAG(std::string, device, "", "cpu or cuda:N (default: cuda:$LOCAL_RANK when LOCAL_RANK is set and CUDA is available, else cpu)");
ABSL_FLAG(std::string, dtype, "", "draft compute dtype; default bfloat16 on GPU (fp32 master weights), float32 on CPU");
ABSL_FLAG(double, lr, 1e-4, "peak learning rate (AdamW)");
ABSL_FLAG(double, min_lr_ratio, 0.5, "cosine floor as a fraction of the peak");
ABSL_FLAG(double, warmup_ratio, 0.02, "warmup steps as a fraction of the planned steps");
ABSL_FLAG(int64_t, warmup_steps, -1, "warmup steps (overrides --warmup_ratio when >= 0)");
ABSL_FLAG(double, weight_decay, 0.0, "AdamW weight decay");
ABSL_FLAG(double, adam_beta1, 0.9, "AdamW beta1");
ABSL_FLAG(double, adam_beta2, 0.999, "AdamW beta2");
ABSL_FLAG(double, grad_clip, 0.5, "max global gradient norm (0: off)");
ABSL_FLAG(int64_t, max_steps, 0, "stop after this many steps (0: when the teacher's data ends)");
ABSL_FLAG(int64_t, intermediate_size, 0, "draft MLP width (0: the target's)");
ABSL_FLAG(uint64_t, init_seed, e3::RunConfig().draft.init_seed, "seed of the draft's initial weights");
ABSL_FLAG(uint64_t, seed, 0, "deprecated: use --init_seed");
ABSL_FLAG(std::string, checkpoint_dir, "", "checkpoints (and resume) here");
ABSL_FLAG(int64_t, checkpoint_every, 100, "steps between checkpoints");
ABSL_FLAG(int, keep_checkpoints, e3::kMinKeepCheckpoints,
          "checkpoints kept in --checkpoint_dir (at least 2: the newest, and the one a resume falls back to when "
          "the newest is damaged)");
ABSL_FLAG(std::string, on_checkpoint_save_error, "stop",
          "a checkpoint that cannot be written (disk full): stop the run, or continue training (reported; the "
          "previous checkpoint stays the newest)");
ABSL_FLAG(std::string, on_checkpoint_load_error, "stop",
          "no checkpoint in --checkpoint_dir loads (a damaged newest one is always skipped for an older one): "
          "stop, or start_fresh from the initial draft");
ABSL_FLAG(std::string, output_dir, "", "export the final draft here (config.json + model.safetensors)");
ABSL_FLAG(std::string, export_dtype, "bfloat16", "dtype of the exported weights");
ABSL_FLAG(std::string, init_from, "",
          "warm start: a draft export (config.json + model.safetensors) whose weights start this run when no "
          "checkpoint in --checkpoint_dir resumes it; the optimizer state and the data stream start fresh. The "
          "teacher serves the draft's vocab map (teacher_server --init_from, or the run config's draft.init_from)");
ABSL_FLAG(std::string, best_dir, "",
          "export the draft with the best real acceptance length here whenever a measurement beats the best "
          "(--eval_every), with its step and tau in config.json (\"e3_best\")");
ABSL_FLAG(int64_t, early_stop_patience, 0,
          "stop once this many real-acceptance measurements in a row brought no better tau (0: never)");
ABSL_FLAG(std::string, tensorboard_dir, "",
          "rank 0 writes the step log's scalars (loss, acc_j, simulated and real tau, lr, throughput, data wait) "
          "here as TensorBoard event files");
ABSL_FLAG(int, log_every, 10, "steps between log lines");
ABSL_FLAG(int, metrics_port, 0, "port of /metrics (0 picks one, -1 disables)");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1", "address /metrics binds");
ABSL_FLAG(int, metrics_linger_s, 0,
          "after the run, keep serving /metrics this many seconds (or until SIGTERM), so that Prometheus "
          "scrapes the final step and acceptance length");
ABSL_FLAG(std::string, summary_json, "", "write the run summary (JSON) here");
ABSL_FLAG(std::string, step_log, "",
          "append one JSON line per training step here (step, loss, simulated_tau, acc per TTT step, lr, tokens) "
          "and one per acceptance measurement (step, eval); with several ranks, to <path>.rank<r>");
ABSL_FLAG(int64_t, eval_every, 0,
          "measure the real acceptance length on the teacher's eval set (teacher --eval_prompts) every this many "
          "steps; 0: only at the end. Without an eval set at the teacher nothing is measured");
ABSL_FLAG(int64_t, eval_chain, 7, "draft tokens per verify round (chain length K); 3 and 5 are reported too");
ABSL_FLAG(double, eval_wait_s, 600, "at the end, wait this long for the teacher to finish generating its eval set");
ABSL_FLAG(bool, eval_untrained, true, "at the end, also measure the draft as initialised, for comparison");
ABSL_FLAG(std::string, eval_dump, "",
          "write the eval set and the final acceptance here (safetensors), for tools/acceptance_crosscheck.py");
ABSL_FLAG(std::string, transports, "",
          "transports accepted (default: nccl,cuda_ipc,shm,inline on a GPU, shm,inline on the CPU)");
ABSL_FLAG(int, credit_window, static_cast<int>(e3::RunConfig().schedule.credit_window),
          "batches in flight / prefetched (the teacher caps it at its own --credit_window)");
ABSL_FLAG(int, connect_attempts, 6,
          "attempts at the first connection (with exponential backoff) before giving up on a teacher");
ABSL_FLAG(double, teacher_wait_s, 1800,
          "once training: how long a teacher may stay away (killed and restarted, drained, unreachable) before the "
          "run fails; the student resubscribes at its cursor when it is back, with a progress line every 10 s");
ABSL_FLAG(double, keepalive_ping_s, 10,
          "ping a teacher connection that has been quiet this long (HTTP/2 keepalive; at least 1)");
ABSL_FLAG(double, keepalive_timeout_s, 5,
          "a ping unanswered this long closes the connection: the teacher counts as unreachable");
ABSL_FLAG(double, initial_backoff_s, 0.5, "first retry delay; doubles each attempt");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: default)");
ABSL_FLAG(int64_t, max_receive_message_bytes, e3::TeacherClientOptions().max_receive_message_bytes,
          "largest message this student takes from a teacher (an inline batch)");
ABSL_FLAG(uint64_t, max_weights_bytes, e3::TeacherClientOptions().max_weights_bytes,
          "most bytes the frozen weights from GetWeights may take, all tensors together");

namespace e3 {
namespace {

std::atomic<bool> g_stop{false};

// Everything the flags say, read once.
absl::StatusOr<TrainerOptions> OptionsFromFlags() {
  TrainerOptions o;
  o.teachers = absl::StrSplit(absl::GetFlag(FLAGS_teacher), ',', absl::SkipWhitespace());
  if (o.teachers.empty()) return absl::InvalidArgumentError("--teacher is empty");
  o.client.address = o.teachers[0];
  LaunchFlags launch_flags;
  launch_flags.rank = absl::GetFlag(FLAGS_rank);
  launch_flags.world_size = absl::GetFlag(FLAGS_world_size) > 0 ? absl::GetFlag(FLAGS_world_size) : -1;
  launch_flags.master_addr = absl::GetFlag(FLAGS_master_addr);
  launch_flags.master_port = absl::GetFlag(FLAGS_master_port);
  launch_flags.rendezvous_file = absl::GetFlag(FLAGS_rendezvous_file);
  E3_ASSIGN_OR_RETURN(const LaunchEnv launch, ResolveLaunchEnv(launch_flags, ProcessEnv()));
  o.client.rank = launch.rank;
  o.client.world_size = launch.world_size;
  o.master_addr = launch.master_addr;
  o.master_port = launch.master_port;
  o.rendezvous_file = launch.rendezvous_file;
  o.client.subscriber_id = absl::GetFlag(FLAGS_subscriber_id).empty() ? absl::StrCat("rank-", o.client.rank)
                                                                        : absl::GetFlag(FLAGS_subscriber_id);
  E3_RETURN_IF_ERROR(CheckPortFlag(absl::GetFlag(FLAGS_metrics_port), -1, "--metrics_port"));
  o.device = absl::GetFlag(FLAGS_device);
  if (o.device.empty()) {
    o.device = launch.local_rank >= 0 && torch::cuda::is_available() ? absl::StrCat("cuda:", launch.local_rank)
                                                                      : "cpu";
  }
  if (absl::GetFlag(FLAGS_transports).empty()) {
    o.client.transports = DefaultTransports(absl::StartsWith(o.device, "cuda"));
  } else {
    auto transports = ParseTransportList(absl::GetFlag(FLAGS_transports));
    if (!transports.ok()) return absl::InvalidArgumentError(absl::StrCat("--transports: ", transports.status().message()));
    o.client.transports = *transports;
  }
  o.client.credit_window = absl::GetFlag(FLAGS_credit_window);
  o.client.auth.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.client.auth.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.client.auth.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.client.auth.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.client.auth.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.client.max_attempts = std::max(1, absl::GetFlag(FLAGS_connect_attempts));
  o.client.initial_backoff = absl::Seconds(absl::GetFlag(FLAGS_initial_backoff_s));
  if (absl::GetFlag(FLAGS_teacher_wait_s) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--teacher_wait_s is ", absl::GetFlag(FLAGS_teacher_wait_s), "; expected >= 0 seconds"));
  }
  o.client.teacher_wait = absl::Seconds(absl::GetFlag(FLAGS_teacher_wait_s));
  if (absl::GetFlag(FLAGS_keepalive_ping_s) < 1 || absl::GetFlag(FLAGS_keepalive_timeout_s) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--keepalive_ping_s is ", absl::GetFlag(FLAGS_keepalive_ping_s), " and --keepalive_timeout_s is ",
        absl::GetFlag(FLAGS_keepalive_timeout_s), "; expected >= 1 (the teachers accept pings that often) and > 0"));
  }
  o.client.keepalive.ping_every = std::chrono::milliseconds(
      static_cast<int64_t>(absl::GetFlag(FLAGS_keepalive_ping_s) * 1000));
  o.client.keepalive.ping_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(absl::GetFlag(FLAGS_keepalive_timeout_s) * 1000));
  o.client.max_receive_message_bytes = absl::GetFlag(FLAGS_max_receive_message_bytes);
  o.client.max_weights_bytes = absl::GetFlag(FLAGS_max_weights_bytes);
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  o.client.host = host;
  o.ttt_length = absl::GetFlag(FLAGS_ttt_length);
  o.student_kernels = absl::GetFlag(FLAGS_student_kernels);
  o.ttt_positions = absl::GetFlag(FLAGS_ttt_positions);
  o.ttt_loss = absl::GetFlag(FLAGS_ttt_loss);
  o.kl_scale = absl::GetFlag(FLAGS_kl_scale);
  o.kl_decay = absl::GetFlag(FLAGS_kl_decay);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  o.learning_rate = absl::GetFlag(FLAGS_lr);
  o.min_lr_ratio = absl::GetFlag(FLAGS_min_lr_ratio);
  o.warmup_ratio = absl::GetFlag(FLAGS_warmup_ratio);
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.beta1 = absl::GetFlag(FLAGS_adam_beta1);
  o.beta2 = absl::GetFlag(FLAGS_adam_beta2);
  o.grad_clip = absl::GetFlag(FLAGS_grad_clip);
  o.max_steps = absl::GetFlag(FLAGS_max_steps);
  o.intermediate_size = absl::GetFlag(FLAGS_intermediate_size);
  o.init_seed = absl::GetFlag(FLAGS_init_seed);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  if (o.keep_checkpoints < kMinKeepCheckpoints) {
    return absl::InvalidArgumentError(absl::StrCat("--keep_checkpoints: expected an integer >= ", kMinKeepCheckpoints,
                                                   " (the newest and its fallback), got ", o.keep_checkpoints));
  }
  o.on_checkpoint_save_error = absl::GetFlag(FLAGS_on_checkpoint_save_error);
  E3_RETURN_IF_ERROR(ParseOnCheckpointSaveError(o.on_checkpoint_save_error).status());
  o.on_checkpoint_load_error = absl::GetFlag(FLAGS_on_checkpoint_load_error);
  E3_RETURN_IF_ERROR(ParseOnCheckpointLoadError(o.on_checkpoint_load_error).status());
  o.output_dir = absl::GetFlag(FLAGS_output_dir);
  o.export_dtype = absl::GetFlag(FLAGS_export_dtype);
  o.init_from = absl::GetFlag(FLAGS_init_from);
  o.best_dir = absl::GetFlag(FLAGS_best_dir);
  o.early_stop_patience = absl::GetFlag(FLAGS_early_stop_patience);
  if (o.early_stop_patience < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--early_stop_patience is ", o.early_stop_patience, "; expected 0 (never) or more"));
  }
  o.tensorboard_dir = absl::GetFlag(FLAGS_tensorboard_dir);
  o.log_every = absl::GetFlag(FLAGS_log_every);
  o.summary_json = absl::GetFlag(FLAGS_summary_json);
  o.step_log = absl::GetFlag(FLAGS_step_log);
  o.eval.every = absl::GetFlag(FLAGS_eval_every);
  o.eval.chain = absl::GetFlag(FLAGS_eval_chain);
  o.eval.wait_s = absl::GetFlag(FLAGS_eval_wait_s);
  o.eval.untrained = absl::GetFlag(FLAGS_eval_untrained);
  o.eval.dump = absl::GetFlag(FLAGS_eval_dump);
  o.stop = &g_stop;
  o.client.stop = &g_stop;
  return o;
}

void PrintSummary(const TrainSummary& s, int rank) {
  auto acc = [](const std::vector<double>& a) {
    std::string out;
    for (double x : a) out += absl::StrFormat(" %.3f", x);
    return out;
  };
  // A resumed run says what this process did and where the run stands.
  const std::string resumed =
      s.resumed ? absl::StrFormat(" (steps %ld-%ld; %ld steps, %ld tokens since step 0)",
                                  static_cast<long>(s.resumed_from_step + 1), static_cast<long>(s.steps),
                                  static_cast<long>(s.steps), static_cast<long>(s.tokens))
                : "";
  std::printf("\n=== student[%d] summary: %ld steps, %ld tokens%s in %.1fs of training (%.0f tok/s), data wait "
              "%.1f%%; %.1fs in all ===\n",
              rank, static_cast<long>(s.run_steps), static_cast<long>(s.run_tokens), resumed.c_str(),
              s.train_seconds, s.train_seconds > 0 ? s.run_tokens / s.train_seconds : 0.0,
              s.train_seconds > 0 ? 100 * s.data_wait_seconds / s.train_seconds : 0.0, s.seconds);
  std::printf("  first %3ld steps: loss %.3f  simulated tau %.3f  acc_0..%zu%s\n", static_cast<long>(s.first.steps),
              s.first.loss, s.first.tau, s.first.acc.empty() ? 0 : s.first.acc.size() - 1, acc(s.first.acc).c_str());
  std::printf("  last  %3ld steps: loss %.3f  simulated tau %.3f  acc_0..%zu%s\n", static_cast<long>(s.last.steps),
              s.last.loss, s.last.tau, s.last.acc.empty() ? 0 : s.last.acc.size() - 1, acc(s.last.acc).c_str());
  if (s.eval.has_value()) {
    std::printf("  real acceptance length on the eval set (%ld prompts), trained draft: %s\n",
                static_cast<long>(s.eval->samples), s.eval->Summary().c_str());
  }
  if (s.eval_untrained.has_value()) {
    std::printf("%52s%s draft: %s\n", "", s.warm_started_from.empty() ? "untrained" : "warm-start",
                s.eval_untrained->Summary().c_str());
  }
  if (!s.best_dir.empty()) {
    std::printf("  best draft: %s (tau %.3f at step %ld)\n", s.best_dir.c_str(), s.best_tau,
                static_cast<long>(s.best_step));
  }
  if (s.stopped_early) std::printf("  stopped early: tau stopped improving (--early_stop_patience)\n");
  if (!s.export_dir.empty()) std::printf("  exported draft: %s\n", s.export_dir.c_str());
  if (!s.last_checkpoint.empty()) std::printf("  last checkpoint: %s\n", s.last_checkpoint.c_str());
  if (s.checkpoint_failures > 0) {
    std::printf("  checkpoints not written: %ld (--on_checkpoint_save_error=continue)\n",
                static_cast<long>(s.checkpoint_failures));
  }
  if (s.stopped_by_signal) std::printf("  stopped by signal after checkpointing\n");
  std::fflush(stdout);
}

int Main() {
  absl::StatusOr<SettledFlags> settled =
      SettleServiceFlags(absl::GetFlag(FLAGS_config), ServiceRole::kStudent,
                         DeprecatedFlags(ServiceRole::kStudent));
  if (!settled.ok()) {
    std::fprintf(stderr, "student_trainer: error: %s\n", std::string(settled.status().message()).c_str());
    return 2;
  }
  for (const std::string& w : settled->warnings) std::fprintf(stderr, "student_trainer: warning: %s\n", w.c_str());
  absl::StatusOr<TrainerOptions> o = OptionsFromFlags();
  if (!o.ok()) {
    std::fprintf(stderr, "student_trainer: error: %s\n", std::string(o.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) > 0) at::set_num_threads(absl::GetFlag(FLAGS_threads));
  StudentMetrics metrics(o->client.rank, o->ttt_length);
  std::unique_ptr<MetricsServer> metrics_server;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    auto ms = MetricsServer::Start(metrics.registry(), absl::GetFlag(FLAGS_metrics_host), absl::GetFlag(FLAGS_metrics_port));
    if (!ms.ok()) {
      std::fprintf(stderr, "student_trainer: error: %s\n", std::string(ms.status().message()).c_str());
      return 1;
    }
    metrics_server = std::move(ms).value();
    std::printf("student[%d]: metrics on :%d\n", o->client.rank, metrics_server->port());
  }
  auto summary = RunTrainer(*o, &metrics);
  if (!summary.ok()) {
    std::fprintf(stderr, "student_trainer: error: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  PrintSummary(*summary, o->client.rank);
  // A run's last values change after the last scrape unless the process
  // outlives a scrape interval.
  const int linger_s = absl::GetFlag(FLAGS_metrics_linger_s);
  if (metrics_server != nullptr && linger_s > 0 && !g_stop) {
    std::printf("student[%d]: serving the final metrics for %d s\n", o->client.rank, linger_s);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(linger_s);
    while (!g_stop && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return 0;
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains an EAGLE-3 draft from a teacher_server's hidden states.\n"
      "--config=run.yaml reads the run config; flags given on the command line override it.");
  absl::ParseCommandLine(argc, argv);
  // Line by line into a log file too, so a launcher or `tail -f` sees
  // progress as it happens.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  struct sigaction sa {};
  sa.sa_handler = [](int) { e3::g_stop = true; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // Past a file size limit (ulimit -f) write() then fails with EFBIG, which
  // the checkpoint reports as it would a full disk, instead of the signal
  // killing the process mid-write.
  signal(SIGXFSZ, SIG_IGN);
  return e3::Main();
}
