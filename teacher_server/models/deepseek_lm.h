// The DeepSeek family: DeepseekV2ForCausalLM and DeepseekV3ForCausalLM
// (Kimi-K2 is V3). A pre-norm decoder whose attention is multi-head latent
// attention (layers/mla_attention.h) and whose MLP is DeepSeekMoE
// (layers/deepseek_moe.h) after first_k_dense_replace dense layers. The op
// order and precision are transformers 5.17's modeling_deepseek_v2/v3.py,
// over packed batches; weights may come block-scaled in FP8
// (fp8_weights.h, dequantized at load).
//
// The reference numerics only: the `sgl` backend's fusions, kernels and
// graphs are not applied here (Techniques() says so), the GEMMs are ATen's
// and attention is SDPA or eager per sample (the fused varlen kernel where
// sgl asks for it on a GPU). Generation with a KV cache is not implemented
// (MLA caches latents, not per-head keys): Forward refuses one.
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
  std::string Techniques() const override;
  absl::StatusOr<GemmTuningResult> TuneGemms(const GemmTuningOptions& options) override;
  KvCacheShape kv_cache_shape() const override;

 private:
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
  ForwardOutput Run(const PackedBatch& batch, const ForwardOptions& options);

  RotaryEmbedding rotary_;
  MlaShape mla_shape_;
  DeepseekRouting routing_;
  at::Tensor norm_;
  std::vector<Layer> layers_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_DEEPSEEK_LM_H_
