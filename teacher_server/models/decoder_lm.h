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

#include <memory>
#include <string>
#include <vector>

#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/mlp.h"
#include "teacher_server/layers/moe.h"
#include "teacher_server/layers/rotary.h"
#include "teacher_server/models/causal_lm_base.h"

namespace e3 {

class WeightLoader;

class DecoderLM : public CausalLMBase {
 public:
  static absl::StatusOr<std::unique_ptr<DecoderLM>> Load(const ModelDir& dir, const ModelOptions& options);

  absl::Status CheckForward(const PackedBatch& batch, const ForwardOptions& options) const override;
  absl::StatusOr<ForwardOutput> Forward(const PackedBatch& batch, const ForwardOptions& options) override;
  absl::StatusOr<GemmTuningResult> TuneGemms(const GemmTuningOptions& options) override;

 private:
  TechniqueWords ArchitectureTechniques() const override;
  struct Layer {
    at::Tensor input_layernorm;
    at::Tensor post_attention_layernorm;
    AttentionWeights attn;
    bool is_moe = false;
    MlpWeights mlp;  // dense layers
    MoeWeights moe;  // routed-experts layers
  };

  DecoderLM(ModelConfig config, ModelOptions options)
      : CausalLMBase(std::move(config), std::move(options)),
        rotary_(config_.rope, config_.rotary_dim(), options_.device) {}
  absl::Status LoadWeights(const ModelDir& dir) override;
  absl::Status LoadLayer(WeightLoader& w, int64_t i, Layer* layer) const;
  ForwardOutput Run(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options);
  // Run's tensor-parallel form: every partial product all-reduced, the
  // batch in two micro-batches whose reductions overlap each other's
  // compute where options_.tp_overlap splits it (parallel/micro_batches.h).
  ForwardOutput RunSharded(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options);
  // Why this model's forward cannot be captured in a CUDA graph, or empty
  // when it can: it needs CUDA, one process (no collectives), MoE layers
  // only through the grouped GEMM (the per-expert loop and the per-group
  // fallback read the routing counts on the host), and the fused varlen
  // attention (the per-sample loop reads the host's offsets).
  std::string GraphsOffReason() const;
  // Whether o_proj and down_proj add the residual in their GEMMs (one
  // process, cuBLASLt, residual_in_gemm).
  bool ResidualInGemm() const;
  // The projections Run or RunSharded issues through Gemm, in order (the
  // lm_head's chunked logits and MoE experts aside: the served head runs
  // the FP8 search or the argmax GEMM, the experts grouped GEMMs).
  std::vector<GemmSite> GemmSites() const;

  RotaryEmbedding rotary_;
  AttentionShape attn_shape_;
  MoeRouting routing_;
  at::Tensor norm_;
  std::vector<Layer> layers_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_DECODER_LM_H_
