// The DeepSeek family: DeepseekV2ForCausalLM and DeepseekV3ForCausalLM
// (Kimi-K2 is V3). A pre-norm decoder whose attention is multi-head latent
// attention (layers/mla_attention.h) and whose MLP is DeepSeekMoE
// (layers/deepseek_moe.h) after first_k_dense_replace dense layers. The op
// order and precision are transformers 5.17's modeling_deepseek_v2/v3.py,
// over packed batches; weights may come block-scaled in FP8
// (fp8_weights.h, dequantized at load).
//
// Under the `hf` backend the reference numerics: SDPA or eager attention
// per sample, ATen GEMMs, the routed experts by a loop. Under `sgl`: gate
// and up fused (dense MLPs, shared and routed experts), the routed experts
// through grouped GEMMs fed by DeepSeekMoE's own routing (layers/moe.h
// GroupedExpertsSum), the residual add fused into the next RMSNorm and the
// SiLU-mul kernel, one varlen flash call per batch (v padded to the qk
// head dim), cuBLASLt projections, the lm_head's argmax kernels and CUDA
// graphs where the forward stays on the device (Techniques() says what
// runs). Generation runs over a KV cache of every head's expanded key and
// its value padded to the key's head dim (kv_cache_shape()).
//
// With ModelOptions::tp set, a rank holds its ShardPlan's slices (heads of
// q_b/kv_b/o_proj, experts or their slices, a slice of the shared experts
// and of the dense MLPs, vocab rows) and the forward all-reduces each
// sublayer's partial output, so every rank holds the whole residual stream.
#ifndef E3_TEACHER_SERVER_MODELS_DEEPSEEK_LM_H_
#define E3_TEACHER_SERVER_MODELS_DEEPSEEK_LM_H_

#include <memory>
#include <string>
#include <vector>

#include "teacher_server/layers/deepseek_moe.h"
#include "teacher_server/layers/mla_attention.h"
#include "teacher_server/layers/mlp.h"
#include "teacher_server/layers/rotary.h"
#include "teacher_server/models/causal_lm_base.h"

namespace e3 {

class WeightLoader;

class DeepseekLM : public CausalLMBase {
 public:
  static absl::StatusOr<std::unique_ptr<DeepseekLM>> Load(const ModelDir& dir, const ModelOptions& options);

  absl::Status CheckForward(const PackedBatch& batch, const ForwardOptions& options) const override;
  absl::StatusOr<ForwardOutput> Forward(const PackedBatch& batch, const ForwardOptions& options) override;
  absl::StatusOr<GemmTuningResult> TuneGemms(const GemmTuningOptions& options) override;
  KvCacheShape kv_cache_shape() const override;

 private:
  TechniqueWords ArchitectureTechniques() const override;
  struct Layer {
    at::Tensor input_layernorm, post_attention_layernorm;
    MlaWeights attn;
    bool is_moe = false;
    MlpWeights mlp;          // dense layers
    DeepseekMoeWeights moe;  // DeepSeekMoE layers
  };

  DeepseekLM(ModelConfig config, ModelOptions options);
  absl::Status LoadWeights(const ModelDir& dir) override;
  absl::Status LoadAttention(WeightLoader& w, const std::string& prefix, MlaWeights* a) const;
  absl::Status LoadMoe(WeightLoader& w, WeightLoader& fp32, const std::string& prefix, DeepseekMoeWeights* m) const;
  ForwardOutput Run(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options);
  // Why this model's forward cannot be captured in a CUDA graph, or empty
  // when it can: CUDA, one process, the fused varlen attention and every
  // MoE layer's experts through the grouped GEMM (as DecoderLM's).
  std::string GraphsOffReason() const;
  // The head dim of q and k (the no-rope and rope parts).
  int64_t QkHeadDim() const { return mla_shape_.qk_nope_head_dim + mla_shape_.qk_rope_head_dim; }

  RotaryEmbedding rotary_;
  MlaShape mla_shape_;
  DeepseekRouting routing_;
  at::Tensor norm_;
  std::vector<Layer> layers_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_DEEPSEEK_LM_H_
