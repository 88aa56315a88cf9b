#include "teacher_server/models/deepseek_lm.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/torch/gemm.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/rms_norm.h"
#include "teacher_server/models/aux_capture.h"
#include "teacher_server/models/weight_loader.h"

namespace e3 {
namespace {

MlaRope RopeLayout(const ModelConfig& c) {
  if (c.architecture == Architecture::kDeepseekV2) return MlaRope::kComplexPairs;
  return c.deepseek.rope_interleave ? MlaRope::kInterleaved : MlaRope::kHalves;
}

// The slice `r` of a SwiGLU MLP's intermediate dimension I under `prefix`
// (gate_proj/up_proj rows, down_proj columns).
absl::Status LoadSwiGlu(WeightLoader& w, const std::string& prefix, int64_t I, int64_t H, ShardRange r,
                        MlpWeights* m) {
  E3_ASSIGN_OR_RETURN(m->gate_proj, w.LoadSlice(prefix + "gate_proj.weight", {I, H}, 0, r.begin, r.size));
  E3_ASSIGN_OR_RETURN(m->up_proj, w.LoadSlice(prefix + "up_proj.weight", {I, H}, 0, r.begin, r.size));
  E3_ASSIGN_OR_RETURN(m->down_proj, w.LoadSlice(prefix + "down_proj.weight", {H, I}, 1, r.begin, r.size));
  return absl::OkStatus();
}

// Tensors a layer loads, for the progress callback's total.
int64_t TensorsPerLayer(const ModelConfig& c, const ShardPlan& plan, bool moe) {
  const DeepseekConfig& d = c.deepseek;
  int64_t n = 2 + (d.q_lora_rank > 0 ? 3 : 1) + 4 + (c.attention_bias ? (d.q_lora_rank > 0 ? 3 : 2) : 0);
  if (!moe) return n + 3;
  return n + 1 + (c.architecture == Architecture::kDeepseekV3 ? 1 : 0) + 3 * plan.experts.size +
         (d.n_shared_experts > 0 ? 3 : 0);
}

}  // namespace

DeepseekLM::DeepseekLM(ModelConfig config, ModelOptions options)
    : CausalLMBase(std::move(config), std::move(options)),
      rotary_(config_.rope, config_.deepseek.qk_rope_head_dim, options_.device),
      routing_(DeepseekRouting::FromConfig(config_)) {}

absl::StatusOr<std::unique_ptr<DeepseekLM>> DeepseekLM::Load(const ModelDir& dir, const ModelOptions& options) {
  const ModelConfig& c = dir.config();
  if (c.mlp_bias) {
    return absl::InvalidArgumentError(absl::StrCat(c.source, ": field \"mlp_bias\": true is unsupported for ",
                                                   c.architecture_name, "; expected false"));
  }
  auto model = std::unique_ptr<DeepseekLM>(new DeepseekLM(c, options));
  E3_RETURN_IF_ERROR(model->MakePlan());
  const DeepseekConfig& d = c.deepseek;
  model->mla_shape_ = {model->plan_.q_heads.size, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim,
                       d.kv_lora_rank, d.softmax_scale, RopeLayout(c)};
  E3_RETURN_IF_ERROR(model->LoadCheckpoint(dir));
  return model;
}

absl::Status DeepseekLM::LoadWeights(const ModelDir& dir) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  int64_t total = 3;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) total += TensorsPerLayer(c, plan_, c.IsMoeLayer(i));
  WeightLoader w(dir, options_.dtype, options_.device, options_.on_progress, total);
  // V3's e_score_correction_bias stays fp32, as transformers keeps it
  // (_keep_in_fp32_modules_strict): in bf16 its small differences between
  // experts would round away and change the routing.
  WeightLoader fp32(dir, at::kFloat, options_.device);
  E3_RETURN_IF_ERROR(vocab_.LoadEmbedding(w, c, plan_));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer layer;
    E3_ASSIGN_OR_RETURN(layer.input_layernorm, w.Load(p + "input_layernorm.weight", {H}));
    E3_ASSIGN_OR_RETURN(layer.post_attention_layernorm, w.Load(p + "post_attention_layernorm.weight", {H}));
    E3_RETURN_IF_ERROR(LoadAttention(w, p + "self_attn.", &layer.attn));
    layer.is_moe = c.IsMoeLayer(i);
    if (layer.is_moe) {
      E3_RETURN_IF_ERROR(LoadMoe(w, fp32, p + "mlp.", &layer.moe));
    } else {
      E3_RETURN_IF_ERROR(LoadSwiGlu(w, p + "mlp.", c.intermediate_size, H, plan_.intermediate, &layer.mlp));
      if (options_.fuse_projections) FuseGateUp(&layer.mlp);
    }
    layers_.push_back(std::move(layer));
  }
  E3_ASSIGN_OR_RETURN(norm_, w.Load("model.norm.weight", {H}));
  E3_RETURN_IF_ERROR(vocab_.LoadHead(w, c, plan_));
  MakeHead(options_.gemm, options_.fused_kernels);
  MakeGraphs(GraphsOffReason());
  return vocab_.LoadWhole(dir, c, plan_, options_.dtype);
}

absl::Status DeepseekLM::LoadAttention(WeightLoader& w, const std::string& p, MlaWeights* a) const {
  const ModelConfig& c = config_;
  const DeepseekConfig& d = c.deepseek;
  const int64_t H = c.hidden_size, heads = c.num_attention_heads;
  const int64_t qk = d.qk_nope_head_dim + d.qk_rope_head_dim, kv = d.qk_nope_head_dim + d.v_head_dim;
  const int64_t h0 = plan_.q_heads.begin, hn = plan_.q_heads.size;
  // Per-head projections: this rank's heads' rows (columns of o_proj).
  if (d.q_lora_rank > 0) {
    const int64_t r = d.q_lora_rank;
    E3_ASSIGN_OR_RETURN(a->q_a_proj, w.Load(p + "q_a_proj.weight", {r, H}));
    E3_ASSIGN_OR_RETURN(a->q_a_layernorm, w.Load(p + "q_a_layernorm.weight", {r}));
    E3_ASSIGN_OR_RETURN(a->q_b_proj, w.LoadSlice(p + "q_b_proj.weight", {heads * qk, r}, 0, h0 * qk, hn * qk));
    if (c.attention_bias) {
      E3_ASSIGN_OR_RETURN(a->q_a_bias, w.Load(p + "q_a_proj.bias", {r}));
    }
  } else {
    E3_ASSIGN_OR_RETURN(a->q_proj, w.LoadSlice(p + "q_proj.weight", {heads * qk, H}, 0, h0 * qk, hn * qk));
  }
  const int64_t latent = d.kv_lora_rank + d.qk_rope_head_dim;
  E3_ASSIGN_OR_RETURN(a->kv_a_proj_with_mqa, w.Load(p + "kv_a_proj_with_mqa.weight", {latent, H}));
  E3_ASSIGN_OR_RETURN(a->kv_a_layernorm, w.Load(p + "kv_a_layernorm.weight", {d.kv_lora_rank}));
  E3_ASSIGN_OR_RETURN(a->kv_b_proj,
                      w.LoadSlice(p + "kv_b_proj.weight", {heads * kv, d.kv_lora_rank}, 0, h0 * kv, hn * kv));
  E3_ASSIGN_OR_RETURN(a->o_proj, w.LoadSlice(p + "o_proj.weight", {H, heads * d.v_head_dim}, 1, h0 * d.v_head_dim,
                                             hn * d.v_head_dim));
  if (c.attention_bias) {
    E3_ASSIGN_OR_RETURN(a->kv_a_bias, w.Load(p + "kv_a_proj_with_mqa.bias", {latent}));
    if (plan_.adds_reduced_bias()) {
      E3_ASSIGN_OR_RETURN(a->o_bias, w.Load(p + "o_proj.bias", {H}));
    }
  }
  return absl::OkStatus();
}

absl::Status DeepseekLM::LoadMoe(WeightLoader& w, WeightLoader& fp32, const std::string& p,
                                 DeepseekMoeWeights* m) const {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, E = c.moe.num_experts, I = c.moe.intermediate_size;
  E3_ASSIGN_OR_RETURN(m->routed.router, w.Load(p + "gate.weight", {E, H}));
  if (c.architecture == Architecture::kDeepseekV3) {
    E3_ASSIGN_OR_RETURN(m->score_bias, fp32.Load(p + "gate.e_score_correction_bias", {E}));
  }
  m->routed.first_expert = plan_.experts.begin;
  for (int64_t e = plan_.experts.begin; e < plan_.experts.end(); ++e) {
    MlpWeights expert;
    E3_RETURN_IF_ERROR(
        LoadSwiGlu(w, absl::StrCat(p, "experts.", e, "."), I, H, plan_.expert_intermediate, &expert));
    if (options_.fuse_projections) FuseGateUp(&expert);
    m->routed.experts.push_back(std::move(expert));
  }
  if (options_.grouped_experts && ExpertsStackable(m->routed)) StackExperts(&m->routed);
  if (c.deepseek.n_shared_experts > 0) {
    E3_RETURN_IF_ERROR(LoadSwiGlu(w, p + "shared_experts.", I * c.deepseek.n_shared_experts, H,
                                  plan_.shared_expert_intermediate, &m->shared));
    if (options_.fuse_projections) FuseGateUp(&m->shared);
  }
  return absl::OkStatus();
}

absl::Status DeepseekLM::CheckForward(const PackedBatch& batch, const ForwardOptions& options) const {
  E3_RETURN_IF_ERROR(CheckAuxIdsAndTokens(batch, options));
  if (options.kv_cache != nullptr) E3_RETURN_IF_ERROR(CheckCache(*options.kv_cache));
  return absl::OkStatus();
}

std::string DeepseekLM::GraphsOffReason() const {
  if (!options_.device.is_cuda()) return "not a CUDA device";
  if (plan_.sharded()) return "tensor parallelism";
  if (options_.attention != AttentionKernel::kFlashVarlen ||
      !FlashVarlenAppliesTo(options_.dtype, QkHeadDim(), options_.device)) {
    return "attention runs per sample";
  }
  for (const Layer& layer : layers_) {
    if (layer.is_moe && !GroupedMoeStaysOnDevice(layer.moe.routed, options_.dtype, options_.device)) {
      return "MoE experts read their routing counts on the host";
    }
  }
  return "";
}

CausalLMBase::TechniqueWords DeepseekLM::ArchitectureTechniques() const {
  TechniqueWords words;
  words.fused_projections = "gate-up fused";
  words.custom_kernels = "custom kernels (add+RMSNorm, SiLU-mul, MoE gather/combine)";
  words.attention =
      AttentionTechnique(QkHeadDim(), "one fused attention call per batch (v padded to the qk head dim)");
  words.gemms = UsesCublasLt(options_.gemm) && options_.device.is_cuda() ? "cuBLASLt GEMMs, heuristic's algorithms"
                                                                         : "ATen GEMMs";
  words.graphs_off_reason = GraphsOffReason();
  int64_t moe = 0, grouped = 0;
  for (const Layer& layer : layers_) {
    moe += layer.is_moe ? 1 : 0;
    grouped += layer.is_moe && GroupedMoeStaysOnDevice(layer.moe.routed, options_.dtype, options_.device) ? 1 : 0;
  }
  words.experts = ExpertsTechnique(moe, grouped);
  if (config_.quantization.fp8_block) {
    words.weights = absl::StrCat("FP8 block-scaled weights dequantized at load to ", c10::toString(options_.dtype));
  }
  return words;
}

CausalLM::KvCacheShape DeepseekLM::kv_cache_shape() const {
  return {mla_shape_.num_heads, MlaCacheHeadDim(mla_shape_)};
}

absl::StatusOr<GemmTuningResult> DeepseekLM::TuneGemms(const GemmTuningOptions&) {
  GemmTuningResult result;
  result.skipped = "DeepSeek's projections keep cuBLASLt's heuristic or ATen's choices";
  return result;
}

absl::StatusOr<ForwardOutput> DeepseekLM::Forward(const PackedBatch& batch, const ForwardOptions& options) {
  E3_RETURN_IF_ERROR(CheckForward(batch, options));
  return Guarded([&] {
    return RunGraphedOrEager(batch, options, [this](const PackedBatch& b, const PackedLayout& l,
                                                    const ForwardOptions& o) { return Run(b, l, o); });
  });
}

ForwardOutput DeepseekLM::Run(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options) {
  const double eps = config_.rms_norm_eps;
  const bool fused = options_.fused_kernels;
  const GemmPath gemm = options_.gemm;
  // Every rank runs the same samples whole (a leader's micro-batch split
  // is not used here, on any rank alike).
  at::Tensor h = Embed(batch.input_ids);
  // fp32; the V3 rope casts them to the activations' dtype, V2's does not.
  auto [cos, sin] = rotary_.CosSin(batch.position_ids, at::kFloat);
  // The residual stream h and the last sublayer's (summed) output not yet
  // added to it: each add is done by the next norm, one kernel with
  // `fused` (fused_ops.h AddRmsNorm), so layer i's output exists once layer
  // i + 1's input norm (or the final norm) has run.
  AuxCapture aux(options.aux_layer_ids);
  at::Tensor pending;
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    const Layer& layer = layers_[i];
    at::Tensor x = AddRmsNorm(&h, pending, layer.input_layernorm, eps, fused);
    if (i > 0) aux.Capture(i - 1, h);
    const at::Tensor attn = Reduced(MlaAttention(x, layer.attn, mla_shape_, cos, sin, layout, options_.attention, gemm,
                                                 KvCacheSlot{options.kv_cache, i}));
    x = AddRmsNorm(&h, attn, layer.post_attention_layernorm, eps, fused);
    pending = Reduced(layer.is_moe ? DeepseekMoe(x, layer.moe, routing_, fused, gemm)
                                   : SwiGluMlp(x, layer.mlp, fused, gemm));
  }
  ForwardOutput out;
  out.last_hidden = AddRmsNorm(&h, pending, norm_, eps, fused);
  aux.Capture(static_cast<int64_t>(layers_.size()) - 1, h);
  out.aux_hidden = aux.Concatenated();
  Head(options, &out);
  return out;
}

}  // namespace e3
