#include "teacher_server/models/gpt_oss_lm.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/kv_cache.h"
#include "teacher_server/layers/mxfp4.h"
#include "teacher_server/layers/rms_norm.h"
#include "teacher_server/models/aux_capture.h"
#include "teacher_server/models/weight_loader.h"

namespace e3 {
namespace {

// Rows r, r + 2, ... of a [2I, ...] tensor whose rows interleave gate
// (even) and up (odd), as GPT-OSS's gate_up_proj does; then this rank's
// slice [i0, i0 + in) of them.
at::Tensor Deinterleaved(const at::Tensor& t, int64_t parity, int64_t i0, int64_t in) {
  return t.slice(0, parity, t.size(0), 2).narrow(0, i0, in).contiguous();
}

// Tensors LoadWeights reads, for the progress callback's total.
int64_t TensorsToLoad(const ModelConfig& c) {
  const int64_t per_layer = 2 + 8 + 1 + 2 + (c.gpt_oss.mxfp4_experts ? 6 : 4);
  return 3 + per_layer * c.num_hidden_layers;
}

absl::Status CheckMxfp4Widths(const ModelConfig& c) {
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"hidden_size", c.hidden_size},
                                     std::pair<const char*, int64_t>{"intermediate_size", c.intermediate_size}}) {
    if (value % kMxfp4BlockSize != 0) {
      return absl::InvalidArgumentError(absl::StrCat(c.source, ": field \"", field, "\" = ", value,
                                                     " is not a multiple of the MXFP4 block size ", kMxfp4BlockSize));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GptOssLM>> GptOssLM::Load(const ModelDir& dir, const ModelOptions& options) {
  const ModelConfig& c = dir.config();
  if (c.gpt_oss.mxfp4_experts) E3_RETURN_IF_ERROR(CheckMxfp4Widths(c));
  auto model = std::unique_ptr<GptOssLM>(new GptOssLM(c, options));
  E3_RETURN_IF_ERROR(model->MakePlan());
  model->full_shape_ = {model->plan_.q_heads.size, model->plan_.kv_heads.size, c.head_dim, c.rotary_dim(),
                        c.rms_norm_eps};
  model->sliding_shape_ = model->full_shape_;
  model->sliding_shape_.sliding_window = c.sliding_window;
  model->routing_.top_k = c.moe.top_k;
  model->routing_.topk_then_softmax = true;
  model->routing_.clamped_swiglu = ClampedSwiGlu{c.gpt_oss.swiglu_alpha, c.gpt_oss.swiglu_limit};
  E3_RETURN_IF_ERROR(model->LoadCheckpoint(dir));
  return model;
}

absl::Status GptOssLM::LoadWeights(const ModelDir& dir) {
  const ModelConfig& c = config_;
  WeightLoader w(dir, options_.dtype, options_.device, options_.on_progress, TensorsToLoad(c));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer layer;
    E3_ASSIGN_OR_RETURN(layer.input_layernorm, w.LoadAs(p + "input_layernorm.weight", {c.hidden_size}, at::kFloat));
    E3_ASSIGN_OR_RETURN(layer.post_attention_layernorm,
                        w.LoadAs(p + "post_attention_layernorm.weight", {c.hidden_size}, at::kFloat));
    // A sliding layer without a window (sliding_window null) attends fully,
    // as transformers' does.
    layer.sliding = c.gpt_oss.sliding_layers[i] && c.sliding_window > 0;
    E3_RETURN_IF_ERROR(LoadAttention(w, p + "self_attn.", &layer.attn));
    E3_RETURN_IF_ERROR(LoadExperts(w, p + "mlp.", &layer.moe));
    layers_.push_back(std::move(layer));
  }
  E3_ASSIGN_OR_RETURN(norm_, w.LoadAs("model.norm.weight", {c.hidden_size}, at::kFloat));
  E3_RETURN_IF_ERROR(vocab_.LoadEmbedding(w, c, plan_));
  E3_RETURN_IF_ERROR(vocab_.LoadHead(w, c, plan_));
  MakeHead(options_.gemm, options_.fused_kernels);
  MakeGraphs(GraphsOffReason());
  return vocab_.LoadWhole(dir, c, plan_, options_.dtype);
}

absl::Status GptOssLM::LoadAttention(WeightLoader& w, const std::string& p, AttentionWeights* a) const {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t q_out = c.num_attention_heads * D, kv_out = c.num_key_value_heads * D;
  const int64_t q0 = plan_.q_heads.begin * D, qn = plan_.q_heads.size * D;
  const int64_t kv0 = plan_.kv_heads.begin * D, kvn = plan_.kv_heads.size * D;
  E3_ASSIGN_OR_RETURN(a->q_proj, w.LoadSlice(p + "q_proj.weight", {q_out, H}, 0, q0, qn));
  E3_ASSIGN_OR_RETURN(a->k_proj, w.LoadSlice(p + "k_proj.weight", {kv_out, H}, 0, kv0, kvn));
  E3_ASSIGN_OR_RETURN(a->v_proj, w.LoadSlice(p + "v_proj.weight", {kv_out, H}, 0, kv0, kvn));
  E3_ASSIGN_OR_RETURN(a->o_proj, w.LoadSlice(p + "o_proj.weight", {H, q_out}, 1, q0, qn));
  if (c.qkv_bias) {
    E3_ASSIGN_OR_RETURN(a->q_bias, w.LoadSlice(p + "q_proj.bias", {q_out}, 0, q0, qn));
    E3_ASSIGN_OR_RETURN(a->k_bias, w.LoadSlice(p + "k_proj.bias", {kv_out}, 0, kv0, kvn));
    E3_ASSIGN_OR_RETURN(a->v_bias, w.LoadSlice(p + "v_proj.bias", {kv_out}, 0, kv0, kvn));
  }
  // o_proj is row-parallel: its bias joins the sum once, from rank 0.
  if (c.o_bias && plan_.adds_reduced_bias()) {
    E3_ASSIGN_OR_RETURN(a->o_bias, w.Load(p + "o_proj.bias", {H}));
  }
  // One sink per query head: this rank's heads' sinks.
  E3_ASSIGN_OR_RETURN(a->sinks, w.LoadSlice(p + "sinks", {c.num_attention_heads}, 0, plan_.q_heads.begin,
                                            plan_.q_heads.size));
  if (options_.fuse_projections) FuseQkv(a);
  return absl::OkStatus();
}

absl::Status GptOssLM::LoadExpertMatrices(WeightLoader& w, const std::string& x, at::Tensor* gate_up,
                                          at::Tensor* down) const {
  const ModelConfig& c = config_;
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.intermediate_size;
  const int64_t e0 = plan_.experts.begin, ne = plan_.experts.size;
  if (!c.gpt_oss.mxfp4_experts) {
    // transformers' layout is [E, in, out] (x @ W).
    E3_ASSIGN_OR_RETURN(at::Tensor gu, w.LoadSlice(x + "gate_up_proj", {E, H, 2 * I}, 0, e0, ne));
    E3_ASSIGN_OR_RETURN(at::Tensor dn, w.LoadSlice(x + "down_proj", {E, I, H}, 0, e0, ne));
    *gate_up = gu.transpose(1, 2);
    *down = dn.transpose(1, 2);
    return absl::OkStatus();
  }
  const int64_t Bh = H / kMxfp4BlockSize, Bi = I / kMxfp4BlockSize;
  E3_ASSIGN_OR_RETURN(at::Tensor gu_blocks, w.LoadSliceAs(x + "gate_up_proj_blocks", {E, 2 * I, Bh, kMxfp4BlockBytes},
                                                          0, e0, ne, at::kByte));
  E3_ASSIGN_OR_RETURN(at::Tensor gu_scales, w.LoadSliceAs(x + "gate_up_proj_scales", {E, 2 * I, Bh}, 0, e0, ne,
                                                          at::kByte));
  E3_ASSIGN_OR_RETURN(at::Tensor dn_blocks, w.LoadSliceAs(x + "down_proj_blocks", {E, H, Bi, kMxfp4BlockBytes}, 0,
                                                          e0, ne, at::kByte));
  E3_ASSIGN_OR_RETURN(at::Tensor dn_scales, w.LoadSliceAs(x + "down_proj_scales", {E, H, Bi}, 0, e0, ne, at::kByte));
  // One expert at a time: the dequantizer's temporaries are tens of bytes
  // per weight, too many for a whole layer of a large model.
  std::vector<at::Tensor> gus, dns;
  for (int64_t e = 0; e < ne; ++e) {
    E3_ASSIGN_OR_RETURN(at::Tensor gu, DequantizeMxfp4(gu_blocks[e], gu_scales[e], options_.dtype,
                                                       x + "gate_up_proj_blocks/_scales"));
    E3_ASSIGN_OR_RETURN(at::Tensor dn, DequantizeMxfp4(dn_blocks[e], dn_scales[e], options_.dtype,
                                                       x + "down_proj_blocks/_scales"));
    gus.push_back(gu);
    dns.push_back(dn);
  }
  *gate_up = torch::stack(gus);
  *down = torch::stack(dns);
  return absl::OkStatus();
}

absl::Status GptOssLM::LoadExperts(WeightLoader& w, const std::string& p, MoeWeights* moe) const {
  const ModelConfig& c = config_;
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.intermediate_size;
  const int64_t e0 = plan_.experts.begin, ne = plan_.experts.size;
  const int64_t i0 = plan_.expert_intermediate.begin, in = plan_.expert_intermediate.size;
  // The router is replicated, so every rank routes every token alike.
  E3_ASSIGN_OR_RETURN(moe->router, w.Load(p + "router.weight", {E, H}));
  E3_ASSIGN_OR_RETURN(moe->router_bias, w.Load(p + "router.bias", {E}));
  moe->first_expert = e0;
  const std::string x = p + "experts.";
  at::Tensor gate_up, down;
  E3_RETURN_IF_ERROR(LoadExpertMatrices(w, x, &gate_up, &down));
  E3_ASSIGN_OR_RETURN(at::Tensor gate_up_bias, w.LoadSlice(x + "gate_up_proj_bias", {E, 2 * I}, 0, e0, ne));
  // down_proj is row-parallel inside an expert group: its bias is added by
  // the rank holding the slice that starts at 0, once per expert.
  at::Tensor down_bias;
  if (i0 == 0) {
    E3_ASSIGN_OR_RETURN(down_bias, w.LoadSlice(x + "down_proj_bias", {E, H}, 0, e0, ne));
  }
  for (int64_t e = 0; e < ne; ++e) {
    MlpWeights m;
    m.gate_proj = Deinterleaved(gate_up[e], 0, i0, in);
    m.up_proj = Deinterleaved(gate_up[e], 1, i0, in);
    m.gate_bias = Deinterleaved(gate_up_bias[e], 0, i0, in);
    m.up_bias = Deinterleaved(gate_up_bias[e], 1, i0, in);
    m.down_proj = down[e].narrow(1, i0, in).contiguous();
    if (down_bias.defined()) m.down_bias = down_bias[e].contiguous();
    // [gate; up] again, as FuseGateUp orders them (ClampedSwiGluMlp and the
    // grouped experts read that order).
    if (options_.fuse_projections) FuseGateUp(&m);
    moe->experts.push_back(std::move(m));
  }
  if (options_.grouped_experts && ExpertsStackable(*moe)) StackExperts(moe);
  return absl::OkStatus();
}

absl::Status GptOssLM::CheckForward(const PackedBatch& batch, const ForwardOptions& options) const {
  E3_RETURN_IF_ERROR(CheckAuxIdsAndTokens(batch, options));
  if (options.kv_cache != nullptr) E3_RETURN_IF_ERROR(CheckCache(*options.kv_cache));
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> GptOssLM::Forward(const PackedBatch& batch, const ForwardOptions& options) {
  E3_RETURN_IF_ERROR(CheckForward(batch, options));
  return Guarded([&] {
    return RunGraphedOrEager(batch, options, [this](const PackedBatch& b, const PackedLayout& l,
                                                    const ForwardOptions& o) { return Run(b, l, o); });
  });
}

ForwardOutput GptOssLM::Run(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options) {
  const double eps = config_.rms_norm_eps;
  const bool fused = options_.fused_kernels;
  at::Tensor h = Embed(batch.input_ids);
  auto [cos, sin] = rotary_.CosSin(batch.position_ids, h.scalar_type());
  const AttentionOptions attn{options_.attention, /*rope_in_place=*/fused, options_.gemm};
  AuxCapture aux(options.aux_layer_ids);
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    const Layer& layer = layers_[i];
    at::Tensor x = RmsNormWeightInFp32(h, layer.input_layernorm, eps);
    h = h + Reduced(SelfAttention(x, layer.attn, layer.sliding ? sliding_shape_ : full_shape_, cos, sin, layout,
                                  attn, at::Tensor(), KvCacheSlot{options.kv_cache, i}));
    x = RmsNormWeightInFp32(h, layer.post_attention_layernorm, eps);
    h = h + Reduced(RoutedExperts(x, layer.moe, routing_, fused));
    aux.Capture(i, h);
  }
  ForwardOutput out;
  out.last_hidden = RmsNormWeightInFp32(h, norm_, eps);
  out.aux_hidden = aux.Concatenated();
  Head(options, &out);
  return out;
}

std::string GptOssLM::GraphsOffReason() const {
  if (!options_.device.is_cuda()) return "not a CUDA device";
  if (plan_.sharded()) return "tensor parallelism";
  if (options_.attention != AttentionKernel::kFlashVarlen ||
      !FlashVarlenAppliesTo(options_.dtype, config_.head_dim, options_.device)) {
    return "attention runs per sample";
  }
  for (const Layer& layer : layers_) {
    if (!GroupedMoeStaysOnDevice(layer.moe, options_.dtype, options_.device)) {
      return "MoE experts read their routing counts on the host";
    }
  }
  return "";
}

CausalLMBase::TechniqueWords GptOssLM::ArchitectureTechniques() const {
  int64_t sliding = 0, grouped = 0;
  for (const Layer& layer : layers_) {
    sliding += layer.sliding ? 1 : 0;
    grouped += GroupedMoeStaysOnDevice(layer.moe, options_.dtype, options_.device) ? 1 : 0;
  }
  const int64_t layers = static_cast<int64_t>(layers_.size());
  const std::string window =
      absl::StrCat("sliding window ", config_.sliding_window, " on ", sliding, " of ", layers, " layers");
  TechniqueWords words;
  words.fused_projections = "qkv and expert gate-up fused";
  words.custom_kernels = "custom kernels (rope, MoE gather, clamped SwiGLU, combine; norms in ATen)";
  // Sinks leave SDPA out: without the fused kernel, attention is eager.
  if (options_.attention == AttentionKernel::kFlashVarlen &&
      FlashVarlenAppliesTo(options_.dtype, config_.head_dim, options_.device)) {
    words.attention = absl::StrCat("one fused attention call per batch (sinks through its log-sum-exp, ", window,
                                   " in the kernel)");
  } else {
    words.attention = absl::StrCat("eager sink attention per sample (", window, ")");
  }
  words.gemms = UsesCublasLt(options_.gemm) && options_.device.is_cuda() ? "cuBLASLt GEMMs, heuristic's algorithms"
                                                                         : "ATen GEMMs";
  words.graphs_off_reason = GraphsOffReason();
  words.experts = ExpertsTechnique(layers, grouped, " (clamped SwiGLU with biases)");
  if (config_.gpt_oss.mxfp4_experts) {
    words.weights = absl::StrCat("MXFP4 experts dequantized at load to ", c10::toString(options_.dtype));
  }
  return words;
}

absl::StatusOr<GemmTuningResult> GptOssLM::TuneGemms(const GemmTuningOptions& /*options*/) {
  GemmTuningResult result;
  result.skipped = "GPT-OSS keeps the GEMM path's own algorithm choices";
  return result;
}

}  // namespace e3
