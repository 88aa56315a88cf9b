// The Llama family of pre-norm decoders, for both backends:
// LlamaForCausalLM, Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM
// (per-head q/k RMSNorm), MixtralForCausalLM and Qwen3MoeForCausalLM
// (routed experts). One class, because the five differ only in which
// weights a layer has; the op order and precision follow each
// architecture's modeling_*.py in transformers, over packed batches. The
// `sgl` backend (ModelOptions' fusion, kernel and attention switches) runs
// the same layer loop with fused weights, kernels and varlen attention.
//
// With ModelOptions::tp set, this rank holds its ShardPlan's slices and
// the forward all-reduces after every row-parallel product (o_proj, the
// MLP or the experts, the vocab-parallel embedding), so the residual
// stream, and with it every aux hidden state, is whole on every rank.
#ifndef E3_TEACHER_SERVER_MODELS_DECODER_LM_H_
#define E3_TEACHER_SERVER_MODELS_DECODER_LM_H_

#include <functional>
#include <memory>
#include <vector>

#include "teacher_server/causal_lm.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/fp8_head_argmax.h"
#include "teacher_server/layers/mlp.h"
#include "teacher_server/layers/moe.h"
#include "teacher_server/layers/rotary.h"
#include "teacher_server/models/forward_graphs.h"
#include "teacher_server/parallel/shard_plan.h"

namespace e3 {

class WeightLoader;

class DecoderLM : public CausalLM {
 public:
  static absl::StatusOr<std::unique_ptr<DecoderLM>> Load(const ModelDir& dir, const ModelOptions& options);

  absl::Status CheckForward(const PackedBatch& batch, const ForwardOptions& options) const override;
  absl::StatusOr<ForwardOutput> Forward(const PackedBatch& batch, const ForwardOptions& options) override;
  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  at::Tensor embed_tokens() const override { return full_embed_tokens_; }
  at::Tensor lm_head() const override { return full_lm_head_; }
  std::string Techniques() const override;
  absl::StatusOr<GemmTuningResult> TuneGemms(const GemmTuningOptions& options) override;
  const ShardPlan& shard_plan() const { return plan_; }

 private:
  struct Layer {
    at::Tensor input_layernorm;
    at::Tensor post_attention_layernorm;
    AttentionWeights attn;
    bool is_moe = false;
    MlpWeights mlp;  // dense layers
    MoeWeights moe;  // routed-experts layers
  };

  DecoderLM(ModelConfig config, ModelOptions options)
      : config_(std::move(config)), options_(std::move(options)),
        rotary_(config_.rope, config_.rotary_dim(), options_.device) {}
  absl::Status LoadWeights(const ModelDir& dir);
  absl::Status LoadLayer(WeightLoader& w, int64_t i, Layer* layer) const;
  ForwardOutput Run(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options);
  // Run's tensor-parallel form: every partial product all-reduced, the
  // batch in two micro-batches whose reductions overlap each other's
  // compute where options_.tp_overlap splits it (parallel/micro_batches.h).
  ForwardOutput RunSharded(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options);
  // The lm_head's outputs for out->last_hidden: the target argmax and/or
  // the logits, as `options` asks.
  void Head(const ForwardOptions& options, ForwardOutput* out);
  // Calls fn with this rank's logits x lm_head_^T for x's rows, in chunks
  // of about 1 GiB, so that the full logits never exist at once.
  void ForEachLogitsChunk(const at::Tensor& x, const std::function<void(const at::Tensor& logits)>& fn) const;
  // Why this model's forward cannot be captured in a CUDA graph, or empty
  // when it can: it needs CUDA, one process (no collectives), MoE layers
  // only through the grouped GEMM (the per-expert loop and the per-group
  // fallback read the routing counts on the host), and the fused varlen
  // attention (the per-sample loop reads the host's offsets).
  std::string GraphsOffReason() const;
  // The target argmax of x [T, H] (after the final norm) without the
  // logits. One process: the FP8 candidate search, else the argmax GEMM,
  // else undefined (the caller then computes logits). Under TP: each rank's
  // best column among its vocab rows (the FP8 search, else chunked logits),
  // combined by TpGroup::VocabParallelArgmax, so that every rank issues the
  // same collectives however it found its answer.
  at::Tensor HeadArgmax(const at::Tensor& x);
  // Whether o_proj and down_proj add the residual in their GEMMs (one
  // process, cuBLASLt, residual_in_gemm).
  bool ResidualInGemm() const;
  // The projections Run or RunSharded issues through Gemm, in order (the
  // lm_head's chunked logits and MoE experts aside: the served head runs
  // the FP8 search or the argmax GEMM, the experts grouped GEMMs).
  std::vector<GemmSite> GemmSites() const;

  ModelConfig config_;
  ModelOptions options_;
  ShardPlan plan_;
  RotaryEmbedding rotary_;
  AttentionShape attn_shape_;
  MoeRouting routing_;
  at::Tensor embed_tokens_;  // this rank's vocab rows
  at::Tensor lm_head_;       // this rank's vocab rows
  // The FP8 candidate search over lm_head_ (options_.argmax_fp8, where it
  // applies; else null).
  std::unique_ptr<Fp8HeadArgmax> fp8_head_;
  // Captured forwards per token budget (options_.cuda_graphs, where
  // GraphsOffReason is empty; else null).
  std::unique_ptr<ForwardGraphs> graphs_;
  at::Tensor norm_;
  // The whole tables, for GetWeights: the local ones when unsharded; on a
  // sharded rank 0 a host copy; undefined on other sharded ranks.
  at::Tensor full_embed_tokens_, full_lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_DECODER_LM_H_
