#include "teacher_server/runtime/model_runtime.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/torch/process_group.h"
#include "common/torch/tensor_convert.h"
#include "teacher_server/parallel/tp_group.h"
#include "teacher_server/runtime/tp_control.h"

namespace e3 {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The sgl backend's startup GEMM tuning (layers/gemm_tuning.h) for this
// rank's shard at the token budget. A failure is logged, not fatal: the
// forward then keeps cuBLASLt's heuristic choices, which compute the same.
void TuneGemmsOrWarn(CausalLM& model, const ModelRuntimeOptions& o) {
  if (model.options().gemm != GemmPath::kCublasLtTuned || !model.options().device.is_cuda()) return;
  GemmTuningOptions t;
  t.rows = o.gemm_tuning_rows;
  t.cache_path = o.gemm_tuning_cache;
  t.log = [](const std::string& line) {
    std::printf("teacher: %s\n", line.c_str());
    std::fflush(stdout);
  };
  const auto start = std::chrono::steady_clock::now();
  auto tuned = model.TuneGemms(t);
  if (!tuned.ok()) {
    std::fprintf(stderr, "teacher: %s; keeping cuBLASLt's heuristic algorithms\n",
                 std::string(tuned.status().message()).c_str());
    return;
  }
  std::printf("teacher: %s (%.1f s)\n", tuned->Summary().c_str(), SecondsSince(start));
  std::fflush(stdout);
}

}  // namespace

std::string ResolveBackend(const std::string& backend, bool cuda) {
  if (backend != "auto") return backend;
  return cuda ? "sgl" : "hf";
}

std::string DefaultGemmTuningCachePath(const EnvLookup& env) {
  const char* xdg = env("XDG_CACHE_HOME");
  const char* home = env("HOME");
  if (xdg != nullptr && *xdg != '\0') return JoinPath(xdg, "e3/gemm_tuning.json");
  if (home != nullptr && *home != '\0') return JoinPath(home, ".cache/e3/gemm_tuning.json");
  return "";
}

absl::StatusOr<ModelOptions> MakeModelOptions(const ModelRuntimeOptions& o) {
  ModelOptions m;
  E3_ASSIGN_OR_RETURN(m.device, ParseUsableDevice(o.device, "--device"));
  if (!SetBackend(ResolveBackend(o.backend, m.device.is_cuda()), &m).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", o.backend, ": expected auto, hf or sgl"));
  }
  const std::string dtype =
      o.dtype.empty() ? (m.device.is_cuda() ? "bfloat16" : "float32") : o.dtype;
  E3_ASSIGN_OR_RETURN(m.dtype, ParseComputeScalarType(dtype));
  if (!o.gemm_tuning && m.gemm == GemmPath::kCublasLtTuned) m.gemm = GemmPath::kCublasLt;
  if (o.tp_overlap_min_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp_overlap_min_tokens=", o.tp_overlap_min_tokens, ": expected >= 0"));
  }
  if (o.graph_token_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--graph_token_step=", o.graph_token_step, ": expected >= 1"));
  }
  if (o.ep_size < 1 || (o.launch.world_size > 1 && o.launch.world_size % o.ep_size != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ep_size=", o.ep_size, ": expected a divisor of --tp_size=", o.launch.world_size));
  }
  if (o.launch.world_size == 1 && o.ep_size != 1) {
    return absl::InvalidArgumentError(
        "--ep_size needs --tp_size > 1 (experts split over its ranks)");
  }
  m.max_cuda_graphs = o.max_cuda_graphs;
  m.graph_token_step = o.graph_token_step;
  m.graph_min_host_share = o.graph_min_host_share;
  m.tp_overlap_min_tokens = o.tp_overlap_min_tokens;
  return m;
}

absl::StatusOr<std::shared_ptr<TpGroup>> JoinTensorParallelGroup(const ModelRuntimeOptions& o,
                                                                 bool cuda) {
  ProcessGroupOptions p;
  p.world_size = o.launch.world_size;
  p.rank = o.launch.rank;
  p.master_addr = o.launch.master_addr;
  p.master_port = o.launch.master_port;
  p.rendezvous_file = o.launch.rendezvous_file;
  p.cuda = cuda;
  // Ranks load their shards at different speeds (rank 0 also reads the
  // data): the first collective may wait long for the slowest.
  p.timeout = absl::Minutes(30);
  std::printf("teacher: joining tensor-parallel group as rank %d of %d (ep %d) %s\n", p.rank,
              p.world_size, o.ep_size, DescribeRendezvous(p).c_str());
  std::fflush(stdout);
  E3_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> group, ProcessGroup::Create(p));
  return std::make_shared<TpGroup>(std::move(group), o.ep_size);
}

// On a terminal the progress rewrites one line; into a log file (Slurm,
// Kubernetes, the launcher) it would pile up carriage returns, so only the
// closing line is written there. The expected count is approximate (a
// tied lm_head or an expert-parallel shard loads fewer tensors), so the
// closing line, not the counter, ends the progress.
absl::StatusOr<std::unique_ptr<CausalLM>> LoadTeacherModel(const ModelDir& dir, ModelOptions mopts,
                                                           const ModelRuntimeOptions& o) {
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  // Shared: the model keeps its options, and with them this callback.
  auto loaded = std::make_shared<int64_t>(0);
  mopts.on_progress = [tty, loaded](int64_t done, int64_t total) {
    *loaded = done;
    if (tty && done % 16 == 0) {
      std::printf("\rteacher: loading weights %ld/~%ld", static_cast<long>(done),
                  static_cast<long>(total));
      std::fflush(stdout);
    }
  };
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<CausalLM>> model = LoadCausalLM(dir, mopts);
  if (!model.ok()) {
    if (tty) std::printf("\n");
    return model.status();
  }
  std::printf("%steacher: loaded %ld weight tensors in %.1f s\n", tty ? "\r\033[K" : "",
              static_cast<long>(*loaded), SecondsSince(start));
  std::fflush(stdout);
  TuneGemmsOrWarn(**model, o);
  return model;
}

absl::Status RunFollower(const ModelDir& dir, const ModelOptions& mopts,
                         const ModelRuntimeOptions& o) {
  E3_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, LoadTeacherModel(dir, mopts, o));
  std::printf("teacher rank %d: shard loaded; following rank 0\n", mopts.tp->rank());
  std::fflush(stdout);
  return RunTpFollower(*model);
}

absl::StatusOr<ModelRuntimeOptions> ModelRuntimeOptions::From(const RunConfig& c, const EnvLookup& env) {
  ModelRuntimeOptions r;
  r.device = c.teachers.device;
  r.backend = c.teachers.backend;
  r.dtype = c.teachers.dtype;
  r.gemm_tuning = c.teachers.gemm_tuning;
  r.gemm_tuning_cache = c.teachers.gemm_tuning_cache;
  if (r.gemm_tuning_cache == "default") r.gemm_tuning_cache = DefaultGemmTuningCachePath(env);
  r.gemm_tuning_rows = c.schedule.tokens_per_batch;
  r.max_cuda_graphs = static_cast<int>(c.teachers.max_cuda_graphs);
  r.graph_min_host_share = c.teachers.graph_min_host_share;
  r.graph_token_step = c.teachers.graph_token_step;
  r.tp_overlap_min_tokens = c.teachers.tp_overlap_min_tokens;
  r.ep_size = static_cast<int>(c.teachers.ep);
  LaunchFlags launch;
  launch.world_size = std::max(1, static_cast<int>(c.teachers.tp));
  launch.rank = static_cast<int>(c.teachers.tp_rank);
  launch.rank_flag = "tp_rank";
  launch.master_addr = c.teachers.master_addr;
  launch.master_port = static_cast<int>(c.teachers.master_port);
  launch.default_master_port = 29600;
  launch.rendezvous_file = c.teachers.rendezvous_file;
  // One process is no group: torchrun's variables, if any, are another's.
  if (launch.world_size == 1) return r;
  E3_ASSIGN_OR_RETURN(r.launch, ResolveLaunchEnv(launch, env));
  return r;
}

}  // namespace e3
