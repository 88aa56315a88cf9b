// GptOssForCausalLM (OpenAI's gpt-oss-20b/120b), following transformers
// 5.17's modeling_gpt_oss.py over packed batches: a pre-norm decoder whose
// attention has biases on q/k/v/o, a learned sink logit per head and, on
// the layers `layer_types` names, a sliding window; YaRN rope; and a
// routed-experts MLP in every layer (a biased router, softmax over the
// top-k logits, clamped SwiGLU experts with biases). Experts load from
// either checkpoint form: gate_up_proj [E, H, 2I] / down_proj [E, I, H] as
// save_pretrained writes them, or MXFP4 blocks and scales as OpenAI ships
// them, dequantized at load into the compute dtype (layers/mxfp4.h).
//
// With ModelOptions::tp set, this rank holds its ShardPlan's slices: heads
// (with their biases and sinks) column-parallel, o_proj row-parallel with
// its bias on rank 0, the experts split over ep groups and each expert's
// intermediate dimension over its group, its down_proj bias on the rank
// holding the slice that starts at 0; every partial sum is all-reduced, so
// each aux hidden state is whole on every rank.
//
// Generation runs over a KV cache (one process), through the same sink
// attention. The `sgl` backend fuses q/k/v and each expert's gate/up,
// rotates in place, runs the experts through grouped GEMMs with their
// biases and clamped activation (layers/moe.h GroupedMoe), the attention
// as one varlen flash call per layer with the window in the kernel and the
// sink applied through its log-sum-exp (sink_attention.h
// FlashSinkAttention), cuBLASLt projections, the lm_head's argmax kernels
// and CUDA graphs where the forward stays on the device. The norms stay
// ATen's: GPT-OSS multiplies by its fp32 weight before rounding, which the
// add+RMSNorm kernel does not reproduce.
#ifndef E3_TEACHER_SERVER_MODELS_GPT_OSS_LM_H_
#define E3_TEACHER_SERVER_MODELS_GPT_OSS_LM_H_

#include <memory>
#include <string>
#include <vector>

#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/moe.h"
#include "teacher_server/layers/rotary.h"
#include "teacher_server/models/causal_lm_base.h"

namespace e3 {

class WeightLoader;

class GptOssLM : public CausalLMBase {
 public:
  static absl::StatusOr<std::unique_ptr<GptOssLM>> Load(const ModelDir& dir, const ModelOptions& options);

  absl::Status CheckForward(const PackedBatch& batch, const ForwardOptions& options) const override;
  absl::StatusOr<ForwardOutput> Forward(const PackedBatch& batch, const ForwardOptions& options) override;
  absl::StatusOr<GemmTuningResult> TuneGemms(const GemmTuningOptions& options) override;

 private:
  TechniqueWords ArchitectureTechniques() const override;
  struct Layer {
    at::Tensor input_layernorm, post_attention_layernorm;  // fp32, as transformers keeps them
    bool sliding = false;
    AttentionWeights attn;
    MoeWeights moe;
  };

  GptOssLM(ModelConfig config, ModelOptions options)
      : CausalLMBase(std::move(config), std::move(options)),
        rotary_(config_.rope, config_.rotary_dim(), options_.device) {}
  absl::Status LoadWeights(const ModelDir& dir) override;
  absl::Status LoadAttention(WeightLoader& w, const std::string& prefix, AttentionWeights* a) const;
  absl::Status LoadExperts(WeightLoader& w, const std::string& prefix, MoeWeights* moe) const;
  // This rank's experts' gate_up [n, 2I, H] and down [n, H, I] in the
  // nn.Linear layout, from either checkpoint form.
  absl::Status LoadExpertMatrices(WeightLoader& w, const std::string& prefix, at::Tensor* gate_up,
                                  at::Tensor* down) const;
  ForwardOutput Run(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options);
  // Why this model's forward cannot be captured in a CUDA graph, or empty
  // when it can: CUDA, one process, the flash sink attention and every
  // layer's experts through the grouped GEMM (as DecoderLM's).
  std::string GraphsOffReason() const;

  RotaryEmbedding rotary_;
  AttentionShape full_shape_, sliding_shape_;
  MoeRouting routing_;
  at::Tensor norm_;  // fp32
  std::vector<Layer> layers_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_GPT_OSS_LM_H_
