// student_trainer: trains an EAGLE-3 draft from a teacher's hidden states
// and exports it for SGLang and vLLM. One process per device; the
// torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK) is honoured, with
// explicit flags taking precedence.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/base/launch_env.h"
#include "common/config/command_line.h"
#include "common/metrics/metrics_server.h"
#include "student_trainer/algorithm/draft_algorithm.h"
#include "student_trainer/metrics/student_metrics.h"
#include "student_trainer/trainer.h"

namespace e3 {
namespace {

std::atomic<bool> g_stop{false};

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
  const ServiceCommandLine command_line = ReadServiceCommandLine(argc, argv, kStudent, "student_trainer", kSummary);
  if (!command_line.command_line.has_value()) return command_line.exit_code;
  const RunConfig& c = command_line.command_line->config;
  absl::StatusOr<StudentProcess> process = ResolveStudentProcess(c, ProcessEnv(), &g_stop);
  if (!process.ok()) {
    std::fprintf(stderr, "student_trainer: error: %s\n", std::string(process.status().message()).c_str());
    return 2;
  }
  const int rank = process->layout.rank();
  if (static_cast<int>(c.students.threads) > 0) at::set_num_threads(static_cast<int>(c.students.threads));
  StudentMetrics metrics(rank, static_cast<int>(DraftedPositions(c.draft)));
  std::unique_ptr<MetricsServer> metrics_server;
  if (static_cast<int>(c.students.metrics_port) >= 0) {
    auto ms = MetricsServer::Start(metrics.registry(), c.students.metrics_host, static_cast<int>(c.students.metrics_port));
    if (!ms.ok()) {
      std::fprintf(stderr, "student_trainer: error: %s\n", std::string(ms.status().message()).c_str());
      return 1;
    }
    metrics_server = std::move(ms).value();
    std::printf("student[%d]: metrics on :%d\n", rank, metrics_server->port());
  }
  auto summary = RunTrainer(c, *process, &metrics);
  if (!summary.ok()) {
    std::fprintf(stderr, "student_trainer: error: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  PrintSummary(*summary, rank);
  // A run's last values change after the last scrape unless the process
  // outlives a scrape interval.
  const int linger_s = static_cast<int>(c.students.metrics_linger_s);
  if (metrics_server != nullptr && linger_s > 0 && !g_stop) {
    std::printf("student[%d]: serving the final metrics for %d s\n", rank, linger_s);
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
