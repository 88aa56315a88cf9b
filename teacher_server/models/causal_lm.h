// The interface every teacher architecture implements, and the options
// that pick precision, device and kernels.
#ifndef E3_TEACHER_SERVER_MODELS_CAUSAL_LM_H_
#define E3_TEACHER_SERVER_MODELS_CAUSAL_LM_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_dir.h"
#include "common/torch/torch_core.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/gemm_tuning.h"
#include "teacher_server/models/forward_types.h"
#include "teacher_server/parallel/tp_group.h"

namespace e3 {

struct ModelOptions {
  at::ScalarType dtype = at::kFloat;  // compute dtype; weights convert at load
  at::Device device = at::kCPU;
  AttentionKernel attention = AttentionKernel::kSdpa;
  // The `sgl` backend's techniques (SetBackend turns them all on; each can
  // be switched off alone for an ablation):
  // - load-time fusion (SGLang's QKVParallelLinear and
  //   MergedColumnParallelLinear): q/k/v become one [q+2kv, H] matmul and
  //   gate/up one [2I, H] matmul. The same products, fewer, larger GEMMs;
  bool fuse_projections = false;
  // - custom CUDA kernels (fused_ops.h): residual add + RMSNorm, SiLU-mul,
  //   rope in place; on CPU the same op sequence as hf;
  bool fused_kernels = false;
  // - attention = kFlashVarlen (one varlen flash call per layer);
  // - the projections through cuBLASLt (gemm.h), with the algorithms that
  //   CausalLM::TuneGemms picks by the whole forward's time (kCublasLtTuned;
  //   kCublasLt keeps the heuristic's first choices),
  GemmPath gemm = GemmPath::kAten;
  // - with the residual adds in the o_proj and down_proj GEMMs' epilogue
  //   (one rounding of the sum, from fp32), so the norms read the new
  //   residual stream instead of adding to it. Only with kCublasLt and
  //   without tensor parallelism (there the partial products are
  //   all-reduced before the add); MoE layers add in the next norm.
  bool residual_in_gemm = false;
  // - the lm_head's target argmax in the lm_head GEMM's epilogue (Hopper,
  //   bf16, no TP, no logits requested): the logits never reach memory.
  //   Elsewhere the logits are computed and RowArgmax reads them.
  bool argmax_in_gemm = false;
  // - before that, the same argmax through an FP8 candidate search
  //   (layers/fp8_head_argmax.h: FP8 scores nominate 8 columns per row,
  //   rescored exactly; compute capability 8.9+, bf16, no TP, no logits
  //   requested). Costs an e4m3 copy of the head (V x H bytes).
  bool argmax_fp8 = false;
  // - the whole forward as a CUDA graph per token budget
  //   (models/forward_graphs.h; CUDA, no TP, MoE only through the grouped
  //   GEMM, fused varlen attention), where it pays: a budget whose timed
  //   eager forward (its second) spent at least graph_min_host_share of
  //   its time issuing kernels is captured at its third; at most
  //   max_cuda_graphs budgets.
  //   Ragged batches are padded to a multiple of graph_token_step tokens.
  bool cuda_graphs = false;
  int max_cuda_graphs = 8;
  int64_t graph_token_step = 128;
  double graph_min_host_share = 0.2;
  // - under TP, the batch split at a sample boundary into two micro-batches
  //   whose all-reduces run while the other computes (parallel/
  //   micro_batches.h), where each half holds at least
  //   tp_overlap_min_tokens tokens (0: never split). 4096: smaller halves
  //   gain nothing or lose, as NCCL's kernels take SMs from the GEMMs
  //   (bench/results/2026-12-07-rejected-experiments.md).
  bool tp_overlap = false;
  int64_t tp_overlap_min_tokens = 4096;
  // - MoE layers through grouped GEMMs (layers/moe.h GroupedMoe; experts
  //   stacked at load): two grouped GEMMs per layer instead of a loop of
  //   ~5 kernels per expert whose counts go to the host.
  bool grouped_experts = false;
  // Tensor (and expert) parallelism: this process is one rank of `tp` and
  // loads only its shard. Null: the whole model in this process.
  std::shared_ptr<TpGroup> tp;
  // Called after each tensor loads: (tensors done, tensors total).
  std::function<void(int64_t, int64_t)> on_progress;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  // The checks Forward runs before any computation (aux ids, sizes). A
  // tensor-parallel leader runs them before telling the other ranks to
  // start, so that a refused batch never leaves them waiting.
  virtual absl::Status CheckForward(const PackedBatch& batch, const ForwardOptions& options) const = 0;
  // Prefill-only forward. Errors (bad aux ids, c10 failures) come back as
  // a status; nothing throws out of here.
  virtual absl::StatusOr<ForwardOutput> Forward(const PackedBatch& batch, const ForwardOptions& options) = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const ModelOptions& options() const = 0;
  // Frozen tensors the student needs (DESIGN.md step 5), whole. Under
  // tensor parallelism only rank 0 has them (the others: undefined).
  virtual at::Tensor embed_tokens() const = 0;
  virtual at::Tensor lm_head() const = 0;
  // One line, for the server's startup log: what this model's forward will
  // actually use on this device and layout (each sgl technique, or why it
  // is off here: a CPU device, a GPU too old, tensor parallelism).
  virtual std::string Techniques() const = 0;
  // Picks this rank's projection algorithms for forwards of options.rows
  // tokens by timing its whole GEMM sequence (layers/gemm_tuning.h), where
  // the model runs GemmPath::kCublasLtTuned on a GPU; elsewhere the result
  // says why nothing was tuned. Outputs do not change, only speed.
  virtual absl::StatusOr<GemmTuningResult> TuneGemms(const GemmTuningOptions& options) = 0;
  // What a KV cache for generation holds per layer and token (KvCache's
  // kv_heads and head_dim): the config's kv heads and head dim, unless the
  // attention caches something else (multi-head latent attention: every
  // head's expanded key, values padded to it).
  struct KvCacheShape {
    int64_t kv_heads = 0, head_dim = 0;
  };
  virtual KvCacheShape kv_cache_shape() const {
    return {config().num_key_value_heads, config().head_dim};
  }
};

// The backend names of --backend: "hf" (the reference: transformers' op
// order, SDPA per sample, nothing fused) and "sgl" (every technique above).
// Sets those fields of *options; an unknown name is an error naming both.
absl::Status SetBackend(const std::string& backend, ModelOptions* options);

// Where a tensor-parallel forward with these options splits a batch with
// offsets `cu_seqlens` into two overlapped micro-batches (tp_overlap,
// tp_overlap_min_tokens; parallel/micro_batches.h): a sample index, 0 for
// no split.
int64_t MicroBatchSplit(const ModelOptions& options, const std::vector<int64_t>& cu_seqlens);

// Builds the architecture named in the model's config.json.
absl::StatusOr<std::unique_ptr<CausalLM>> LoadCausalLM(const ModelDir& dir, const ModelOptions& options);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_CAUSAL_LM_H_
