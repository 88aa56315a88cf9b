#include "teacher_server/models/llama.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "teacher_server/layers/rms_norm.h"
#include "teacher_server/weight_loader.h"

namespace e3 {
namespace {

// Rows of the lm_head product computed at once for the argmax, so the
// [T, V] logits never need to exist in full.
constexpr int64_t kArgmaxChunkRows = 1024;

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const ModelDir& dir, const ModelOptions& options) {
  const ModelConfig& c = dir.config();
  auto model = std::unique_ptr<LlamaModel>(new LlamaModel(c, options));
  model->attn_shape_ = {c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim()};
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_out = c.num_attention_heads * D, kv_out = c.num_key_value_heads * D;
  const int64_t per_layer = 9 + (c.attention_bias ? 4 : 0) + (c.mlp_bias ? 3 : 0);
  WeightLoader w(dir, options.dtype, options.device, options.on_progress,
                 per_layer * c.num_hidden_layers + 2 + (c.tie_word_embeddings ? 0 : 1));
  try {
    E3_ASSIGN_OR_RETURN(model->embed_tokens_, w.Load("model.embed_tokens.weight", {c.vocab_size, H}));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      Layer layer;
      E3_ASSIGN_OR_RETURN(layer.input_layernorm, w.Load(p + "input_layernorm.weight", {H}));
      E3_ASSIGN_OR_RETURN(layer.post_attention_layernorm, w.Load(p + "post_attention_layernorm.weight", {H}));
      E3_ASSIGN_OR_RETURN(layer.attn.q_proj, w.Load(p + "self_attn.q_proj.weight", {q_out, H}));
      E3_ASSIGN_OR_RETURN(layer.attn.k_proj, w.Load(p + "self_attn.k_proj.weight", {kv_out, H}));
      E3_ASSIGN_OR_RETURN(layer.attn.v_proj, w.Load(p + "self_attn.v_proj.weight", {kv_out, H}));
      E3_ASSIGN_OR_RETURN(layer.attn.o_proj, w.Load(p + "self_attn.o_proj.weight", {H, q_out}));
      if (c.attention_bias) {
        E3_ASSIGN_OR_RETURN(layer.attn.q_bias, w.Load(p + "self_attn.q_proj.bias", {q_out}));
        E3_ASSIGN_OR_RETURN(layer.attn.k_bias, w.Load(p + "self_attn.k_proj.bias", {kv_out}));
        E3_ASSIGN_OR_RETURN(layer.attn.v_bias, w.Load(p + "self_attn.v_proj.bias", {kv_out}));
        E3_ASSIGN_OR_RETURN(layer.attn.o_bias, w.Load(p + "self_attn.o_proj.bias", {H}));
      }
      E3_ASSIGN_OR_RETURN(layer.mlp.gate_proj, w.Load(p + "mlp.gate_proj.weight", {I, H}));
      E3_ASSIGN_OR_RETURN(layer.mlp.up_proj, w.Load(p + "mlp.up_proj.weight", {I, H}));
      E3_ASSIGN_OR_RETURN(layer.mlp.down_proj, w.Load(p + "mlp.down_proj.weight", {H, I}));
      if (c.mlp_bias) {
        E3_ASSIGN_OR_RETURN(layer.mlp.gate_bias, w.Load(p + "mlp.gate_proj.bias", {I}));
        E3_ASSIGN_OR_RETURN(layer.mlp.up_bias, w.Load(p + "mlp.up_proj.bias", {I}));
        E3_ASSIGN_OR_RETURN(layer.mlp.down_bias, w.Load(p + "mlp.down_proj.bias", {H}));
      }
      if (options.fuse_projections) {
        FuseQkv(&layer.attn);
        FuseGateUp(&layer.mlp);
      }
      model->layers_.push_back(std::move(layer));
    }
    E3_ASSIGN_OR_RETURN(model->norm_, w.Load("model.norm.weight", {H}));
    if (c.tie_word_embeddings) {
      model->lm_head_ = model->embed_tokens_;
    } else {
      E3_ASSIGN_OR_RETURN(model->lm_head_, w.Load("lm_head.weight", {c.vocab_size, H}));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(dir.path(), ": loading weights failed: ", e.what_without_backtrace()));
  }
  return model;
}

absl::StatusOr<ForwardOutput> LlamaModel::Forward(const PackedBatch& batch, const ForwardOptions& options) {
  for (int32_t id : options.aux_layer_ids) {
    if (id < 0 || id >= config_.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("aux layer id ", id, " is outside [0, ",
                                                     config_.num_hidden_layers, ") for ", config_.source));
    }
  }
  if (batch.num_tokens() == 0) return absl::InvalidArgumentError("empty batch");
  try {
    c10::InferenceMode guard;
    return Run(batch, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("llama forward failed: ", e.what_without_backtrace()));
  }
}

ForwardOutput LlamaModel::Run(const PackedBatch& batch, const ForwardOptions& options) {
  const double eps = config_.rms_norm_eps;
  at::Tensor h = at::embedding(embed_tokens_, batch.input_ids);
  auto [cos, sin] = rotary_.CosSin(batch.position_ids, h.scalar_type());

  std::vector<at::Tensor> captured(options.aux_layer_ids.size());
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    const Layer& layer = layers_[i];
    at::Tensor residual = h;
    at::Tensor x = RmsNorm(h, layer.input_layernorm, eps);
    x = SelfAttention(x, layer.attn, attn_shape_, cos, sin, batch.cu_seqlens, options_.attention);
    h = residual + x;
    residual = h;
    x = RmsNorm(h, layer.post_attention_layernorm, eps);
    h = residual + SwiGluMlp(x, layer.mlp);
    for (size_t k = 0; k < options.aux_layer_ids.size(); ++k) {
      if (options.aux_layer_ids[k] == i) captured[k] = h;
    }
  }
  ForwardOutput out;
  out.last_hidden = RmsNorm(h, norm_, eps);
  if (!captured.empty()) out.aux_hidden = torch::cat(captured, -1);
  if (options.return_logits || options.return_argmax) {
    const int64_t T = out.last_hidden.size(0);
    std::vector<at::Tensor> logits, argmax;
    for (int64_t start = 0; start < T; start += kArgmaxChunkRows) {
      const int64_t n = std::min(kArgmaxChunkRows, T - start);
      at::Tensor chunk = at::linear(out.last_hidden.narrow(0, start, n), lm_head_);
      if (options.return_argmax) argmax.push_back(chunk.argmax(-1).to(at::kInt));
      if (options.return_logits) logits.push_back(chunk);
    }
    if (options.return_argmax) out.target_argmax = torch::cat(argmax);
    if (options.return_logits) out.logits = torch::cat(logits);
  }
  return out;
}

}  // namespace e3
