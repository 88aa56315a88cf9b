// A Hugging Face model's config.json as a plain struct. The loader names
// required and optional keys and accepts both rope layouts: transformers
// 4.x's `rope_theta` + `rope_scaling`, and the `rope_parameters` that
// transformers 5 writes.
#ifndef E3_COMMON_MODEL_CONFIG_H_
#define E3_COMMON_MODEL_CONFIG_H_

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

enum class Architecture { kLlama };

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
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string torch_dtype;  // "bfloat16", ... (empty when absent)
  RopeConfig rope;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::string raw_json;  // the file verbatim, forwarded to students

  // The SpecForge/ModelOpt default aux layers: [1, L/2 - 1, L - 4].
  std::vector<int32_t> DefaultAuxLayerIds() const;
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  }
};

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& config_json_path);
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);

}  // namespace e3

#endif  // E3_COMMON_MODEL_CONFIG_H_
