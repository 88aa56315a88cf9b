#include "teacher_server/models/decoder_lm.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/torch/gemm.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/kv_cache.h"
#include "teacher_server/models/aux_capture.h"
#include "teacher_server/models/weight_loader.h"
#include "teacher_server/parallel/micro_batches.h"

namespace e3 {
namespace {

// The names of one expert's three projections and of the router.
struct ExpertNames {
  std::string router, gate, up, down;
};

ExpertNames MoeNames(Architecture arch, const std::string& layer_prefix, int64_t e) {
  if (arch == Architecture::kMixtral) {
    const std::string p = layer_prefix + "block_sparse_moe.";
    const std::string x = absl::StrCat(p, "experts.", e, ".");
    return {p + "gate.weight", x + "w1.weight", x + "w3.weight", x + "w2.weight"};
  }
  const std::string p = layer_prefix + "mlp.";
  const std::string x = absl::StrCat(p, "experts.", e, ".");
  return {p + "gate.weight", x + "gate_proj.weight", x + "up_proj.weight", x + "down_proj.weight"};
}

// The slice [i0, i0 + in) of a SwiGLU MLP's intermediate dimension: rows
// of gate and up, columns of down (dense layers and experts alike).
absl::Status LoadSwiGluSlice(WeightLoader& w, const std::string& gate, const std::string& up,
                             const std::string& down, int64_t I, int64_t H, int64_t i0, int64_t in, MlpWeights* m) {
  E3_ASSIGN_OR_RETURN(m->gate_proj, w.LoadSlice(gate, {I, H}, 0, i0, in));
  E3_ASSIGN_OR_RETURN(m->up_proj, w.LoadSlice(up, {I, H}, 0, i0, in));
  E3_ASSIGN_OR_RETURN(m->down_proj, w.LoadSlice(down, {H, I}, 1, i0, in));
  return absl::OkStatus();
}

// Tensors a layer loads, for the progress callback's total.
int64_t TensorsPerLayer(const ModelConfig& c, const ShardPlan& plan, bool moe) {
  int64_t n = 2 + 4 + (c.qkv_bias ? 3 : 0) + (c.o_bias ? 1 : 0) + (c.qk_norm ? 2 : 0);
  n += moe ? 1 + 3 * plan.experts.size : 3 + (c.mlp_bias ? 3 : 0);
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecoderLM>> DecoderLM::Load(const ModelDir& dir, const ModelOptions& options) {
  const ModelConfig& c = dir.config();
  auto model = std::unique_ptr<DecoderLM>(new DecoderLM(c, options));
  E3_RETURN_IF_ERROR(model->MakePlan());
  model->attn_shape_ = {model->plan_.q_heads.size, model->plan_.kv_heads.size, c.head_dim, c.rotary_dim(),
                        c.rms_norm_eps};
  model->routing_ = {c.moe.top_k, c.moe.norm_topk_prob};
  E3_RETURN_IF_ERROR(model->LoadCheckpoint(dir));
  return model;
}

absl::Status DecoderLM::LoadWeights(const ModelDir& dir) {
  const ModelConfig& c = config_;
  int64_t total = 3;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) total += TensorsPerLayer(c, plan_, c.IsMoeLayer(i));
  WeightLoader w(dir, options_.dtype, options_.device, options_.on_progress, total);
  E3_RETURN_IF_ERROR(vocab_.LoadEmbedding(w, c, plan_));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    Layer layer;
    E3_RETURN_IF_ERROR(LoadLayer(w, i, &layer));
    layers_.push_back(std::move(layer));
  }
  E3_ASSIGN_OR_RETURN(norm_, w.Load("model.norm.weight", {c.hidden_size}));
  E3_RETURN_IF_ERROR(vocab_.LoadHead(w, c, plan_));
  MakeHead(options_.gemm, options_.fused_kernels);
  MakeGraphs(GraphsOffReason());
  return vocab_.LoadWhole(dir, c, plan_, options_.dtype);
}

absl::Status DecoderLM::LoadLayer(WeightLoader& w, int64_t i, Layer* layer) const {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t q_out = c.num_attention_heads * D, kv_out = c.num_key_value_heads * D;
  const int64_t q0 = plan_.q_heads.begin * D, qn = plan_.q_heads.size * D;
  const int64_t kv0 = plan_.kv_heads.begin * D, kvn = plan_.kv_heads.size * D;
  const std::string p = absl::StrCat("model.layers.", i, ".");
  E3_ASSIGN_OR_RETURN(layer->input_layernorm, w.Load(p + "input_layernorm.weight", {H}));
  E3_ASSIGN_OR_RETURN(layer->post_attention_layernorm, w.Load(p + "post_attention_layernorm.weight", {H}));
  AttentionWeights& a = layer->attn;
  E3_ASSIGN_OR_RETURN(a.q_proj, w.LoadSlice(p + "self_attn.q_proj.weight", {q_out, H}, 0, q0, qn));
  E3_ASSIGN_OR_RETURN(a.k_proj, w.LoadSlice(p + "self_attn.k_proj.weight", {kv_out, H}, 0, kv0, kvn));
  E3_ASSIGN_OR_RETURN(a.v_proj, w.LoadSlice(p + "self_attn.v_proj.weight", {kv_out, H}, 0, kv0, kvn));
  E3_ASSIGN_OR_RETURN(a.o_proj, w.LoadSlice(p + "self_attn.o_proj.weight", {H, q_out}, 1, q0, qn));
  if (c.qkv_bias) {
    E3_ASSIGN_OR_RETURN(a.q_bias, w.LoadSlice(p + "self_attn.q_proj.bias", {q_out}, 0, q0, qn));
    E3_ASSIGN_OR_RETURN(a.k_bias, w.LoadSlice(p + "self_attn.k_proj.bias", {kv_out}, 0, kv0, kvn));
    E3_ASSIGN_OR_RETURN(a.v_bias, w.LoadSlice(p + "self_attn.v_proj.bias", {kv_out}, 0, kv0, kvn));
  }
  if (c.o_bias && plan_.adds_reduced_bias()) {
    E3_ASSIGN_OR_RETURN(a.o_bias, w.Load(p + "self_attn.o_proj.bias", {H}));
  }
  if (c.qk_norm) {
    E3_ASSIGN_OR_RETURN(a.q_norm, w.Load(p + "self_attn.q_norm.weight", {D}));
    E3_ASSIGN_OR_RETURN(a.k_norm, w.Load(p + "self_attn.k_norm.weight", {D}));
  }
  if (options_.fuse_projections) FuseQkv(&a);

  layer->is_moe = c.IsMoeLayer(i);
  if (layer->is_moe) {
    const int64_t I = c.moe.intermediate_size;
    const int64_t i0 = plan_.expert_intermediate.begin, in = plan_.expert_intermediate.size;
    E3_ASSIGN_OR_RETURN(layer->moe.router,
                        w.Load(MoeNames(c.architecture, p, 0).router, {c.moe.num_experts, H}));
    layer->moe.first_expert = plan_.experts.begin;
    for (int64_t e = plan_.experts.begin; e < plan_.experts.end(); ++e) {
      const ExpertNames n = MoeNames(c.architecture, p, e);
      MlpWeights m;
      E3_RETURN_IF_ERROR(LoadSwiGluSlice(w, n.gate, n.up, n.down, I, H, i0, in, &m));
      if (options_.fuse_projections) FuseGateUp(&m);
      layer->moe.experts.push_back(std::move(m));
    }
    if (options_.grouped_experts && ExpertsStackable(layer->moe)) StackExperts(&layer->moe);
    return absl::OkStatus();
  }
  const int64_t I = c.intermediate_size;
  const int64_t i0 = plan_.intermediate.begin, in = plan_.intermediate.size;
  MlpWeights& m = layer->mlp;
  E3_RETURN_IF_ERROR(LoadSwiGluSlice(w, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                                     p + "mlp.down_proj.weight", I, H, i0, in, &m));
  if (c.mlp_bias) {
    E3_ASSIGN_OR_RETURN(m.gate_bias, w.LoadSlice(p + "mlp.gate_proj.bias", {I}, 0, i0, in));
    E3_ASSIGN_OR_RETURN(m.up_bias, w.LoadSlice(p + "mlp.up_proj.bias", {I}, 0, i0, in));
    if (plan_.adds_reduced_bias()) {
      E3_ASSIGN_OR_RETURN(m.down_bias, w.Load(p + "mlp.down_proj.bias", {H}));
    }
  }
  if (options_.fuse_projections) FuseGateUp(&m);
  return absl::OkStatus();
}

absl::Status DecoderLM::CheckForward(const PackedBatch& batch, const ForwardOptions& options) const {
  E3_RETURN_IF_ERROR(CheckAuxIdsAndTokens(batch, options));
  if (options.micro_batch_split >= batch.num_samples()) {
    return absl::InvalidArgumentError(absl::StrCat("micro_batch_split ", options.micro_batch_split,
                                                   " is not a sample boundary inside a batch of ",
                                                   batch.num_samples(), " samples"));
  }
  if (options.kv_cache != nullptr) E3_RETURN_IF_ERROR(CheckCache(*options.kv_cache));
  if (config_.sliding_window > 0) {
    for (size_t s = 0; s + 1 < batch.cu_seqlens.size(); ++s) {
      const int64_t n = batch.cu_seqlens[s + 1] - batch.cu_seqlens[s];
      if (n > config_.sliding_window) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sample ", s, " has ", n, " tokens, more than the sliding window (", config_.sliding_window, ") of ",
            config_.source, "; windowed attention is not implemented: cut samples with --max_seq_len"));
      }
    }
  }
  return absl::OkStatus();
}

std::string DecoderLM::GraphsOffReason() const {
  if (!options_.device.is_cuda()) return "not a CUDA device";
  if (plan_.sharded()) return "tensor parallelism";
  if (options_.attention != AttentionKernel::kFlashVarlen ||
      !FlashVarlenAppliesTo(options_.dtype, config_.head_dim, options_.device)) {
    return "attention runs per sample";
  }
  for (const Layer& layer : layers_) {
    if (layer.is_moe && !GroupedMoeStaysOnDevice(layer.moe, options_.dtype, options_.device)) {
      return "MoE experts read their routing counts on the host";
    }
  }
  return "";
}

CausalLMBase::TechniqueWords DecoderLM::ArchitectureTechniques() const {
  TechniqueWords words;
  words.fused_projections = "qkv and gate-up fused";
  words.custom_kernels = "custom kernels";
  words.attention = AttentionTechnique(config_.head_dim, "one fused attention call per batch");
  if (UsesCublasLt(options_.gemm) && options_.device.is_cuda()) {
    words.gemms = absl::StrCat(options_.residual_in_gemm && !plan_.sharded() ? "cuBLASLt GEMMs, residual in the epilogue"
                                                                             : "cuBLASLt GEMMs",
                               options_.gemm == GemmPath::kCublasLtTuned ? ", algorithms tuned in sequence"
                                                                         : ", heuristic's algorithms");
  } else {
    words.gemms = "ATen GEMMs";
  }
  words.graphs_off_reason = GraphsOffReason();
  int64_t moe = 0, grouped = 0;
  for (const Layer& layer : layers_) {
    moe += layer.is_moe ? 1 : 0;
    grouped += layer.is_moe && GroupedMoeStaysOnDevice(layer.moe, options_.dtype, options_.device) ? 1 : 0;
  }
  words.experts = ExpertsTechnique(moe, grouped);
  words.tp_overlap = options_.tp_overlap;
  return words;
}

absl::StatusOr<ForwardOutput> DecoderLM::Forward(const PackedBatch& batch, const ForwardOptions& options) {
  E3_RETURN_IF_ERROR(CheckForward(batch, options));
  return Guarded([&] {
    return RunGraphedOrEager(batch, options, [this](const PackedBatch& b, const PackedLayout& l,
                                                    const ForwardOptions& o) { return Run(b, l, o); });
  });
}

ForwardOutput DecoderLM::Run(const PackedBatch& batch, const PackedLayout& layout, const ForwardOptions& options) {
  if (plan_.sharded()) return RunSharded(batch, layout, options);
  const double eps = config_.rms_norm_eps;
  const bool fused = options_.fused_kernels;
  at::Tensor h = Embed(batch.input_ids);
  auto [cos, sin] = rotary_.CosSin(batch.position_ids, h.scalar_type());
  const AttentionOptions attn{options_.attention, /*rope_in_place=*/fused, options_.gemm};
  const GemmPath gemm = options_.gemm;
  // Residual adds in the GEMMs. Where cuBLASLt does not take a GEMM (CPU,
  // fp32, odd sizes) its fallback adds after the product, the same work the
  // norm's add would do there (the fused norm kernel needs bf16/fp16 and
  // widths that are multiples of 8 as well).
  const bool add_in_gemm = ResidualInGemm();

  // The residual stream h and the output of the last sublayer, not yet
  // added to it (`pending`): each residual add is done by the next norm
  // (one kernel with `fused`) or, with add_in_gemm, by the sublayer's last
  // GEMM (pending then stays undefined). Either way layer i's output, h
  // after its MLP is added, exists once layer i + 1's input norm (or the
  // final norm) has run; h is always replaced, never written in place.
  AuxCapture aux(options.aux_layer_ids);
  at::Tensor pending;
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    const Layer& layer = layers_[i];
    at::Tensor x = AddRmsNorm(&h, pending, layer.input_layernorm, eps, fused);
    if (i > 0) aux.Capture(i - 1, h);
    const KvCacheSlot cache{options.kv_cache, i};
    if (add_in_gemm) {
      h = SelfAttention(x, layer.attn, attn_shape_, cos, sin, layout, attn, /*residual=*/h, cache);
      x = AddRmsNorm(&h, at::Tensor(), layer.post_attention_layernorm, eps, fused);
    } else {
      x = SelfAttention(x, layer.attn, attn_shape_, cos, sin, layout, attn, at::Tensor(), cache);
      x = AddRmsNorm(&h, x, layer.post_attention_layernorm, eps, fused);
    }
    if (layer.is_moe) {
      pending = RoutedExperts(x, layer.moe, routing_, fused);
    } else if (add_in_gemm) {
      h = SwiGluMlp(x, layer.mlp, fused, gemm, /*residual=*/h);
      pending = at::Tensor();
    } else {
      pending = SwiGluMlp(x, layer.mlp, fused, gemm);
    }
  }
  ForwardOutput out;
  out.last_hidden = AddRmsNorm(&h, pending, norm_, eps, fused);
  aux.Capture(static_cast<int64_t>(layers_.size()) - 1, h);
  out.aux_hidden = aux.Concatenated();
  Head(options, &out);
  return out;
}

ForwardOutput DecoderLM::RunSharded(const PackedBatch& batch, const PackedLayout& layout,
                                    const ForwardOptions& options) {
  const double eps = config_.rms_norm_eps;
  const bool fused = options_.fused_kernels;
  TpGroup& tp = *options_.tp;
  const at::Tensor h = Embed(batch.input_ids);
  auto [cos, sin] = rotary_.CosSin(batch.position_ids, h.scalar_type());
  const AttentionOptions attn{options_.attention, /*rope_in_place=*/fused, options_.gemm};

  // One micro-batch, or two whose reductions overlap the other's compute
  // (parallel/micro_batches.h). Each holds its residual stream h, the
  // partial sublayer output `pending` and that output's all-reduce in
  // flight; the residual add is the next norm's (partial products must be
  // summed before h is added, so no add in the GEMMs here).
  struct MicroBatch {
    PackedLayout layout;
    at::Tensor cos, sin, h, pending;
    std::unique_ptr<PendingCollective> reduction;
    AuxCapture aux;
  };
  std::vector<MicroBatch> parts;
  parts.reserve(2);
  const int64_t split =
      options.micro_batch_split >= 0 ? options.micro_batch_split : MicroBatchSplit(options_, batch.cu_seqlens);
  const int64_t samples = batch.num_samples();
  if (split > 0) CountOverlappedForward();
  for (const auto& [s0, s1] : split > 0 ? std::vector<std::pair<int64_t, int64_t>>{{0, split}, {split, samples}}
                                        : std::vector<std::pair<int64_t, int64_t>>{{0, samples}}) {
    const int64_t begin = batch.cu_seqlens[s0], tokens = batch.cu_seqlens[s1] - begin;
    PackedLayout part_layout = split > 0 ? MakePackedLayout(SampleRangeOffsets(batch.cu_seqlens, s0, s1),
                                                            options_.device, options_.attention)
                                         : layout;
    parts.push_back(MicroBatch{std::move(part_layout), cos.narrow(0, begin, tokens),
                               sin.narrow(0, begin, tokens), h.narrow(0, begin, tokens), at::Tensor(), nullptr,
                               AuxCapture(options.aux_layer_ids)});
  }
  // Before a part reads its pending output: its sum has arrived.
  auto summed = [&tp](MicroBatch& m) {
    if (m.reduction) tp.Finish(std::move(m.reduction));
  };
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    const Layer& layer = layers_[i];
    for (MicroBatch& m : parts) {
      summed(m);
      const at::Tensor x = AddRmsNorm(&m.h, m.pending, layer.input_layernorm, eps, fused);
      if (i > 0) m.aux.Capture(i - 1, m.h);
      m.pending = SelfAttention(x, layer.attn, attn_shape_, m.cos, m.sin, m.layout, attn);
      m.reduction = tp.StartAllReduceSum(m.pending);
    }
    for (MicroBatch& m : parts) {
      summed(m);
      const at::Tensor x = AddRmsNorm(&m.h, m.pending, layer.post_attention_layernorm, eps, fused);
      m.pending = layer.is_moe ? RoutedExperts(x, layer.moe, routing_, fused)
                               : SwiGluMlp(x, layer.mlp, fused, options_.gemm);
      m.reduction = tp.StartAllReduceSum(m.pending);
    }
  }
  std::vector<at::Tensor> last, aux;
  for (MicroBatch& m : parts) {
    summed(m);
    last.push_back(AddRmsNorm(&m.h, m.pending, norm_, eps, fused));
    m.aux.Capture(static_cast<int64_t>(layers_.size()) - 1, m.h);
    aux.push_back(m.aux.Concatenated());
  }
  ForwardOutput out;
  out.last_hidden = parts.size() == 1 ? last[0] : torch::cat(last);
  if (!options.aux_layer_ids.empty()) out.aux_hidden = parts.size() == 1 ? aux[0] : torch::cat(aux);
  Head(options, &out);
  return out;
}

bool DecoderLM::ResidualInGemm() const {
  return options_.residual_in_gemm && UsesCublasLt(options_.gemm) && !plan_.sharded();
}

std::vector<GemmSite> DecoderLM::GemmSites() const {
  const bool residual = ResidualInGemm();
  std::vector<GemmSite> sites;
  for (const Layer& layer : layers_) {
    const AttentionWeights& a = layer.attn;
    if (a.qkv_proj.defined()) {
      sites.push_back({a.qkv_proj, a.qkv_bias, false});
    } else {
      sites.push_back({a.q_proj, a.q_bias, false});
      sites.push_back({a.k_proj, a.k_bias, false});
      sites.push_back({a.v_proj, a.v_bias, false});
    }
    sites.push_back({a.o_proj, a.o_bias, residual});
    if (layer.is_moe) continue;
    const MlpWeights& m = layer.mlp;
    if (m.gate_up_proj.defined()) {
      sites.push_back({m.gate_up_proj, m.gate_up_bias, false});
    } else {
      sites.push_back({m.gate_proj, m.gate_bias, false});
      sites.push_back({m.up_proj, m.up_bias, false});
    }
    sites.push_back({m.down_proj, m.down_bias, residual});
  }
  return sites;
}

absl::StatusOr<GemmTuningResult> DecoderLM::TuneGemms(const GemmTuningOptions& options) {
  if (options_.gemm != GemmPath::kCublasLtTuned || !options_.device.is_cuda()) {
    GemmTuningResult result;
    result.skipped = options_.device.is_cuda() ? "this backend keeps cuBLASLt's or ATen's own choices"
                                               : "the model runs on the CPU";
    return result;
  }
  return TuneGemmsInSequence(GemmSites(), options);
}

}  // namespace e3
