// The teacher's model runtime: the options its flags give (device,
// backend, dtype, the sgl techniques' knobs, the tensor-parallel layout),
// the tensor-parallel group it joins, and the model it loads, with the sgl
// backend's GEMM tuning. Nothing here reads a flag or ends the process.
#ifndef E3_TEACHER_SERVER_RUNTIME_MODEL_RUNTIME_H_
#define E3_TEACHER_SERVER_RUNTIME_MODEL_RUNTIME_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/launch_env.h"
#include "common/config/run_config.h"
#include "common/model/model_dir.h"
#include "teacher_server/models/causal_lm.h"

namespace e3 {

struct ModelRuntimeOptions {
  std::string device = "cpu";
  std::string backend = "auto";  // auto, hf or sgl
  std::string dtype;             // empty: bfloat16 on a GPU, float32 on the CPU
  bool gemm_tuning = true;
  std::string gemm_tuning_cache;    // empty: tune at every start
  int64_t gemm_tuning_rows = 4096;  // the token budget (--tokens_per_batch)
  int max_cuda_graphs = ModelOptions().max_cuda_graphs;
  double graph_min_host_share = ModelOptions().graph_min_host_share;
  int64_t graph_token_step = ModelOptions().graph_token_step;
  int64_t tp_overlap_min_tokens = ModelOptions().tp_overlap_min_tokens;
  // Tensor (and expert) parallelism: launch.world_size ranks, launch.rank
  // this one, meeting at launch.master_addr:master_port, or through
  // launch.rendezvous_file when set.
  int ep_size = 1;
  LaunchEnv launch;

  // From the teachers section (and the schedule's token budget, which the
  // GEMM tuning times); the TP group's place from the settings, then
  // torchrun's variables in `env`.
  static absl::StatusOr<ModelRuntimeOptions> From(const RunConfig& config, const EnvLookup& env);
};

// auto resolved for the device: sgl on a GPU, where it is faster than hf
// and trains drafts to the same acc_j (within 0.05 points;
// bench/README.md, "sgl against hf"); hf on the CPU, where sgl's kernels do not
// run and its fused projections were not measured to pay.
std::string ResolveBackend(const std::string& backend, bool cuda);

// $XDG_CACHE_HOME/e3/gemm_tuning.json, else ~/.cache/e3/gemm_tuning.json,
// else empty.
std::string DefaultGemmTuningCachePath(const EnvLookup& env);

// The model options of `o`, without the tensor-parallel group. Errors name
// the flag and what it expects.
absl::StatusOr<ModelOptions> MakeModelOptions(const ModelRuntimeOptions& o);

// Joins the tensor-parallel group of `o.launch` (blocking until every rank
// is there).
absl::StatusOr<std::shared_ptr<TpGroup>> JoinTensorParallelGroup(const ModelRuntimeOptions& o,
                                                                 bool cuda);

// Loads this rank's model (its shard under tensor parallelism) with
// progress, then tunes its GEMMs where the sgl backend runs on a GPU.
absl::StatusOr<std::unique_ptr<CausalLM>> LoadTeacherModel(const ModelDir& dir, ModelOptions mopts,
                                                           const ModelRuntimeOptions& o);

// Ranks 1..N-1 of a tensor-parallel teacher: load the shard, then compute
// whatever rank 0 broadcasts until it shuts down.
absl::Status RunFollower(const ModelDir& dir, const ModelOptions& mopts,
                         const ModelRuntimeOptions& o);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_RUNTIME_MODEL_RUNTIME_H_
