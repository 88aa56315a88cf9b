#include "student_trainer/draft/dflash_draft.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "student_trainer/ops/dflash_head_loss.h"
#include "student_trainer/ops/rms_norm.h"

namespace e3 {
namespace {

constexpr double kDFlashInitStd = 0.02;  // transformers' Qwen3 initializer_range

// transformers' Qwen3RMSNorm: statistics in (at least) fp32, the weight
// applied after the cast back to x's dtype.
at::Tensor Qwen3RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(compute);
  const at::Tensor normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

torch::nn::Linear DFlashLinear(torch::nn::Module& owner, const std::string& name, int64_t in, int64_t out,
                             const torch::TensorOptions& options) {
  auto linear = torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  linear->to(options.device(), options.dtype().toScalarType());
  return owner.register_module(name, linear);
}

// An RMSNorm's weight as `<name>.weight` of `owner`, starting at one.
at::Tensor DFlashNormWeight(torch::nn::Module& owner, const std::string& name, int64_t size,
                      const torch::TensorOptions& options) {
  auto norm = owner.register_module(name, std::make_shared<torch::nn::Module>());
  return norm->register_parameter("weight", torch::ones({size}, options));
}

}  // namespace

absl::Status DFlashDraftConfig::Validate() const {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("DFlash draft: ", what)); };
  if (hidden_size <= 0 || intermediate_size <= 0 || num_layers <= 0) {
    return bad("hidden_size, intermediate_size and num_layers must be positive");
  }
  if (num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    return bad(absl::StrCat("num_key_value_heads ", num_kv_heads, " must divide num_attention_heads ", num_heads));
  }
  if (head_dim <= 0 || head_dim % 2 != 0) return bad(absl::StrCat("head_dim ", head_dim, ": expected a positive even number"));
  if (block_size < 2) return bad(absl::StrCat("block_size ", block_size, ": a block needs its anchor and a drafted row"));
  if (vocab_size <= 0) return bad("vocab_size must be positive");
  if (mask_token_id < 0 || mask_token_id >= vocab_size) {
    return bad(absl::StrCat("mask_token_id ", mask_token_id, " lies outside the target's embedding [0, ", vocab_size,
                            ")"));
  }
  if (target_layer_ids.empty()) return bad("target_layer_ids is empty: the context needs at least one layer");
  return absl::OkStatus();
}

DFlashDraftImpl::DFlashDraftImpl(const DFlashDraftConfig& config, const torch::TensorOptions& options,
                                 uint64_t seed, const DFlashFrozenTensors& frozen)
    : config_(config) {
  if (frozen.embed_tokens.defined()) {
    embed_tokens = register_buffer("embed_tokens", frozen.embed_tokens.to(options.device(), options.dtype()));
  }
  if (frozen.lm_head.defined()) lm_head = register_buffer("lm_head", frozen.lm_head.to(options.device(), options.dtype()));
  const DFlashDraftConfig& c = config_;
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t k = static_cast<int64_t>(c.target_layer_ids.size());
  fc = DFlashLinear(*this, "fc", k * H, H, options);
  hidden_norm = DFlashNormWeight(*this, "hidden_norm", H, options);
  auto stack = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto block = stack->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
    Layer l;
    l.input_layernorm = DFlashNormWeight(*block, "input_layernorm", H, options);
    l.post_attention_layernorm = DFlashNormWeight(*block, "post_attention_layernorm", H, options);
    auto attn = block->register_module("self_attn", std::make_shared<torch::nn::Module>());
    l.q_proj = DFlashLinear(*attn, "q_proj", H, c.num_heads * D, options);
    l.k_proj = DFlashLinear(*attn, "k_proj", H, c.num_kv_heads * D, options);
    l.v_proj = DFlashLinear(*attn, "v_proj", H, c.num_kv_heads * D, options);
    l.o_proj = DFlashLinear(*attn, "o_proj", c.num_heads * D, H, options);
    l.q_norm = DFlashNormWeight(*attn, "q_norm", D, options);
    l.k_norm = DFlashNormWeight(*attn, "k_norm", D, options);
    auto mlp = block->register_module("mlp", std::make_shared<torch::nn::Module>());
    l.gate_proj = DFlashLinear(*mlp, "gate_proj", H, c.intermediate_size, options);
    l.up_proj = DFlashLinear(*mlp, "up_proj", H, c.intermediate_size, options);
    l.down_proj = DFlashLinear(*mlp, "down_proj", c.intermediate_size, H, options);
    layers.push_back(std::move(l));
  }
  norm = DFlashNormWeight(*this, "norm", H, options);
  rope_freqs_ = rope::ComputeInvFrequencies(c.rope, D);
  rope_freqs_.inv_freq = rope_freqs_.inv_freq.to(options.device());

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : ExportedParameters()) {
    if (name.find("norm") != std::string::npos) continue;
    const at::Tensor init = torch::empty(p.sizes(), torch::kFloat).normal_(0.0, kDFlashInitStd, gen);
    p.set_data(init.to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true));
  }
  auto flat = FlatParameters::Create(ExportedParameters());
  TORCH_CHECK(flat.ok(), "flattening the DFlash draft's parameters: ", std::string(flat.status().message()));
  flat_ = std::make_shared<FlatParameters>(std::move(flat).value());
}

std::vector<std::pair<std::string, at::Tensor>> DFlashDraftImpl::ExportedParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

at::Tensor DFlashDraftImpl::Norm(const at::Tensor& x, const at::Tensor& weight) const {
  if (kernels_ == DFlashKernels::kFast) return ops::RmsNormTrainable(x, weight, config_.rms_norm_eps);
  return Qwen3RmsNorm(x, weight, config_.rms_norm_eps);
}

at::Tensor DFlashDraftImpl::ProjectContext(const at::Tensor& target_hidden) { return Norm(fc(target_hidden), hidden_norm); }

at::Tensor DFlashDraftImpl::AttentionMask(const DFlashBlocks& blocks, int64_t context_rows) const {
  const int64_t B = config_.block_size;
  const int64_t n = static_cast<int64_t>(blocks.anchor_rows.size());
  at::Tensor allow = torch::zeros({n * B, context_rows + n * B}, torch::kBool);
  size_t s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t anchor = blocks.anchor_rows[i];
    while (s + 1 < blocks.cu_seqlens.size() && anchor >= blocks.cu_seqlens[s + 1]) ++s;
    const int64_t start = blocks.cu_seqlens[s];
    // Context rows of its own sample strictly before the anchor: the target
    // has not run the anchor token yet when the block is drafted.
    if (anchor > start) allow.narrow(0, i * B, B).narrow(1, start, anchor - start).fill_(true);
    allow.narrow(0, i * B, B).narrow(1, context_rows + i * B, B).fill_(true);
  }
  return allow;
}

std::pair<at::Tensor, at::Tensor> DFlashDraftImpl::Positions(const DFlashBlocks& blocks,
                                                             int64_t context_rows) const {
  const int64_t B = config_.block_size;
  std::vector<int64_t> ctx(static_cast<size_t>(context_rows));
  for (size_t s = 0; s + 1 < blocks.cu_seqlens.size(); ++s) {
    for (int64_t r = blocks.cu_seqlens[s]; r < blocks.cu_seqlens[s + 1]; ++r) ctx[r] = r - blocks.cu_seqlens[s];
  }
  std::vector<int64_t> block;
  for (int64_t anchor : blocks.anchor_rows) {
    for (int64_t k = 0; k < B; ++k) block.push_back(ctx[anchor] + k);
  }
  return {torch::tensor(ctx, torch::kLong), torch::tensor(block, torch::kLong)};
}

DFlashDraftImpl::AttentionLayout DFlashDraftImpl::Layout(const DFlashBlocks& blocks, int64_t context_rows,
                                                         const at::Device& device) const {
  AttentionLayout layout;
  if (kernels_ == DFlashKernels::kReference) {
    layout.allow = AttentionMask(blocks, context_rows).to(device);
    return layout;
  }
  ops::DFlashAttentionBlocks ranges;
  ranges.block_size = config_.block_size;
  ranges.context_rows = context_rows;
  size_t s = 0;
  for (int64_t anchor : blocks.anchor_rows) {
    while (s + 1 < blocks.cu_seqlens.size() && anchor >= blocks.cu_seqlens[s + 1]) ++s;
    ranges.context_begin.push_back(blocks.cu_seqlens[s]);
    ranges.context_end.push_back(anchor);
  }
  layout.plan = ops::PlanDFlashAttention(ranges, config_.num_heads, device);
  return layout;
}

at::Tensor DFlashDraftImpl::Attend(const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx,
                                   const at::Tensor& k_blk, const at::Tensor& v_blk,
                                   const AttentionLayout& layout) const {
  const DFlashDraftConfig& c = config_;
  const int64_t rows = q.size(0), D = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  if (layout.plan) {
    return ops::DFlashBlockAttention(q, k_ctx, v_ctx, k_blk, v_blk, layout.plan, scale).reshape({rows, c.num_heads * D});
  }
  const int64_t group = c.num_heads / c.num_kv_heads;
  const at::Tensor kh = torch::cat({k_ctx, k_blk}, 0).repeat_interleave(group, 1).transpose(0, 1);  // [heads, keys, D]
  const at::Tensor vh = torch::cat({v_ctx, v_blk}, 0).repeat_interleave(group, 1).transpose(0, 1);
  const at::ScalarType compute = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor scores = torch::matmul(q.transpose(0, 1).to(compute), kh.to(compute).transpose(1, 2)) /
                      std::sqrt(static_cast<double>(D));
  scores = scores.masked_fill(layout.allow.logical_not().unsqueeze(0), -std::numeric_limits<double>::infinity());
  const at::Tensor probs = torch::softmax(scores, -1).to(q.scalar_type());
  return torch::matmul(probs, vh).transpose(0, 1).reshape({rows, c.num_heads * D});
}

at::Tensor DFlashDraftImpl::LayerForward(Layer& l, const at::Tensor& x, const at::Tensor& context,
                                         const AttentionLayout& layout,
                                         const std::pair<at::Tensor, at::Tensor>& ctx_rope,
                                         const std::pair<at::Tensor, at::Tensor>& block_rope) {
  const DFlashDraftConfig& c = config_;
  const int64_t D = c.head_dim, rows = x.size(0), ctx_rows = context.size(0);
  const at::Tensor h = Norm(x, l.input_layernorm);
  at::Tensor q = Norm(l.q_proj->forward(h).view({rows, c.num_heads, D}), l.q_norm);
  q = rope::Apply(q, block_rope.first, block_rope.second);
  // The context rows are keys and values of every layer, through each
  // layer's own projections; they are not normalised again.
  at::Tensor k_ctx = Norm(l.k_proj->forward(context).view({ctx_rows, c.num_kv_heads, D}), l.k_norm);
  at::Tensor k_blk = Norm(l.k_proj->forward(h).view({rows, c.num_kv_heads, D}), l.k_norm);
  k_ctx = rope::Apply(k_ctx, ctx_rope.first, ctx_rope.second);
  k_blk = rope::Apply(k_blk, block_rope.first, block_rope.second);
  const at::Tensor v_ctx = l.v_proj->forward(context).view({ctx_rows, c.num_kv_heads, D});
  const at::Tensor v_blk = l.v_proj->forward(h).view({rows, c.num_kv_heads, D});
  const at::Tensor attn = Attend(q, k_ctx, v_ctx, k_blk, v_blk, layout);
  const at::Tensor mid = x + l.o_proj->forward(attn);
  const at::Tensor m = Norm(mid, l.post_attention_layernorm);
  return mid + l.down_proj->forward(torch::silu(l.gate_proj->forward(m)) * l.up_proj->forward(m));
}

at::Tensor DFlashDraftImpl::Forward(const at::Tensor& block_embeds, const at::Tensor& context,
                                    const DFlashBlocks& blocks) {
  const int64_t ctx_rows = context.size(0);
  const AttentionLayout layout = Layout(blocks, ctx_rows, block_embeds.device());
  const auto [ctx_pos, block_pos] = Positions(blocks, ctx_rows);
  const at::ScalarType dtype = block_embeds.scalar_type();
  const auto ctx_rope = rope::CosSin(rope_freqs_, ctx_pos.to(block_embeds.device()), dtype);
  const auto block_rope = rope::CosSin(rope_freqs_, block_pos.to(block_embeds.device()), dtype);
  at::Tensor x = block_embeds;
  for (Layer& l : layers) x = LayerForward(l, x, context, layout, ctx_rope, block_rope);
  return Norm(x, norm);
}

at::Tensor DFlashDraftImpl::Logits(const at::Tensor& hidden) const {
  TORCH_CHECK(lm_head.defined(), "the DFlash draft was built without the target's head");
  return torch::matmul(hidden, lm_head.t());
}

absl::StatusOr<at::Tensor> DFlashDraftImpl::ProposeChains(const EvalBatch& batch, int64_t length) {
  if (length < 1) return absl::InvalidArgumentError("chain length must be at least 1");
  if (!embed_tokens.defined() || !lm_head.defined()) {
    return absl::FailedPreconditionError("the DFlash draft was built without the target's embedding and head");
  }
  const int64_t B = config_.block_size, T = batch.tokens();
  at::Tensor chains = torch::full({T, length}, -1, torch::kLong);
  const at::Tensor ids_tensor = batch.input_ids.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* ids = ids_tensor.data_ptr<int64_t>();
  // A round from row t anchors at the token of row t + 1, in its sample.
  std::vector<int64_t> anchors;
  for (size_t s = 0; s + 1 < batch.cu_seqlens.size(); ++s) {
    for (int64_t t = batch.cu_seqlens[s]; t + 1 < batch.cu_seqlens[s + 1]; ++t) anchors.push_back(t + 1);
  }
  const int64_t take = std::min(length, B - 1);
  try {
    torch::NoGradGuard no_grad;
    const at::ScalarType dtype = norm.scalar_type();
    const at::Tensor context = ProjectContext(batch.aux_hidden.to(device(), dtype));
    // Anchors in chunks, so the materialised mask stays small.
    constexpr size_t kAnchorsPerChunk = 64;
    for (size_t first = 0; first < anchors.size(); first += kAnchorsPerChunk) {
      DFlashBlocks blocks;
      blocks.cu_seqlens = batch.cu_seqlens;
      blocks.anchor_rows.assign(anchors.begin() + first, anchors.begin() + std::min(anchors.size(), first + kAnchorsPerChunk));
      std::vector<int64_t> tokens;
      for (int64_t a : blocks.anchor_rows) {
        tokens.push_back(ids[a]);
        for (int64_t k = 1; k < B; ++k) tokens.push_back(config_.mask_token_id);
      }
      const at::Tensor embeds = embed_tokens.index_select(0, torch::tensor(tokens, torch::kLong).to(device()));
      const at::Tensor hidden = Forward(embeds, context, blocks);
      const int64_t n = static_cast<int64_t>(blocks.anchor_rows.size());
      const at::Tensor drafted = Logits(hidden).argmax(-1).view({n, B}).narrow(1, 1, take).to(at::kCPU);
      const at::Tensor rows = torch::tensor(blocks.anchor_rows, torch::kLong) - 1;
      chains.index_put_({rows, torch::indexing::Slice(0, take)}, drafted);
    }
    return chains;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("drafting the DFlash blocks: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<DFlashDraft> CreateDFlashDraft(const DFlashDraftConfig& config, const torch::TensorOptions& options,
                                              uint64_t seed, const DFlashFrozenTensors& frozen) {
  if (absl::Status valid = config.Validate(); !valid.ok()) return valid;
  for (const at::Tensor* t : {&frozen.embed_tokens, &frozen.lm_head}) {
    if (t->defined() && (t->dim() != 2 || t->size(0) != config.vocab_size || t->size(1) != config.hidden_size)) {
      return absl::InvalidArgumentError(absl::StrCat("DFlash draft: the target's embedding and head must be [",
                                                     config.vocab_size, ", ", config.hidden_size, "], got ",
                                                     c10::str(t->sizes())));
    }
  }
  try {
    return DFlashDraft(config, options, seed, frozen);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("building the DFlash draft: ", e.what_without_backtrace()));
  }
}

at::Tensor DFlashRowNll(const at::Tensor& logits, const at::Tensor& labels) {
  const at::ScalarType compute = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor log_q = torch::log_softmax(logits.to(compute), -1);
  return -log_q.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1);
}

at::Tensor DFlashWeightedLoss(const at::Tensor& row_nll, const at::Tensor& labels, int64_t block_size, double gamma) {
  ops::DFlashHeadLossOptions o;
  o.block_size = block_size;
  o.gamma = gamma;
  return (row_nll * ops::DFlashRowWeights(row_nll, labels, o)).sum();
}

at::Tensor DFlashDPaceLoss(const at::Tensor& row_loss, const at::Tensor& labels, int64_t block_size, double alpha) {
  ops::DFlashHeadLossOptions o;
  o.block_size = block_size;
  o.weighting = ops::DFlashWeighting::kDPace;
  o.alpha = alpha;
  return (row_loss * ops::DFlashRowWeights(row_loss, labels, o)).sum();
}

at::Tensor DFlashRowSoftCe(const at::Tensor& logits, const at::Tensor& target_hidden, const at::Tensor& target_head,
                           int64_t chunk_rows) {
  const at::ScalarType compute = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor head = target_head.to(compute);
  std::vector<at::Tensor> rows;
  for (int64_t begin = 0; begin < logits.size(0); begin += chunk_rows) {
    const int64_t n = std::min(chunk_rows, logits.size(0) - begin);
    at::Tensor p;
    {
      torch::NoGradGuard no_grad;
      p = torch::softmax(at::matmul(target_hidden.narrow(0, begin, n).to(compute), head.t()), -1);
    }
    const at::Tensor log_q = torch::log_softmax(logits.narrow(0, begin, n).to(compute), -1);
    rows.push_back(-(p * log_q).sum(-1));
  }
  return rows.empty() ? torch::zeros({0}, logits.options().dtype(compute)) : torch::cat(rows);
}

at::Tensor DFlashBlockLoss(const at::Tensor& logits, const at::Tensor& labels, int64_t block_size, double gamma) {
  return DFlashWeightedLoss(DFlashRowNll(logits, labels), labels, block_size, gamma);
}

}  // namespace e3
