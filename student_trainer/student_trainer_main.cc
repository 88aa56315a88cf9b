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

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/launch_env.h"
#include "common/base/status_macros.h"
#include "common/config/command_line.h"
#include "common/metrics/metrics_server.h"
#include "student_trainer/checkpoint/checkpoint_manager.h"
#include "student_trainer/metrics/student_metrics.h"
#include "student_trainer/trainer.h"

namespace e3 {
namespace {

std::atomic<bool> g_stop{false};

// The trainer's options from the run config.
absl::StatusOr<TrainerOptions> OptionsFromConfig(const RunConfig& c) {
  TrainerOptions o;
  o.teachers = absl::StrSplit(c.students.teacher, ',', absl::SkipWhitespace());
  if (o.teachers.empty()) return absl::InvalidArgumentError("--teacher is empty");
  o.client.address = o.teachers[0];
  LaunchFlags launch_flags;
  launch_flags.rank = static_cast<int>(c.students.rank);
  launch_flags.world_size = c.students.world_size > 0 ? static_cast<int>(c.students.world_size) : -1;
  launch_flags.master_addr = c.students.master_addr;
  launch_flags.master_port = static_cast<int>(c.students.master_port);
  launch_flags.rendezvous_file = c.students.rendezvous_file;
  E3_ASSIGN_OR_RETURN(const LaunchEnv launch, ResolveLaunchEnv(launch_flags, ProcessEnv()));
  o.client.rank = launch.rank;
  o.client.world_size = launch.world_size;
  o.master_addr = launch.master_addr;
  o.master_port = launch.master_port;
  o.rendezvous_file = launch.rendezvous_file;
  o.client.subscriber_id = c.students.subscriber_id.empty() ? absl::StrCat("rank-", o.client.rank)
                                                                        : c.students.subscriber_id;
  o.device = c.students.device;
  if (o.device.empty()) {
    o.device = launch.local_rank >= 0 && torch::cuda::is_available() ? absl::StrCat("cuda:", launch.local_rank)
                                                                      : "cpu";
  }
  if (c.students.transports.empty()) {
    o.client.transports = DefaultTransports(absl::StartsWith(o.device, "cuda"));
  } else {
    auto transports = ParseTransportList(c.students.transports);
    if (!transports.ok()) return absl::InvalidArgumentError(absl::StrCat("--transports: ", transports.status().message()));
    o.client.transports = *transports;
  }
  o.client.credit_window = static_cast<int>(c.schedule.credit_window);
  o.client.auth.tls_ca = c.students.tls_ca;
  o.client.auth.tls_cert = c.students.tls_cert;
  o.client.auth.tls_key = c.students.tls_key;
  o.client.auth.tls_server_name = c.students.tls_server_name;
  o.client.auth.auth_token_file = c.students.auth_token_file;
  o.client.max_attempts = static_cast<int>(c.students.connect_attempts);
  o.client.initial_backoff = absl::Seconds(c.students.initial_backoff_s);
  o.client.teacher_wait = absl::Seconds(c.students.teacher_wait_s);
  o.client.keepalive.ping_every = std::chrono::milliseconds(
      static_cast<int64_t>(c.students.keepalive_ping_s * 1000));
  o.client.keepalive.ping_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(c.students.keepalive_timeout_s * 1000));
  o.client.max_receive_message_bytes = c.students.max_receive_message_bytes;
  o.client.max_weights_bytes = c.students.max_weights_bytes;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  o.client.host = host;
  o.ttt_length = static_cast<int>(c.draft.ttt_length);
  o.student_kernels = c.draft.kernels;
  o.ttt_positions = c.draft.ttt_positions;
  o.ttt_loss = c.draft.ttt_loss;
  o.kl_scale = c.draft.kl_scale;
  o.kl_decay = c.draft.kl_decay;
  o.dtype = c.draft.dtype;
  o.learning_rate = c.schedule.lr;
  o.min_lr_ratio = c.schedule.min_lr_ratio;
  o.warmup_ratio = c.schedule.warmup_ratio;
  o.warmup_steps = c.schedule.warmup_steps;
  o.weight_decay = c.schedule.weight_decay;
  o.beta1 = c.schedule.adam_beta1;
  o.beta2 = c.schedule.adam_beta2;
  o.grad_clip = c.schedule.grad_clip;
  o.max_steps = c.schedule.max_steps;
  o.intermediate_size = c.draft.intermediate_size;
  o.init_seed = c.draft.init_seed;
  o.checkpoint_dir = c.students.checkpoint_dir;
  o.checkpoint_every = c.schedule.checkpoint_every;
  o.keep_checkpoints = static_cast<int>(c.schedule.keep_checkpoints);
  o.on_checkpoint_save_error = c.schedule.on_checkpoint_save_error;
  o.on_checkpoint_load_error = c.schedule.on_checkpoint_load_error;
  o.output_dir = c.students.output_dir;
  o.export_dtype = c.draft.export_dtype;
  o.init_from = c.draft.init_from;
  o.best_dir = c.students.best_dir;
  o.early_stop_patience = c.schedule.early_stop_patience;
  o.tensorboard_dir = c.students.tensorboard_dir;
  o.log_every = static_cast<int>(c.schedule.log_every);
  o.summary_json = c.students.summary_json;
  o.step_log = c.students.step_log;
  o.eval.every = c.schedule.eval_every;
  o.eval.chain = c.schedule.eval_chain;
  o.eval.wait_s = c.schedule.eval_wait_s;
  o.eval.untrained = c.schedule.eval_untrained;
  o.eval.dump = c.students.eval_dump;
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

constexpr char kSummary[] =
    "Trains an EAGLE-3 draft from a teacher_server's hidden states.\n"
    "  student_trainer [--config=run.yaml] [--flag=value ...]: flags override the run config's keys";

int Main(int argc, char** argv) {
  absl::StatusOr<CommandLine> command_line = ReadCommandLine(argc, argv, kStudent);
  if (!command_line.ok()) {
    std::fprintf(stderr, "student_trainer: error: %s\n", std::string(command_line.status().message()).c_str());
    return 2;
  }
  if (command_line->help) {
    std::printf("%s", Usage(kStudent, kSummary).c_str());
    return 0;
  }
  for (const std::string& w : command_line->warnings) {
    std::fprintf(stderr, "student_trainer: warning: %s\n", w.c_str());
  }
  const RunConfig& c = command_line->config;
  absl::StatusOr<TrainerOptions> o = OptionsFromConfig(c);
  if (!o.ok()) {
    std::fprintf(stderr, "student_trainer: error: %s\n", std::string(o.status().message()).c_str());
    return 2;
  }
  if (static_cast<int>(c.students.threads) > 0) at::set_num_threads(static_cast<int>(c.students.threads));
  StudentMetrics metrics(o->client.rank, o->ttt_length);
  std::unique_ptr<MetricsServer> metrics_server;
  if (static_cast<int>(c.students.metrics_port) >= 0) {
    auto ms = MetricsServer::Start(metrics.registry(), c.students.metrics_host, static_cast<int>(c.students.metrics_port));
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
  const int linger_s = static_cast<int>(c.students.metrics_linger_s);
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
  return e3::Main(argc, argv);
}
