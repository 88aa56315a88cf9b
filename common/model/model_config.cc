#include "common/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

// Bounds on a config's sizes, far above any real model's: a config also
// arrives from a teacher (GetInfo), the wire carries sizes as int32, and
// token ids are int32.
constexpr int64_t kMaxDim = 1 << 20;
constexpr int64_t kMaxInt32 = 2147483647;

using nlohmann::json;

// Reads keys with a uniform error: "<file>: field \"k\": expected ..., got ...".
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

  absl::Status Error(const char* key, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": field \"", prefix_, key, "\": ", what));
  }

  absl::StatusOr<int64_t> Int(const char* key) const {
    if (!Has(key)) return Error(key, "required integer is missing");
    const json& v = obj_.at(key);
    if (!v.is_number_integer()) return Error(key, absl::StrCat("expected an integer, got ", v.dump()));
    return v.get<int64_t>();
  }
  absl::StatusOr<int64_t> Int(const char* key, int64_t fallback) const {
    if (!Has(key)) return fallback;
    return Int(key);
  }
  absl::StatusOr<int64_t> PositiveInt(const char* key, int64_t most = kMaxDim) const {
    E3_ASSIGN_OR_RETURN(int64_t v, Int(key));
    if (v <= 0 || v > most) return Error(key, absl::StrCat("expected an integer in [1, ", most, "], got ", v));
    return v;
  }
  absl::StatusOr<double> Num(const char* key) const {
    if (!Has(key)) return Error(key, "required number is missing");
    const json& v = obj_.at(key);
    if (!v.is_number()) return Error(key, absl::StrCat("expected a number, got ", v.dump()));
    return v.get<double>();
  }
  absl::StatusOr<double> Num(const char* key, double fallback) const {
    if (!Has(key)) return fallback;
    return Num(key);
  }
  absl::StatusOr<std::optional<double>> OptNum(const char* key) const {
    if (!Has(key)) return std::optional<double>();
    E3_ASSIGN_OR_RETURN(double v, Num(key));
    return std::optional<double>(v);
  }
  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    const json& v = obj_.at(key);
    if (!v.is_boolean()) return Error(key, absl::StrCat("expected true or false, got ", v.dump()));
    return v.get<bool>();
  }
  absl::StatusOr<std::string> Str(const char* key, const std::string& fallback) const {
    if (!Has(key)) return fallback;
    const json& v = obj_.at(key);
    if (!v.is_string()) return Error(key, absl::StrCat("expected a string, got ", v.dump()));
    return v.get<std::string>();
  }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

absl::StatusOr<RopeConfig> ParseRope(const json& root, const std::string& source,
                                     int64_t max_position_embeddings) {
  // transformers 5 writes everything under rope_parameters; 4.x keeps
  // rope_theta at top level and the scaling dict (or null) in rope_scaling.
  json params = json::object();
  std::string prefix;
  if (root.contains("rope_parameters") && !root.at("rope_parameters").is_object() &&
      !root.at("rope_parameters").is_null()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": field \"rope_parameters\": expected an object (rope_type, rope_theta, ...) or null, got ",
        root.at("rope_parameters").type_name()));
  }
  if (root.contains("rope_parameters") && root.at("rope_parameters").is_object()) {
    params = root.at("rope_parameters");
    prefix = "rope_parameters.";
  } else {
    if (root.contains("rope_scaling") && root.at("rope_scaling").is_object()) {
      params = root.at("rope_scaling");
      prefix = "rope_scaling.";
    } else if (root.contains("rope_scaling") && !root.at("rope_scaling").is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": field \"rope_scaling\": expected an object or null"));
    }
    if (root.contains("rope_theta") && !params.contains("rope_theta")) params["rope_theta"] = root.at("rope_theta");
  }
  if (!params.contains("partial_rotary_factor") && root.contains("partial_rotary_factor")) {
    params["partial_rotary_factor"] = root.at("partial_rotary_factor");
  }
  Fields f(params, source, prefix);
  RopeConfig rope;
  E3_ASSIGN_OR_RETURN(rope.theta, f.Num("rope_theta", 10000.0));
  E3_ASSIGN_OR_RETURN(rope.partial_rotary_factor, f.Num("partial_rotary_factor", 1.0));
  // Old configs spell the key "type".
  std::string type;
  E3_ASSIGN_OR_RETURN(type, f.Str("rope_type", ""));
  if (type.empty()) {
    E3_ASSIGN_OR_RETURN(type, f.Str("type", "default"));
  }
  if (type == "default") {
    rope.type = RopeType::kDefault;
  } else if (type == "linear") {
    rope.type = RopeType::kLinear;
    E3_ASSIGN_OR_RETURN(rope.factor, f.Num("factor"));
  } else if (type == "llama3") {
    rope.type = RopeType::kLlama3;
    E3_ASSIGN_OR_RETURN(rope.factor, f.Num("factor"));
    E3_ASSIGN_OR_RETURN(rope.low_freq_factor, f.Num("low_freq_factor"));
    E3_ASSIGN_OR_RETURN(rope.high_freq_factor, f.Num("high_freq_factor"));
    E3_ASSIGN_OR_RETURN(rope.original_max_position_embeddings, f.Int("original_max_position_embeddings"));
    if (rope.high_freq_factor <= rope.low_freq_factor) {
      return f.Error("high_freq_factor", "must exceed low_freq_factor");
    }
  } else if (type == "yarn") {
    rope.type = RopeType::kYarn;
    E3_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                        f.Int("original_max_position_embeddings", max_position_embeddings));
    if (f.Has("factor")) {
      E3_ASSIGN_OR_RETURN(rope.factor, f.Num("factor"));
    } else {
      rope.factor = static_cast<double>(max_position_embeddings) /
                    static_cast<double>(rope.original_max_position_embeddings);
    }
    E3_ASSIGN_OR_RETURN(rope.attention_factor, f.OptNum("attention_factor"));
    E3_ASSIGN_OR_RETURN(rope.beta_fast, f.Num("beta_fast", 32.0));
    E3_ASSIGN_OR_RETURN(rope.beta_slow, f.Num("beta_slow", 1.0));
    E3_ASSIGN_OR_RETURN(rope.mscale, f.OptNum("mscale"));
    E3_ASSIGN_OR_RETURN(rope.mscale_all_dim, f.OptNum("mscale_all_dim"));
    E3_ASSIGN_OR_RETURN(rope.truncate, f.Bool("truncate", true));
  } else {
    return f.Error("rope_type", absl::StrCat("unsupported rope type \"", type,
                                             "\"; supported: default, linear, llama3, yarn"));
  }
  if (rope.factor <= 0) return f.Error("factor", "must be positive");
  return rope;
}

absl::Status ParseSlidingWindow(const Fields& f, ModelConfig* c) {
  // Mistral-style configs apply `sliding_window` whenever it is set; Qwen2
  // and Qwen3 only with use_sliding_window (and only on some layers; this
  // treats every layer as windowed, the stricter reading).
  bool windowed = f.Has("sliding_window");
  if (c->architecture == Architecture::kQwen2 || c->architecture == Architecture::kQwen3 ||
      c->architecture == Architecture::kQwen3Moe) {
    E3_ASSIGN_OR_RETURN(bool use, f.Bool("use_sliding_window", false));
    windowed = windowed && use;
  }
  if (!windowed) return absl::OkStatus();
  E3_ASSIGN_OR_RETURN(c->sliding_window, f.PositiveInt("sliding_window"));
  return absl::OkStatus();
}

absl::Status ParseMoe(const Fields& f, const json& root, ModelConfig* c) {
  MoeConfig& m = c->moe;
  if (c->architecture == Architecture::kMixtral) {
    E3_ASSIGN_OR_RETURN(m.num_experts, f.PositiveInt("num_local_experts"));
    E3_ASSIGN_OR_RETURN(m.top_k, f.PositiveInt("num_experts_per_tok"));
    m.intermediate_size = c->intermediate_size;
    m.norm_topk_prob = true;
  } else if (c->architecture == Architecture::kQwen3Moe) {
    // The Hub's configs say num_experts; transformers 5 writes num_local_experts.
    const char* experts_key = f.Has("num_experts") ? "num_experts" : "num_local_experts";
    E3_ASSIGN_OR_RETURN(m.num_experts, f.PositiveInt(experts_key));
    E3_ASSIGN_OR_RETURN(m.top_k, f.PositiveInt("num_experts_per_tok"));
    E3_ASSIGN_OR_RETURN(m.intermediate_size, f.PositiveInt("moe_intermediate_size"));
    E3_ASSIGN_OR_RETURN(m.norm_topk_prob, f.Bool("norm_topk_prob", false));
    E3_ASSIGN_OR_RETURN(m.decoder_sparse_step, f.Int("decoder_sparse_step", 1));
    if (m.decoder_sparse_step <= 0) return f.Error("decoder_sparse_step", "expected a positive integer");
    if (f.Has("mlp_only_layers")) {
      const json& v = root.at("mlp_only_layers");
      if (!v.is_array()) return f.Error("mlp_only_layers", "expected a list of layer indices");
      for (const auto& x : v) {
        if (!x.is_number_integer()) return f.Error("mlp_only_layers", "expected integers");
        m.mlp_only_layers.push_back(x.get<int64_t>());
      }
    }
  } else if (c->architecture == Architecture::kGptOss) {
    // Every layer routed; each expert's width is intermediate_size.
    E3_ASSIGN_OR_RETURN(m.num_experts, f.PositiveInt("num_local_experts"));
    E3_ASSIGN_OR_RETURN(m.top_k, f.PositiveInt("num_experts_per_tok"));
    m.intermediate_size = c->intermediate_size;
  } else {
    return absl::OkStatus();
  }
  if (m.top_k > m.num_experts) {
    return f.Error("num_experts_per_tok",
                   absl::StrCat("top-k ", m.top_k, " exceeds the ", m.num_experts, " experts"));
  }
  return absl::OkStatus();
}

// transformers' yarn_get_mscale.
double YarnGetMscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// The multi-head latent attention fields and the softmax scale.
absl::Status ParseMla(const Fields& f, ModelConfig* c) {
  DeepseekConfig& d = c->deepseek;
  if (f.Has("q_lora_rank")) {
    E3_ASSIGN_OR_RETURN(d.q_lora_rank, f.PositiveInt("q_lora_rank"));
  }
  E3_ASSIGN_OR_RETURN(d.kv_lora_rank, f.PositiveInt("kv_lora_rank"));
  E3_ASSIGN_OR_RETURN(d.qk_nope_head_dim, f.PositiveInt("qk_nope_head_dim"));
  E3_ASSIGN_OR_RETURN(d.qk_rope_head_dim, f.PositiveInt("qk_rope_head_dim"));
  E3_ASSIGN_OR_RETURN(d.v_head_dim, f.PositiveInt("v_head_dim"));
  if (d.qk_rope_head_dim % 2 != 0) return f.Error("qk_rope_head_dim", "must be even for rotary embeddings");
  if (c->architecture == Architecture::kDeepseekV3) {
    E3_ASSIGN_OR_RETURN(d.rope_interleave, f.Bool("rope_interleave", true));
  }
  // MLA gives every query head its own key and value from the shared
  // latent; num_key_value_heads (128 in V3's config) plays no part.
  c->num_key_value_heads = c->num_attention_heads;
  // The rope covers the qk_rope_head_dim part of each head (HF sets
  // head_dim to it for these configs).
  c->head_dim = d.qk_rope_head_dim;
  return absl::OkStatus();
}

// After the rope is parsed: transformers 5.17's yarn_apply_mscale.
void SetMlaSoftmaxScale(ModelConfig* c) {
  DeepseekConfig& d = c->deepseek;
  d.softmax_scale = 1.0 / std::sqrt(static_cast<double>(d.qk_nope_head_dim + d.qk_rope_head_dim));
  const std::optional<double>& all_dim = c->rope.mscale_all_dim;
  if (c->rope.type != RopeType::kDefault && all_dim.has_value() && *all_dim != 0) {
    const double m = YarnGetMscale(c->rope.factor, *all_dim);
    d.softmax_scale *= m * m;
  }
}

// DeepSeekMoE: routed experts in groups, shared experts, dense first layers.
absl::Status ParseDeepseekMoe(const Fields& f, ModelConfig* c) {
  DeepseekConfig& d = c->deepseek;
  MoeConfig& m = c->moe;
  E3_ASSIGN_OR_RETURN(m.num_experts, f.PositiveInt("n_routed_experts"));
  E3_ASSIGN_OR_RETURN(m.top_k, f.PositiveInt("num_experts_per_tok"));
  E3_ASSIGN_OR_RETURN(m.intermediate_size, f.PositiveInt("moe_intermediate_size"));
  E3_ASSIGN_OR_RETURN(m.norm_topk_prob, f.Bool("norm_topk_prob", false));
  if (c->architecture == Architecture::kDeepseekV3) {
    d.scoring = DeepseekConfig::Scoring::kSigmoid;
    d.group_limited = true;
  } else {
    std::string method;
    E3_ASSIGN_OR_RETURN(method, f.Str("topk_method", "greedy"));
    if (method != "greedy" && method != "group_limited_greedy") {
      return f.Error("topk_method", absl::StrCat("\"", method, "\" is unsupported; expected \"greedy\" or "
                                                 "\"group_limited_greedy\""));
    }
    d.group_limited = method == "group_limited_greedy";
  }
  E3_ASSIGN_OR_RETURN(d.n_group, f.Int("n_group", 1));
  E3_ASSIGN_OR_RETURN(d.topk_group, f.Int("topk_group", 1));
  if (d.n_group <= 0 || m.num_experts % d.n_group != 0) {
    return f.Error("n_group", absl::StrCat("expected a positive divisor of n_routed_experts (", m.num_experts,
                                           "), got ", d.n_group));
  }
  if (d.group_limited && (d.topk_group <= 0 || d.topk_group > d.n_group)) {
    return f.Error("topk_group", absl::StrCat("expected an integer in [1, n_group = ", d.n_group, "], got ",
                                              d.topk_group));
  }
  const int64_t reachable = d.group_limited ? d.topk_group * (m.num_experts / d.n_group) : m.num_experts;
  if (m.top_k > reachable) {
    return f.Error("num_experts_per_tok", absl::StrCat("top-k ", m.top_k, " exceeds the ", reachable,
                                                       " experts its topk_group groups hold"));
  }
  E3_ASSIGN_OR_RETURN(d.routed_scaling_factor, f.Num("routed_scaling_factor", 1.0));
  E3_ASSIGN_OR_RETURN(d.n_shared_experts, f.Int("n_shared_experts", 0));
  E3_ASSIGN_OR_RETURN(d.first_k_dense_replace, f.Int("first_k_dense_replace", 0));
  E3_ASSIGN_OR_RETURN(d.moe_layer_freq, f.Int("moe_layer_freq", 1));
  if (d.n_shared_experts < 0) return f.Error("n_shared_experts", "expected a non-negative integer");
  if (d.first_k_dense_replace < 0) return f.Error("first_k_dense_replace", "expected a non-negative integer");
  if (d.moe_layer_freq <= 0) return f.Error("moe_layer_freq", "expected a positive integer");
  return absl::OkStatus();
}

// quantization_config: FP8 with block scales, or absent.
absl::Status ParseQuantization(const json& root, const std::string& source, QuantizationConfig* q) {
  if (!root.contains("quantization_config") || root.at("quantization_config").is_null()) return absl::OkStatus();
  const json& obj = root.at("quantization_config");
  Fields f(obj, source, "quantization_config.");
  if (!obj.is_object()) return Fields(root, source, "").Error("quantization_config", "expected an object");
  std::string method;
  E3_ASSIGN_OR_RETURN(method, f.Str("quant_method", ""));
  if (method != "fp8" || !f.Has("weight_block_size")) {
    return f.Error("quant_method", absl::StrCat("\"", method, "\" is unsupported; expected \"fp8\" with "
                                                "weight_block_size (block-scaled float8_e4m3fn weights)"));
  }
  const json& block = obj.at("weight_block_size");
  if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() || !block[1].is_number_integer() ||
      block[0].get<int64_t>() <= 0 || block[1].get<int64_t>() <= 0) {
    return f.Error("weight_block_size", absl::StrCat("expected two positive integers, got ", block.dump()));
  }
  q->fp8_block = true;
  q->block_rows = block[0].get<int64_t>();
  q->block_cols = block[1].get<int64_t>();
  return absl::OkStatus();
}

// GPT-OSS's layer kinds, SwiGLU constants and expert quantization, with
// GptOssConfig's defaults (transformers 5.17 configuration_gpt_oss.py):
// without layer_types, even layers slide and odd ones attend fully.
absl::Status ParseGptOss(const Fields& f, const json& root, ModelConfig* c) {
  ModelConfig::GptOss& g = c->gpt_oss;
  g.sliding_layers.resize(static_cast<size_t>(c->num_hidden_layers));
  if (f.Has("layer_types")) {
    const json& v = root.at("layer_types");
    if (!v.is_array() || static_cast<int64_t>(v.size()) != c->num_hidden_layers) {
      return f.Error("layer_types", absl::StrCat("expected a list of ", c->num_hidden_layers, " layer types"));
    }
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string t = v[i].is_string() ? v[i].get<std::string>() : "";
      if (t != "sliding_attention" && t != "full_attention") {
        return f.Error("layer_types", absl::StrCat("entry ", i, ": expected \"sliding_attention\" or "
                                                   "\"full_attention\", got ", v[i].dump()));
      }
      g.sliding_layers[i] = t == "sliding_attention";
    }
  } else {
    for (size_t i = 0; i < g.sliding_layers.size(); ++i) g.sliding_layers[i] = i % 2 == 0;
  }
  E3_ASSIGN_OR_RETURN(g.swiglu_alpha, f.Num("swiglu_alpha", 1.702));
  E3_ASSIGN_OR_RETURN(g.swiglu_limit, f.Num("swiglu_limit", 7.0));
  if (g.swiglu_limit <= 0) return f.Error("swiglu_limit", "expected a positive number");
  if (!f.Has("quantization_config")) return absl::OkStatus();
  const json& q = root.at("quantization_config");
  if (!q.is_object()) return f.Error("quantization_config", "expected an object");
  Fields qf(q, c->source, "quantization_config.");
  E3_ASSIGN_OR_RETURN(std::string method, qf.Str("quant_method", ""));
  if (method != "mxfp4") {
    return qf.Error("quant_method", absl::StrCat("\"", method, "\" is unsupported; expected \"mxfp4\""));
  }
  g.mxfp4_experts = true;
  return absl::OkStatus();
}

}  // namespace

const char* RopeTypeName(RopeType type) {
  switch (type) {
    case RopeType::kDefault: return "default";
    case RopeType::kLinear: return "linear";
    case RopeType::kLlama3: return "llama3";
    case RopeType::kYarn: return "yarn";
  }
  return "?";
}

bool ModelConfig::IsMoeLayer(int64_t i) const {
  if (moe.num_experts == 0) return false;
  if (IsDeepseek()) {
    // DeepSeek's own rule; transformers 5.17 reads first_k_dense_replace
    // alone, which agrees for every released config (moe_layer_freq 1).
    return i >= deepseek.first_k_dense_replace && i % deepseek.moe_layer_freq == 0;
  }
  if (std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), i) != moe.mlp_only_layers.end()) {
    return false;
  }
  return (i + 1) % moe.decoder_sparse_step == 0;
}

std::vector<int32_t> ModelConfig::DefaultAuxLayerIds() const {
  const int32_t L = static_cast<int32_t>(num_hidden_layers);
  return {std::min(1, std::max(0, L - 2)), std::max(0, L / 2 - 1), std::max(0, L - 4)};
}

absl::Status CheckAuxLayerIds(const std::vector<int32_t>& ids, int64_t num_hidden_layers) {
  const int64_t L = num_hidden_layers;
  for (int32_t id : ids) {
    if (id < 0 || id >= L) {
      return absl::InvalidArgumentError(absl::StrCat("aux layer id ", id, " is outside [0, ", L, ")"));
    }
    if (id == L - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "aux layer id ", id, " is the last decoder layer's output (L = ", L,
          "): SGLang captures id i at the input of layer i + 1, which the last layer does not have, so a draft "
          "trained on it would be served on other states; choose ids in [0, ", L - 2, "]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  Fields f(root, source, "");
  ModelConfig c;
  c.source = source;
  c.raw_json = json_text;
  if (!root.contains("architectures") || !root.at("architectures").is_array() ||
      root.at("architectures").empty() || !root.at("architectures")[0].is_string()) {
    return f.Error("architectures", "expected a non-empty list of strings");
  }
  c.architecture_name = root.at("architectures")[0].get<std::string>();
  static const std::pair<const char*, Architecture> kSupported[] = {
      {"LlamaForCausalLM", Architecture::kLlama},     {"Qwen2ForCausalLM", Architecture::kQwen2},
      {"Qwen3ForCausalLM", Architecture::kQwen3},     {"MixtralForCausalLM", Architecture::kMixtral},
      {"Qwen3MoeForCausalLM", Architecture::kQwen3Moe},
      {"DeepseekV2ForCausalLM", Architecture::kDeepseekV2}, {"DeepseekV3ForCausalLM", Architecture::kDeepseekV3},
      {"GptOssForCausalLM", Architecture::kGptOss}};
  bool known = false;
  for (const auto& [name, arch] : kSupported) {
    if (c.architecture_name == name) {
      c.architecture = arch;
      known = true;
    }
  }
  if (!known) {
    std::vector<std::string> names;
    for (const auto& entry : kSupported) names.push_back(entry.first);
    return f.Error("architectures", absl::StrCat("unknown architecture \"", c.architecture_name,
                                                 "\"; supported: ", absl::StrJoin(names, ", ")));
  }
  E3_ASSIGN_OR_RETURN(c.model_type, f.Str("model_type", ""));
  E3_ASSIGN_OR_RETURN(c.hidden_size, f.PositiveInt("hidden_size"));
  E3_ASSIGN_OR_RETURN(c.intermediate_size, f.PositiveInt("intermediate_size"));
  E3_ASSIGN_OR_RETURN(c.num_hidden_layers, f.PositiveInt("num_hidden_layers"));
  E3_ASSIGN_OR_RETURN(c.num_attention_heads, f.PositiveInt("num_attention_heads"));
  E3_ASSIGN_OR_RETURN(c.num_key_value_heads, f.Int("num_key_value_heads", c.num_attention_heads));
  // (MLA ignores it: ParseMla.)
  if (!c.IsDeepseek() && (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0)) {
    return f.Error("num_key_value_heads",
                   absl::StrCat("must divide num_attention_heads (", c.num_attention_heads, "), got ",
                                c.num_key_value_heads));
  }
  if (c.IsDeepseek()) {
    E3_RETURN_IF_ERROR(ParseMla(f, &c));  // head_dim is the rope part of a head
  } else if (f.Has("head_dim")) {
    E3_ASSIGN_OR_RETURN(c.head_dim, f.PositiveInt("head_dim"));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return f.Error("hidden_size", "is not divisible by num_attention_heads and head_dim is absent");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return f.Error("head_dim", "must be even for rotary embeddings");
  E3_ASSIGN_OR_RETURN(c.vocab_size, f.PositiveInt("vocab_size", kMaxInt32));
  c.max_position_embeddings = 2048;
  if (f.Has("max_position_embeddings")) {
    E3_ASSIGN_OR_RETURN(c.max_position_embeddings, f.PositiveInt("max_position_embeddings", kMaxInt32));
  }
  E3_ASSIGN_OR_RETURN(c.rms_norm_eps, f.Num("rms_norm_eps", 1e-6));
  E3_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  E3_ASSIGN_OR_RETURN(c.attention_bias, f.Bool("attention_bias", false));
  E3_ASSIGN_OR_RETURN(c.mlp_bias, f.Bool("mlp_bias", false));
  // Per transformers' modeling files: Qwen2 hard-codes a bias on q/k/v and
  // none on o_proj; Llama and Qwen3 follow attention_bias for all four.
  c.qkv_bias = c.architecture == Architecture::kQwen2 || c.attention_bias;
  c.o_bias = c.architecture != Architecture::kQwen2 && c.attention_bias;
  c.qk_norm = c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe;
  E3_RETURN_IF_ERROR(ParseSlidingWindow(f, &c));
  E3_RETURN_IF_ERROR(ParseMoe(f, root, &c));
  if (c.IsDeepseek()) E3_RETURN_IF_ERROR(ParseDeepseekMoe(f, &c));
  // GPT-OSS reads its own quantization_config (MXFP4 experts); the others
  // may have block-scaled FP8 weights.
  if (c.architecture == Architecture::kGptOss) {
    E3_RETURN_IF_ERROR(ParseGptOss(f, root, &c));
  } else {
    E3_RETURN_IF_ERROR(ParseQuantization(root, source, &c.quantization));
  }
  std::string act;
  E3_ASSIGN_OR_RETURN(act, f.Str("hidden_act", "silu"));
  if (act != "silu") return f.Error("hidden_act", absl::StrCat("\"", act, "\" is unsupported; expected \"silu\""));
  // transformers 5 writes "dtype"; 4.x wrote "torch_dtype".
  E3_ASSIGN_OR_RETURN(c.torch_dtype, f.Str("dtype", ""));
  if (c.torch_dtype.empty()) {
    E3_ASSIGN_OR_RETURN(c.torch_dtype, f.Str("torch_dtype", ""));
  }
  E3_ASSIGN_OR_RETURN(c.rope, ParseRope(root, source, c.max_position_embeddings));
  if (c.IsDeepseek()) SetMlaSoftmaxScale(&c);
  if (f.Has("bos_token_id")) {
    E3_ASSIGN_OR_RETURN(c.bos_token_id, f.Int("bos_token_id"));
  }
  if (f.Has("eos_token_id")) {
    const json& e = root.at("eos_token_id");
    if (e.is_number_integer()) {
      c.eos_token_ids.push_back(e.get<int64_t>());
    } else if (e.is_array()) {
      for (const auto& x : e) {
        if (!x.is_number_integer()) return f.Error("eos_token_id", "expected integers");
        c.eos_token_ids.push_back(x.get<int64_t>());
      }
    } else {
      return f.Error("eos_token_id", "expected an integer or a list of integers");
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open model config"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfig(ss.str(), path);
}

}  // namespace e3
