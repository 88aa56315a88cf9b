// Llama (LlamaForCausalLM) for the reference `hf` backend: the op order and
// precision of transformers' modeling_llama.py, over packed batches.
#ifndef E3_TEACHER_SERVER_MODELS_LLAMA_H_
#define E3_TEACHER_SERVER_MODELS_LLAMA_H_

#include <memory>
#include <vector>

#include "teacher_server/causal_lm.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/mlp.h"
#include "teacher_server/layers/rotary.h"

namespace e3 {

class LlamaModel : public CausalLM {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const ModelDir& dir, const ModelOptions& options);

  absl::StatusOr<ForwardOutput> Forward(const PackedBatch& batch, const ForwardOptions& options) override;
  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  at::Tensor embed_tokens() const override { return embed_tokens_; }
  at::Tensor lm_head() const override { return lm_head_; }

 private:
  struct Layer {
    at::Tensor input_layernorm;
    at::Tensor post_attention_layernorm;
    AttentionWeights attn;
    MlpWeights mlp;
  };

  LlamaModel(ModelConfig config, ModelOptions options)
      : config_(std::move(config)), options_(std::move(options)),
        rotary_(config_.rope, config_.rotary_dim(), options_.device) {}
  ForwardOutput Run(const PackedBatch& batch, const ForwardOptions& options);

  ModelConfig config_;
  ModelOptions options_;
  RotaryEmbedding rotary_;
  AttentionShape attn_shape_;
  at::Tensor embed_tokens_;
  at::Tensor norm_;
  at::Tensor lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_LLAMA_H_
