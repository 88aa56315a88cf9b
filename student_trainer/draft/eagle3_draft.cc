#include "student_trainer/draft/eagle3_draft.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/torch/torch_compat.h"

namespace e3 {
namespace {

// The target head in the 16-bit compute dtype, for TargetLogits' 16-bit
// GEMM with an fp32 result, when that dtype holds it exactly (a bf16
// checkpoint's head, kept in fp32) and the GEMM exists; else undefined.
// It costs N * H_t 16-bit values on the device.
at::Tensor LosslessIn16Bit(const at::Tensor& head, const Eagle3DraftOptions& o) {
  if (!compat::kHasMmFloatOut || !o.device.is_cuda() || (o.dtype != at::kBFloat16 && o.dtype != at::kHalf)) {
    return at::Tensor();
  }
  torch::NoGradGuard no_grad;
  at::Tensor low = head.to(o.dtype).contiguous();
  if (!low.to(head.scalar_type()).equal(head)) return at::Tensor();
  return low;
}

// HF's _init_weights for Llama: normal(0, initializer_range = 0.02).
constexpr double kInitStd = 0.02;

torch::nn::Linear MakeLinear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

absl::Status ConfigError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 draft config: ", field, ": ", what));
}

std::string ShapeString(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat("[", absl::StrJoin(t.sizes().vec(), ", "), "]");
}

// transformers' repeat_kv on a [T, kv_heads, D] tensor: kv head j serves
// query heads [j * n_rep, (j + 1) * n_rep).
at::Tensor RepeatKv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t t = x.size(0), kvh = x.size(1), d = x.size(2);
  return x.unsqueeze(2).expand({t, kvh, n_rep, d}).reshape({t, kvh * n_rep, d});
}

}  // namespace

absl::Status Eagle3DraftConfig::Validate() const {
  if (target_hidden_size <= 0) return ConfigError("target_hidden_size", "must be positive");
  if (hidden_size != target_hidden_size) {
    // The draft reads the target's embed_tokens ([V, H_target]) as its own
    // embeddings and starts lm_head from the target head rows, so the two
    // widths must agree (as in every SpecForge/SGLang EAGLE-3 draft).
    return ConfigError("hidden_size", absl::StrCat("must equal target_hidden_size (",
                                                   target_hidden_size, "), got ", hidden_size));
  }
  if (num_aux <= 0) return ConfigError("num_aux", "must be positive");
  if (intermediate_size <= 0) return ConfigError("intermediate_size", "must be positive");
  if (num_heads <= 0) return ConfigError("num_heads", "must be positive");
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    return ConfigError("num_kv_heads",
                       absl::StrCat("must divide num_heads (", num_heads, "), got ", num_kv_heads));
  }
  if (head_dim <= 0 || head_dim % 2 != 0)
    return ConfigError("head_dim", "must be positive and even");
  const int64_t rd = rotary_dim();
  if (rd <= 0 || rd > head_dim || rd % 2 != 0) {
    return ConfigError(
        "rope.partial_rotary_factor",
        absl::StrCat("gives rotary_dim ", rd, "; expected an even value in (0, ", head_dim, "]"));
  }
  if (!(rms_norm_eps > 0)) return ConfigError("rms_norm_eps", "must be positive");
  if (max_position_embeddings < 0)
    return ConfigError("max_position_embeddings", "must not be negative");
  if (vocab_size <= 0) return ConfigError("vocab_size", "must be positive");
  if (draft_vocab_size <= 0 || draft_vocab_size > vocab_size) {
    return ConfigError("draft_vocab_size", absl::StrCat("must lie in [1, vocab_size = ", vocab_size,
                                                        "], got ", draft_vocab_size));
  }
  if (!aux_layer_ids.empty() && static_cast<int64_t>(aux_layer_ids.size()) != num_aux) {
    return ConfigError("aux_layer_ids", absl::StrCat("has ", aux_layer_ids.size(),
                                                     " ids, but num_aux is ", num_aux));
  }
  return absl::OkStatus();
}

absl::StatusOr<Eagle3DraftConfig> DraftConfigFromTarget(const ModelConfig& target,
                                                        int64_t draft_vocab_size,
                                                        std::vector<int32_t> aux_layer_ids) {
  Eagle3DraftConfig c;
  c.hidden_size = target.hidden_size;
  c.target_hidden_size = target.hidden_size;
  c.intermediate_size = target.intermediate_size;
  c.num_heads = target.num_attention_heads;
  c.num_kv_heads = target.num_key_value_heads;
  c.head_dim = target.head_dim;
  c.rms_norm_eps = target.rms_norm_eps;
  c.rope = target.rope;
  c.max_position_embeddings = target.max_position_embeddings;
  c.vocab_size = target.vocab_size;
  c.draft_vocab_size = draft_vocab_size;
  c.aux_layer_ids = aux_layer_ids.empty() ? target.DefaultAuxLayerIds() : std::move(aux_layer_ids);
  c.num_aux = static_cast<int64_t>(c.aux_layer_ids.size());
  E3_RETURN_IF_ERROR(c.Validate());
  return c;
}

// ---------------------------------------------------------------------------

Eagle3RmsNormImpl::Eagle3RmsNormImpl(int64_t size, double eps, const torch::TensorOptions& options)
    : eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}, options));
}

at::Tensor Eagle3RmsNormImpl::forward(const at::Tensor& x) {
  // https://github.com/huggingface/transformers/blob/main/src/transformers/models/llama/modeling_llama.py
  // (LlamaRMSNorm.forward), the same in SpecForge's draft.
  at::Tensor h = x.to(AtLeastFloat(x.scalar_type()));
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps_);
  return weight * h.to(x.scalar_type());
}

Eagle3AttentionImpl::Eagle3AttentionImpl(const Eagle3DraftConfig& c)
    : num_heads_(c.num_heads), num_kv_heads_(c.num_kv_heads), head_dim_(c.head_dim) {
  q_proj = register_module("q_proj", MakeLinear(2 * c.hidden_size, c.num_heads * c.head_dim));
  k_proj = register_module("k_proj", MakeLinear(2 * c.hidden_size, c.num_kv_heads * c.head_dim));
  v_proj = register_module("v_proj", MakeLinear(2 * c.hidden_size, c.num_kv_heads * c.head_dim));
  o_proj = register_module("o_proj", MakeLinear(c.num_heads * c.head_dim, c.hidden_size));
}

namespace {

// Scores a query chunk may hold without autograd: [heads, rows, n] of them.
std::atomic<int64_t> g_no_grad_score_bytes{int64_t{1} << 30};

int64_t NoGradQueryRows(int64_t heads, int64_t n, int64_t element_size) {
  const int64_t per_row = std::max<int64_t>(1, heads * n * std::max<int64_t>(element_size, 4));
  return std::clamp<int64_t>(g_no_grad_score_bytes.load() / per_row, 1, n);
}

// The attention of one sample's query rows [a, b) (the sample starts at
// packed row `begin`): causal over the step-0 keys of rows < b, plus the
// diagonal keys of steps 1..j at each query's own row. q is scaled and
// roped [T, heads, D]; diag is [T, heads, j] (undefined at step 0).
// Returns [b - a, heads, D].
at::Tensor SampleAttention(const at::Tensor& q, const at::Tensor& diag, const TttKvCache& cache,
                           int64_t begin, int64_t a, int64_t b) {
  const int64_t steps = static_cast<int64_t>(cache.keys.size());
  const int64_t m = b - a;
  // [rows, heads, D] -> [heads, rows, D]
  at::Tensor qs = q.narrow(0, begin + a, m).transpose(0, 1);
  at::Tensor k0 = cache.keys[0].narrow(0, begin, b).transpose(0, 1);
  at::Tensor v0 = cache.values[0].narrow(0, begin, b).transpose(0, 1);
  // Block-causal part over the step-0 keys of this sample only. The
  // causal mask is an additive bias the GEMM adds as it writes the
  // scores (baddbmm's C), instead of a separate masked_fill pass over
  // [heads, m, b] forward and backward.
  at::Tensor causal = torch::full({m, b}, -std::numeric_limits<double>::infinity(),
                                  torch::TensorOptions().dtype(q.scalar_type()).device(q.device()))
                          .triu(a + 1);
  at::Tensor scores = at::baddbmm(causal.expand({qs.size(0), m, b}), qs, k0.transpose(1, 2));
  if (steps > 1) scores = torch::cat({scores, diag.narrow(0, begin + a, m).permute({1, 0, 2})}, -1);
  at::Tensor probs = at::softmax(scores, -1, AtLeastFloat(q.scalar_type())).to(q.scalar_type());
  if (steps == 1) return at::matmul(probs, v0).transpose(0, 1);
  // One split into the causal block and the diagonal columns, never a
  // slice per column: autograd turns each slice of `probs` into a
  // zero-filled gradient of the whole [heads, m, b + j] tensor and adds
  // them up, which at j = 6 moves ~7 GB per step for a few KB of
  // gradient. The diagonal terms are then summed in the [rows, heads, D]
  // layout the cached values already have (no transposed copies).
  std::vector<at::Tensor> parts = probs.split_with_sizes({b, steps - 1}, -1);
  std::vector<at::Tensor> diag_weights = parts[1].permute({1, 0, 2}).unbind(-1);  // j x [m, heads]
  at::Tensor o = at::matmul(parts[0], v0).transpose(0, 1);
  for (int64_t i = 1; i < steps; ++i) {
    o = o + diag_weights[i - 1].unsqueeze(-1) * cache.values[i].narrow(0, begin + a, m);
  }
  return o;
}

}  // namespace

at::Tensor Eagle3AttentionImpl::forward(const at::Tensor& x, const PackedRope& rope,
                                        TttKvCache* cache) {
  const int64_t total = x.size(0);
  const int64_t n_rep = num_heads_ / num_kv_heads_;
  at::Tensor q = q_proj->forward(x).view({total, num_heads_, head_dim_});
  at::Tensor k = k_proj->forward(x).view({total, num_kv_heads_, head_dim_});
  at::Tensor v = v_proj->forward(x).view({total, num_kv_heads_, head_dim_});
  // The rope tables are this step's (ttt_step.h: position t + j at step j by
  // default); keys cached from earlier steps keep their own rotation.
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  // The softmax scale goes on q ([T, heads, D]) rather than on every score
  // ([heads, T, T] per sample): the same products, one small pass instead
  // of a large one forward and another backward.
  q = rope::Apply(q, rope.cos, rope.sin) * scale;
  k = rope::Apply(k, rope.cos, rope.sin);
  cache->keys.push_back(RepeatKv(k, n_rep));
  cache->values.push_back(RepeatKv(v, n_rep));
  const int64_t steps = static_cast<int64_t>(cache->keys.size());

  // Scores against the keys of steps 1..j at the query's own position:
  // one dot product per (t, head) and earlier step, [T, heads, j].
  at::Tensor diag;
  if (steps > 1) {
    std::vector<at::Tensor> cols;
    cols.reserve(steps - 1);
    for (int64_t i = 1; i < steps; ++i) cols.push_back((q * cache->keys[i]).sum(-1));
    diag = torch::stack(cols, -1);
  }

  std::vector<at::Tensor> outs;
  outs.reserve(rope.cu_seqlens.size());
  for (size_t s = 0; s + 1 < rope.cu_seqlens.size(); ++s) {
    const int64_t begin = rope.cu_seqlens[s];
    const int64_t n = rope.cu_seqlens[s + 1] - begin;
    if (n == 0) continue;
    // Training keeps one [heads, n, n + j] block per sample (its autograd
    // needs the whole of it anyway). Without autograd (the acceptance
    // eval's drafting) the queries go in row chunks, so a long sample's
    // scores stay near SetNoGradAttentionScoreBytes's bound instead of growing with n^2.
    const int64_t rows = at::GradMode::is_enabled() ? n : NoGradQueryRows(num_heads_, n, q.element_size());
    for (int64_t a = 0; a < n; a += rows) {
      outs.push_back(SampleAttention(q, diag, *cache, begin, a, std::min(n, a + rows)));
    }
  }
  at::Tensor attn = torch::cat(outs, 0).reshape({total, num_heads_ * head_dim_});
  return o_proj->forward(attn);
}

void SetNoGradAttentionScoreBytes(int64_t bytes) { g_no_grad_score_bytes.store(std::max<int64_t>(1, bytes)); }

Eagle3MlpImpl::Eagle3MlpImpl(const Eagle3DraftConfig& c) {
  gate_proj = register_module("gate_proj", MakeLinear(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", MakeLinear(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", MakeLinear(c.intermediate_size, c.hidden_size));
}

at::Tensor Eagle3MlpImpl::forward(const at::Tensor& x) {
  return down_proj->forward(torch::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

Eagle3DecoderLayerImpl::Eagle3DecoderLayerImpl(const Eagle3DraftConfig& c) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat);
  // Registration order fixes named_parameters()' order, hence the export's.
  self_attn = register_module("self_attn", Eagle3Attention(c));
  mlp = register_module("mlp", Eagle3Mlp(c));
  input_layernorm =
      register_module("input_layernorm", Eagle3RmsNorm(c.hidden_size, c.rms_norm_eps, opts));
  hidden_norm = register_module("hidden_norm", Eagle3RmsNorm(c.hidden_size, c.rms_norm_eps, opts));
  post_attention_layernorm = register_module("post_attention_layernorm",
                                             Eagle3RmsNorm(c.hidden_size, c.rms_norm_eps, opts));
}

at::Tensor Eagle3DecoderLayerImpl::forward(const at::Tensor& embeds, const at::Tensor& hidden,
                                           const PackedRope& rope, TttKvCache* cache) {
  // SpecForge LlamaDecoderLayer.forward: the embedding half comes first.
  at::Tensor x = torch::cat({input_layernorm->forward(embeds), hidden_norm->forward(hidden)}, -1);
  at::Tensor h = hidden + self_attn->forward(x, rope, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

// ---------------------------------------------------------------------------

Eagle3DraftImpl::Eagle3DraftImpl(const Eagle3DraftOptions& options,
                                 const Eagle3FrozenTensors& frozen)
    : options_(options) {
  const Eagle3DraftConfig& c = options_.config;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat);
  fc = register_module("fc", MakeLinear(c.num_aux * c.target_hidden_size, c.hidden_size));
  if (c.fc_norm) {
    auto list = register_module("fc_norm", torch::nn::ModuleList());
    for (int64_t k = 0; k < c.num_aux; ++k) {
      fc_norms.push_back(Eagle3RmsNorm(c.target_hidden_size, c.rms_norm_eps, opts));
      list->push_back(fc_norms.back());
    }
  }
  midlayer = register_module("midlayer", Eagle3DecoderLayer(c));
  norm = register_module("norm", Eagle3RmsNorm(c.hidden_size, c.rms_norm_eps, opts));
  lm_head = register_module("lm_head", MakeLinear(c.hidden_size, c.draft_vocab_size));

  // Frozen tensors. d2t/t2d come from the vocab map; target_head holds the
  // target lm_head rows i + d2t[i] in draft id order.
  at::Tensor d2t_cpu = torch::tensor(frozen.vocab.d2t, torch::kLong);
  std::vector<uint8_t> t2d_bytes = frozen.vocab.t2d;
  at::Tensor t2d_cpu =
      torch::from_blob(t2d_bytes.data(), {static_cast<int64_t>(t2d_bytes.size())}, torch::kUInt8)
          .to(torch::kBool);
  at::Tensor head = frozen.target_lm_head;
  if (head.size(0) == c.vocab_size && c.vocab_size != c.draft_vocab_size) {
    at::Tensor target_ids = torch::arange(c.draft_vocab_size, torch::kLong) + d2t_cpu;
    head = head.index_select(0, target_ids.to(head.device()));
  }
  TORCH_CHECK(head.size(0) == c.draft_vocab_size, "target head rows: ", head.size(0));
  if (options_.keep_full_target_head && c.vocab_size != c.draft_vocab_size) {
    at::Tensor rest = frozen.target_head_rest;
    if (!rest.defined()) {
      const at::Tensor rest_ids = t2d_cpu.logical_not().nonzero().squeeze(1);
      rest = frozen.target_lm_head.index_select(0, rest_ids.to(frozen.target_lm_head.device()));
    }
    target_head_rest = register_buffer(
        "target_head_rest", rest.to(options_.device, options_.target_head_dtype, false, true));
  }
  target_head = register_buffer("target_head",
                                head.to(options_.device, options_.target_head_dtype, false, true));
  target_head_16bit_ = LosslessIn16Bit(target_head, options_);
  embed_tokens = register_buffer("embed_tokens", frozen.embed_tokens.to(options_.device));
  d2t = register_buffer("d2t", d2t_cpu.to(options_.device));
  t2d = register_buffer("t2d", t2d_cpu.to(options_.device));

  // Deterministic initialisation: drawn on the CPU from a private
  // generator in registration order, then moved, so every rank and every
  // device gets the same bits from the same seed.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed);
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters(/*recurse=*/true)) {
    at::Tensor& p = item.value();
    const std::string& name = item.key();
    at::Tensor init;
    if (absl::EndsWith(name, "norm.weight")) {
      init = torch::ones(p.sizes(), torch::kFloat);
    } else {
      init = torch::empty(p.sizes(), torch::kFloat).normal_(0.0, kInitStd, gen);
    }
    if (name == "lm_head.weight" && options_.init_lm_head_from_target) init = target_head;
    // Always a fresh copy: a parameter sharing storage with the frozen
    // target head would let optimizer steps and loads overwrite it.
    p.set_data(init.to(options_.device, options_.dtype, /*non_blocking=*/false, /*copy=*/true));
  }

  rope_freqs_ = rope::ComputeInvFrequencies(c.rope, c.rotary_dim());
  rope_freqs_.inv_freq = rope_freqs_.inv_freq.to(options_.device);
  t2d_host_ = frozen.vocab.t2d;

  auto flat = FlatParameters::Create(ExportedParameters());
  TORCH_CHECK(flat.ok(), "flattening the draft's parameters: ", std::string(flat.status().message()));
  flat_ = std::make_shared<FlatParameters>(std::move(flat).value());
}

at::Tensor Eagle3DraftImpl::ProjectAux(const at::Tensor& aux_hidden) {
  at::Tensor x = aux_hidden.to(options_.device, options_.dtype);
  if (!fc_norms.empty()) {
    const int64_t width = options_.config.target_hidden_size;
    std::vector<at::Tensor> normed;
    for (size_t k = 0; k < fc_norms.size(); ++k) {
      normed.push_back(fc_norms[k]->forward(x.narrow(-1, static_cast<int64_t>(k) * width, width)));
    }
    x = torch::cat(normed, -1);
  }
  return fc->forward(x);
}

at::Tensor Eagle3DraftImpl::Embed(const at::Tensor& ids) {
  // The embeddings are frozen: no autograd graph through them.
  torch::NoGradGuard no_grad;
  return embed_tokens.index_select(0, ids.to(options_.device, torch::kLong)).to(options_.dtype);
}

at::Tensor Eagle3DraftImpl::Step(const at::Tensor& embeds, const at::Tensor& hidden,
                                 const PackedRope& rope, TttKvCache* cache) {
  return midlayer->forward(embeds, hidden, rope, cache);
}

Eagle3DraftImpl::HeadOutput Eagle3DraftImpl::Head(const at::Tensor& out) {
  const at::Tensor normed = norm->forward(out);
  return {lm_head->forward(normed), options_.config.norm_output ? normed : out};
}

bool Eagle3DraftImpl::UsesFloatOutMm(const at::Tensor& last_hidden) const {
  return target_head_16bit_.defined() && last_hidden.scalar_type() == options_.dtype && last_hidden.dim() == 2;
}

at::Tensor Eagle3DraftImpl::TargetLogits(const at::Tensor& last_hidden) {
  torch::NoGradGuard no_grad;
  const at::ScalarType t = AtLeastFloat(options_.dtype);
  // fp32 output and accumulation of exact products. 16-bit hidden states
  // and head rows multiply as they are, with an fp32 result, on the 16-bit
  // tensor cores: twice TF32's rate, the same products.
  if (UsesFloatOutMm(last_hidden)) {
    return compat::MmFloatOut(last_hidden.to(options_.device), target_head_16bit_.t());
  }
  // Otherwise on TF32 tensor cores: bf16 values fit TF32's 10-bit mantissa
  // exactly, so this is the fp32 product at tensor core speed (an fp32
  // CUDA-core GEMM here would take a large share of the step). Inputs
  // with more bits than that lose them, as any TF32 product.
  compat::ScopedTf32Matmul tf32;
  return at::matmul(last_hidden.to(options_.device, t), target_head.to(t).t());
}

at::Tensor Eagle3DraftImpl::TargetDraftLogMass(const at::Tensor& last_hidden,
                                               const at::Tensor& draft_lse) {
  torch::NoGradGuard no_grad;
  if (options_.config.vocab_size == options_.config.draft_vocab_size) return at::zeros_like(draft_lse);
  TORCH_CHECK(target_head_rest.defined(),
              "the target's mass on the draft vocab needs the full target head "
              "(Eagle3DraftOptions::keep_full_target_head)");
  const at::ScalarType t = AtLeastFloat(options_.dtype);
  compat::ScopedTf32Matmul tf32;  // bf16 values in fp32: exact, see TargetLogits
  const at::Tensor h = last_hidden.to(options_.device, t);
  const at::Tensor rest = target_head_rest.to(t);
  // Rows at a time, so the [rows, V - N] scores stay near 1 GiB at any T.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 28) / std::max<int64_t>(1, rest.size(0)));
  std::vector<at::Tensor> rest_lse;
  for (int64_t begin = 0; begin < h.size(0); begin += chunk) {
    const int64_t n = std::min(chunk, h.size(0) - begin);
    rest_lse.push_back(at::logsumexp(at::matmul(h.narrow(0, begin, n), rest.t()), -1));
  }
  const at::Tensor d = draft_lse.to(t);
  return d - at::logaddexp(d, at::cat(rest_lse));
}

PackedRope Eagle3DraftImpl::MakePackedRope(const std::vector<int64_t>& cu_seqlens, int64_t offset) {
  PackedRope out;
  out.cu_seqlens = cu_seqlens;
  const int64_t total = cu_seqlens.empty() ? 0 : cu_seqlens.back();
  std::vector<int64_t> positions(static_cast<size_t>(total));
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    for (int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t) positions[t] = t - cu_seqlens[s] + offset;
  }
  std::tie(out.cos, out.sin) = RopeTables(torch::tensor(positions, torch::kLong).to(options_.device));
  return out;
}

std::pair<at::Tensor, at::Tensor> Eagle3DraftImpl::RopeTables(const at::Tensor& positions) {
  return rope::CosSin(rope_freqs_, positions, options_.dtype);
}

std::vector<std::pair<std::string, at::Tensor>> Eagle3DraftImpl::ExportedParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : named_parameters(/*recurse=*/true))
    out.emplace_back(item.key(), item.value());
  return out;
}

absl::StatusOr<Eagle3Draft> CreateEagle3Draft(const Eagle3DraftOptions& options,
                                              const Eagle3FrozenTensors& frozen) {
  const Eagle3DraftConfig& c = options.config;
  E3_RETURN_IF_ERROR(c.Validate());
  E3_RETURN_IF_ERROR(ValidateVocabMap(frozen.vocab, "draft vocab map"));
  if (frozen.vocab.target_vocab_size != c.vocab_size ||
      frozen.vocab.draft_vocab_size() != c.draft_vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft vocab map: maps ", frozen.vocab.draft_vocab_size(), " of ",
        frozen.vocab.target_vocab_size, " target ids, but the config has draft_vocab_size ",
        c.draft_vocab_size, " and vocab_size ", c.vocab_size));
  }
  const at::Tensor& embed = frozen.embed_tokens;
  if (!embed.defined() || embed.dim() != 2 || embed.size(0) != c.vocab_size ||
      embed.size(1) != c.target_hidden_size || !embed.is_floating_point()) {
    return absl::InvalidArgumentError(absl::StrCat("frozen embed_tokens: expected a float tensor [",
                                                   c.vocab_size, ", ", c.target_hidden_size,
                                                   "], got ", ShapeString(embed)));
  }
  const at::Tensor& head = frozen.target_lm_head;
  if (!head.defined() || head.dim() != 2 || head.size(1) != c.target_hidden_size ||
      !head.is_floating_point() ||
      (head.size(0) != c.vocab_size && head.size(0) != c.draft_vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frozen target lm_head: expected a float tensor [", c.vocab_size, " or ",
                     c.draft_vocab_size, ", ", c.target_hidden_size, "], got ", ShapeString(head)));
  }
  if (options.keep_full_target_head && c.vocab_size != c.draft_vocab_size) {
    const at::Tensor& rest = frozen.target_head_rest;
    const int64_t rest_rows = c.vocab_size - c.draft_vocab_size;
    if (rest.defined() && (rest.dim() != 2 || rest.size(0) != rest_rows ||
                           rest.size(1) != c.target_hidden_size || !rest.is_floating_point())) {
      return absl::InvalidArgumentError(absl::StrCat("frozen target_head_rest: expected a float tensor [",
                                                     rest_rows, ", ", c.target_hidden_size, "], got ",
                                                     ShapeString(rest)));
    }
    if (!rest.defined() && head.size(0) != c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "frozen target lm_head: keep_full_target_head (the LK losses) needs all ", c.vocab_size,
          " rows or target_head_rest, got ", ShapeString(head)));
    }
  }
  if (!at::isFloatingType(options.dtype) || !at::isFloatingType(options.target_head_dtype)) {
    return absl::InvalidArgumentError(
        "EAGLE-3 draft options: dtype and target_head_dtype must be floating types");
  }
  try {
    return Eagle3Draft(options, frozen);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("creating the EAGLE-3 draft: ", e.what_without_backtrace()));
  }
}

}  // namespace e3
