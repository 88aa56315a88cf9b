// The project's own sbatch job (deploy/slurm/e3-train.sbatch) on a real
// Slurm cluster: Debian's slurmctld, two slurmd and munge, started on this
// machine in a scratch directory (tools/slurm_local_cluster.sh). The job is
// heterogeneous, one teacher task in component 0 and two data-parallel
// student ranks in component 1, on the CPU with a tiny run.
//
// The job is cancelled (scancel) once the students have checkpointed, then
// submitted again with the same output directory: the students must stop
// with a checkpoint the teacher saw committed, the second job must resume
// from it and finish, the draft must have trained, its export must load
// back, and the teacher's ledger must show every sample committed exactly
// once across the two jobs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/model/safetensors.h"
#include "common/torch/tensor_convert.h"
#include "nlohmann/json.hpp"
#include "student_trainer/draft/draft_export.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "tests/e2e/subprocess.h"
#include "tests/free_port.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;

const std::string kSrc = E3_SOURCE_DIR;
constexpr int kSamples = 64;  // 16 steps of 4 samples, 2 per rank

struct CommandResult {
  int status = -1;
  std::string output;
};

// Runs `command` under bash with the cluster's SLURM_CONF; stdout and stderr.
CommandResult Sh(const std::string& cluster_dir, const std::string& command) {
  const std::string full = "bash -c 'source " + cluster_dir + "/env && " + command + "' 2>&1";
  CommandResult r;
  FILE* p = ::popen(full.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  r.status = ::pclose(p);
  return r;
}

// The cluster lives as long as this object; its daemons are stopped on the
// way out whatever happened (and by the script's watchdog if this process
// is killed).
class LocalSlurm {
 public:
  explicit LocalSlurm(const std::string& dir) : dir_(dir) {
    const std::string cmd = kSrc + "/tools/slurm_local_cluster.sh start " + dir_ + " " +
                            std::to_string(::getpid()) + " > " + dir_ + ".start.log 2>&1";
    started_ = std::system(cmd.c_str()) == 0;
  }
  ~LocalSlurm() {
    const std::string cmd = kSrc + "/tools/slurm_local_cluster.sh stop " + dir_;
    (void)std::system(cmd.c_str());
  }
  bool started() const { return started_; }
  std::string StartLog() const { return ReadFile(dir_ + ".start.log"); }
  std::string Logs() const {
    return Sh(dir_, "tail -n 30 " + dir_ + "/log/slurmctld.log " + dir_ + "/log/slurmd-e3n1.log " + dir_ +
                        "/log/slurmd-e3n2.log").output;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool started_ = false;
};

// The job's state as scontrol reports it for its first component (the
// components of a heterogeneous job end together).
std::string JobState(const std::string& cluster, const std::string& job) {
  const CommandResult r = Sh(cluster, "scontrol -o show job " + job);
  std::smatch m;
  if (std::regex_search(r.output, m, std::regex("JobState=(\\S+)"))) return m[1];
  return "UNKNOWN";
}

bool Terminal(const std::string& state) {
  return state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT" ||
         state == "NODE_FAIL" || state == "OUT_OF_MEMORY" || state == "PREEMPTED" || state == "BOOT_FAIL" ||
         state == "DEADLINE";
}

std::string WaitForEnd(const std::string& cluster, const std::string& job, std::chrono::seconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  std::string state = JobState(cluster, job);
  while (!Terminal(state) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(250ms);
    state = JobState(cluster, job);
  }
  return state;
}

struct LedgerScan {
  int64_t commits = 0;
  int64_t redeliveries = 0;
  std::map<int64_t, int> committed;  // epoch-0 sample -> times committed
};

LedgerScan Scan(const std::string& path) {
  LedgerScan s;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;  // a line being written
    if (j["event"] == "commit") {
      s.commits += 1;
      for (auto& id : j["samples"]) s.committed[id.get<int64_t>()] += 1;
    } else if (j["event"] == "deliver" && j["send"].get<int>() > 1) {
      s.redeliveries += 1;
    }
  }
  return s;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Loads an exported draft back the way a consumer would: the config gives
// the shapes, model.safetensors the weights (vocab map included).
absl::Status ReloadExport(const std::string& dir, int64_t* parameters) {
  absl::StatusOr<Eagle3DraftConfig> config = ReadDraftConfig(dir + "/config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(dir + "/model.safetensors");
  if (!file.ok()) return file.status();
  absl::StatusOr<at::Tensor> d2t = ViewToTensor(*(*file)->Get("d2t"), at::kLong);
  absl::StatusOr<at::Tensor> t2d = ViewToTensor(*(*file)->Get("t2d"), at::kBool);
  if (!d2t.ok()) return d2t.status();
  if (!t2d.ok()) return t2d.status();
  Eagle3FrozenTensors frozen;
  frozen.vocab.target_vocab_size = config->vocab_size;
  for (int64_t i = 0; i < d2t->numel(); ++i) frozen.vocab.d2t.push_back(d2t->data_ptr<int64_t>()[i]);
  for (int64_t i = 0; i < t2d->numel(); ++i) frozen.vocab.t2d.push_back(t2d->data_ptr<bool>()[i] ? 1 : 0);
  frozen.embed_tokens = at::zeros({config->vocab_size, config->target_hidden_size});
  frozen.target_lm_head = at::zeros({config->draft_vocab_size, config->target_hidden_size});
  Eagle3DraftOptions options;
  options.config = *config;
  absl::StatusOr<Eagle3Draft> draft = CreateEagle3Draft(options, frozen);
  if (!draft.ok()) return draft.status();
  if (absl::Status s = LoadDraftExport(**draft, dir); !s.ok()) return s;
  absl::StatusOr<at::Tensor> fc = ViewToTensor(*(*file)->Get("fc.weight"), at::kFloat);
  if (!fc.ok()) return fc.status();
  for (const auto& [name, tensor] : (*draft)->ExportedParameters()) {
    *parameters += tensor.numel();
    if (name == "fc.weight" && !at::equal(tensor.to(at::kFloat), *fc)) {
      return absl::InternalError("fc.weight reloaded with other values than the file holds");
    }
  }
  return absl::OkStatus();
}

TEST(SlurmJobTest, HeterogeneousJobTrainsSurvivesScancelAndResumesExactlyOnce) {
  ASSERT_EQ(::geteuid(), 0u) << "slurmd launches job steps as root here: run as root (as CI does)";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = testing::ScratchDir("slurm_job");
  LocalSlurm slurm(dir + "/cluster");
  ASSERT_TRUE(slurm.started()) << "the local Slurm cluster did not start (tools/install_deps.sh installs "
                                  "slurm-wlm and munge)\n"
                               << slurm.StartLog() << slurm.Logs();
  const double startup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const std::string out = dir + "/run";
  // Both jobs see the same settings, the tiny run and the same OUT, so the
  // second resumes from the first's checkpoints; each job gets ports free
  // when it is submitted (the first job's could be taken while it ran).
  const auto env = [&] {
    return "export E3=" + testing::BuildDir() + " MODEL=" + kSrc + "/examples/tiny-code-llama DATA=" + kSrc +
      "/examples/data/train_conversations.jsonl OUT=" + out + " DEVICE=cpu TEACHER_PORT=" +
      std::to_string(testing::FreePort()) + " TP_PORT=" + std::to_string(testing::FreePort()) +
      " MASTER_PORT=" + std::to_string(testing::FreePort()) +
      " TEACHER_METRICS_PORT=-1 STUDENT_METRICS_PORT=-1 TEACHER_DRAIN_S=20"
      " TEACHER_ARGS=\"--max_samples=" + std::to_string(kSamples) +
      " --max_seq_len=192 --tokens_per_batch=384 --draft_vocab_size=256 --threads=1 --subscriber_timeout_s=2\""
      " STUDENT_ARGS=\"--lr=2e-3 --warmup_steps=2 --checkpoint_every=2 --log_every=2 --threads=1 "
      "--credit_window=2 --step_log=" + out + "/steps.jsonl\"";
  };
  // Component 0: one teacher task; component 1: two student ranks.
  const std::string sbatch = " && sbatch --parsable --output=" + out +
                             "/job-%j.out --nodes=1 --ntasks=1 --cpus-per-task=1 --time=10 : --nodes=1 "
                             "--ntasks=2 --cpus-per-task=1 --time=10 " +
                             kSrc + "/deploy/slurm/e3-train.sbatch";
  ASSERT_EQ(Sh(slurm.dir(), "mkdir -p " + out).status, 0);
  const std::string ledger = out + "/ledger-0.jsonl";

  // Job 1: cancelled once the students have committed a checkpoint.
  CommandResult first = Sh(slurm.dir(), env() + sbatch);
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string job1 = first.output.substr(0, first.output.find_first_of("+;\n"));
  bool checkpointed = false;
  for (int i = 0; i < 1200 && !checkpointed; ++i) {
    // One commit event per batch and rank: the first checkpoint (step 2).
    checkpointed = Scan(ledger).commits >= 4;
    const std::string state = JobState(slurm.dir(), job1);
    ASSERT_FALSE(Terminal(state)) << "job " << job1 << " ended (" << state << ") before it checkpointed\n"
                                  << ReadFile(out + "/teachers.log") << ReadFile(out + "/students.log")
                                  << ReadFile(out + "/job-" + job1 + ".out") << slurm.Logs();
    if (!checkpointed) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(checkpointed) << "no checkpoint committed in 120 s\n" << ReadFile(out + "/students.log");
  const double scancel_at = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(Sh(slurm.dir(), "scancel " + job1).status, 0);
  const std::string state1 = WaitForEnd(slurm.dir(), job1, 60s);
  ASSERT_EQ(state1, "CANCELLED") << slurm.Logs();
  const std::string students1 = ReadFile(out + "/students.log");
  const std::string teachers1 = ReadFile(out + "/teachers.log");
  EXPECT_EQ(Count(students1, "stopped by signal after checkpointing"), 2) << students1;
  EXPECT_NE(teachers1.find("teacher: signal 15: draining"), std::string::npos) << teachers1;
  EXPECT_NE(teachers1.find("every draining rank committed its final checkpoint"), std::string::npos) << teachers1;
  const LedgerScan at_cancel = Scan(ledger);
  ASSERT_LT(at_cancel.committed.size(), static_cast<size_t>(kSamples)) << "the first job saw all the data";
  for (const auto& [sample, times] : at_cancel.committed) EXPECT_EQ(times, 1) << "sample " << sample;
  auto summary1 = nlohmann::json::parse(ReadFile(out + "/summary-0.json"), nullptr, false);
  ASSERT_FALSE(summary1.is_discarded()) << ReadFile(out + "/summary-0.json");
  EXPECT_TRUE(summary1["stopped_by_signal"].get<bool>());
  const int64_t steps1 = summary1["steps"].get<int64_t>();

  // Job 2: the same OUT; it resumes and runs to the end of the data.
  CommandResult second = Sh(slurm.dir(), env() + sbatch);
  ASSERT_EQ(second.status, 0) << second.output;
  const std::string job2 = second.output.substr(0, second.output.find_first_of("+;\n"));
  const std::string state2 = WaitForEnd(slurm.dir(), job2, 150s);
  const std::string students = ReadFile(out + "/students.log");
  const std::string teachers = ReadFile(out + "/teachers.log");
  ASSERT_EQ(state2, "COMPLETED") << ReadFile(out + "/job-" + job2 + ".out") << teachers << students
                                 << slurm.Logs();
  // Each rank names the checkpoint the first job's signal saved.
  const std::string resumed = absl::StrFormat("checkpoints/step-%08d at step %d, cursor", steps1, steps1);
  EXPECT_EQ(Count(students, resumed), 2) << students;

  // The draft trained: the second job continued from the first's step,
  // and each rank's step log (both jobs append to it) holds every step
  // exactly once, with the loss and acc_0 of the last steps better than
  // those of the first (means over both ranks' shares).
  auto summary2 = nlohmann::json::parse(ReadFile(out + "/summary-0.json"));
  EXPECT_TRUE(summary2["resumed"].get<bool>());
  EXPECT_EQ(summary2["resumed_from_step"].get<int64_t>(), steps1);
  const int64_t steps = summary2["steps"].get<int64_t>();
  EXPECT_GT(steps, steps1);
  std::map<int64_t, std::vector<nlohmann::json>> by_step;
  for (int rank = 0; rank < 2; ++rank) {
    std::istringstream in(ReadFile(out + "/steps.jsonl.rank" + std::to_string(rank)));
    std::string line;
    std::vector<int64_t> seen;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      seen.push_back(j["step"].get<int64_t>());
      by_step[seen.back()].push_back(j);
    }
    std::vector<int64_t> want(static_cast<size_t>(steps));
    for (int64_t i = 0; i < steps; ++i) want[static_cast<size_t>(i)] = i + 1;
    EXPECT_EQ(seen, want) << "rank " << rank << ": every step once, in order, across the two jobs";
  }
  const auto mean = [&](int64_t from, int64_t to, auto value) {
    double sum = 0;
    int n = 0;
    for (int64_t st = from; st <= to; ++st) {
      for (const nlohmann::json& j : by_step[st]) sum += value(j), ++n;
    }
    return n > 0 ? sum / n : 0.0;
  };
  const auto loss = [](const nlohmann::json& j) { return j["loss"].get<double>(); };
  const auto acc0 = [](const nlohmann::json& j) { return j["acc"][0].get<double>(); };
  const double first_loss = mean(1, 4, loss), last_loss = mean(steps - 3, steps, loss);
  const double first_acc0 = mean(1, 4, acc0), last_acc0 = mean(steps - 3, steps, acc0);
  EXPECT_LT(last_loss, first_loss);
  EXPECT_GT(last_acc0, first_acc0);

  // The export loads back.
  int64_t parameters = 0;
  const absl::Status reload = ReloadExport(out + "/draft", &parameters);
  EXPECT_TRUE(reload.ok()) << reload;

  // Exactly once across both jobs: every sample committed once, some
  // delivered twice (those the cancelled job received but never trained).
  const LedgerScan end = Scan(ledger);
  EXPECT_EQ(end.committed.size(), static_cast<size_t>(kSamples)) << "samples lost";
  for (const auto& [sample, times] : end.committed) EXPECT_EQ(times, 1) << "sample " << sample;
  EXPECT_NE(teachers.rfind("\"samples_committed_twice\":0"), std::string::npos) << teachers;
  EXPECT_NE(teachers.rfind("\"samples_never_committed\":0"), std::string::npos) << teachers;

  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("slurm job: cluster up in %.1f s; scancel at %.1f s after step %ld; resumed and finished at "
              "step %ld; loss %.3f -> %.3f, acc_0 %.3f -> %.3f; %zu samples committed once, %ld redelivered "
              "batches; export reloaded (%ld parameters); %.1f s in all\n",
              startup_s, scancel_at, static_cast<long>(steps1), static_cast<long>(steps),
              first_loss, last_loss, first_acc0, last_acc0, end.committed.size(),
              static_cast<long>(end.redeliveries), static_cast<long>(parameters), total_s);
}

}  // namespace
}  // namespace e3
