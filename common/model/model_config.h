// A Hugging Face model's config.json as a plain struct. The loader names
// required and optional keys and accepts both rope layouts: transformers
// 4.x's `rope_theta` + `rope_scaling`, and the `rope_parameters` that
// transformers 5 writes.
#ifndef E3_COMMON_MODEL_MODEL_CONFIG_H_
#define E3_COMMON_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace e3 {

enum class RopeType { kDefault, kLinear, kLlama3, kYarn };

const char* RopeTypeName(RopeType type);

// Fields follow transformers' modeling_rope_utils.py names.
struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;                          // linear, llama3, yarn
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn
  std::optional<double> attention_factor;       // yarn
  double beta_fast = 32.0;                      // yarn
  double beta_slow = 1.0;                       // yarn
  std::optional<double> mscale;                 // yarn (DeepSeek style)
  std::optional<double> mscale_all_dim;         // yarn
  bool truncate = true;                         // yarn
};

// The Llama family: one pre-norm decoder, differing in attention biases,
// q/k norms and whether the MLP is a routed mixture of experts. The
// DeepSeek family (V2, V3 and Kimi-K2, which is V3) adds latent attention
// and DeepSeekMoE (DeepseekConfig below); it and GPT-OSS have model files
// of their own (teacher_server/models/deepseek_lm.h, gpt_oss_lm.h).
enum class Architecture { kLlama, kQwen2, kQwen3, kMixtral, kQwen3Moe, kDeepseekV2, kDeepseekV3, kGptOss };

// Sparse MoE MLP (Mixtral, Qwen3-MoE): softmax over the router's logits in
// fp32, top-k, optionally renormalised over the chosen k.
struct MoeConfig {
  int64_t num_experts = 0;  // 0: a dense model
  int64_t top_k = 0;
  int64_t intermediate_size = 0;  // of one expert
  bool norm_topk_prob = true;     // Mixtral always; Qwen3-MoE per config
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;  // dense layers in a MoE model
};

// DeepSeek-V2/V3 (models/deepseek_lm.h). Field names follow their
// config.json; moe.{num_experts, top_k, intermediate_size, norm_topk_prob}
// hold n_routed_experts, num_experts_per_tok, moe_intermediate_size and
// norm_topk_prob.
struct DeepseekConfig {
  // Multi-head latent attention.
  int64_t q_lora_rank = 0;  // 0: a plain q_proj (V2-Lite's null)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // V3's rope_interleave (default true): the rope dims are (even, odd)
  // pairs, rotated and written out as [evens, odds]. V2 rotates the pairs
  // as complex numbers in fp32 and keeps them interleaved.
  bool rope_interleave = true;
  // qk_head_dim^-0.5, times yarn_get_mscale(factor, mscale_all_dim)^2 under
  // a non-default rope with mscale_all_dim set (transformers 5.17's
  // yarn_apply_mscale, for both V2 and V3).
  double softmax_scale = 0;
  // DeepSeekMoE.
  enum class Scoring { kSoftmax, kSigmoid };  // V2, V3
  Scoring scoring = Scoring::kSoftmax;
  // V2's topk_method: "greedy" or "group_limited_greedy" (groups ranked by
  // their best expert). V3 always limits groups, ranked by the sum of their
  // best two biased scores ("noaux_tc").
  bool group_limited = false;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  int64_t n_shared_experts = 0;  // one MLP of n * moe_intermediate_size beside the routed ones
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
};

// A checkpoint's quantization_config, where it has one. Only FP8 with
// block scales (DeepSeek-V3/R1, Kimi-K2, Qwen3-FP8) is read: weights in
// float8_e4m3fn, each with weight_scale_inv [ceil(out/b0), ceil(in/b1)].
struct QuantizationConfig {
  bool fp8_block = false;
  int64_t block_rows = 128, block_cols = 128;  // weight_block_size
};

struct ModelConfig {
  std::string source;  // path of the config.json, for messages
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as written, e.g. "LlamaForCausalLM"
  std::string model_type;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // as written in config.json
  bool qkv_bias = false;        // q/k/v projections carry a bias (Qwen2: always)
  bool o_bias = false;          // o_proj carries a bias
  bool qk_norm = false;         // per-head RMSNorm on q and k before rope (Qwen3)
  bool mlp_bias = false;
  // Sliding-window attention (0: none). Forward refuses samples longer than
  // the window instead of silently attending past it.
  int64_t sliding_window = 0;
  MoeConfig moe;
  DeepseekConfig deepseek;  // kDeepseekV2/V3 only
  QuantizationConfig quantization;
  // GPT-OSS (GptOssForCausalLM); see its modeling_gpt_oss.py.
  struct GptOss {
    // Per layer: whether it attends within sliding_window (config
    // `layer_types`: "sliding_attention" or "full_attention").
    std::vector<bool> sliding_layers;
    double swiglu_alpha = 1.702;  // the experts' clamped SwiGLU
    double swiglu_limit = 7.0;
    // quantization_config.quant_method "mxfp4": the experts ship as
    // *_blocks / *_scales (dequantized at load).
    bool mxfp4_experts = false;
  } gpt_oss;
  std::string torch_dtype;  // "bfloat16", ... (empty when absent)
  RopeConfig rope;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::string raw_json;  // the file verbatim, forwarded to students

  // The SpecForge/ModelOpt default aux layers: [1, L/2 - 1, L - 4],
  // kept below the last layer on models too shallow for that.
  std::vector<int32_t> DefaultAuxLayerIds() const;
  // Whether decoder layer i uses the routed-experts MLP (Qwen3-MoE's rule:
  // not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0;
  // DeepSeek's: i >= first_k_dense_replace and i % moe_layer_freq == 0).
  bool IsMoeLayer(int64_t i) const;
  bool IsDeepseek() const {
    return architecture == Architecture::kDeepseekV2 || architecture == Architecture::kDeepseekV3;
  }
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  }
};

// Aux layer ids count "output of decoder layer i". A draft can be served
// only on ids every engine can capture: SGLang takes id i at the input of
// layer i + 1, so the last layer's output (L - 1) never reaches it, and
// vLLM before its hidden-state capture rework had the same limit. OK when
// every id is in [0, L - 2]; otherwise InvalidArgument naming the id.
absl::Status CheckAuxLayerIds(const std::vector<int32_t>& ids, int64_t num_hidden_layers);

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& config_json_path);
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);

}  // namespace e3

#endif  // E3_COMMON_MODEL_MODEL_CONFIG_H_
