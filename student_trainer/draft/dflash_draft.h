// The DFlash block draft (https://arxiv.org/abs/2602.06036) as LibTorch
// modules, in the layout SGLang's and vLLM's DFlash loaders read
// (DFlashDraftModel, Qwen3 layers):
//
//   fc, hidden_norm: the captured target layers' states, concatenated
//            [T, k * H], projected to H and normalised once: the context;
//   layers:  Qwen3 decoder layers (q/k norms on each head) whose queries
//            are the block's rows and whose keys and values are the
//            context rows before the anchor, then the block's own rows,
//            each layer projecting the same context with its k/v_proj;
//   norm:    the final RMSNorm; the logits are the target's lm_head of it.
//
// The draft has no embedding or head of its own: a block is the target's
// embedding of [anchor, MASK x (B - 1)], and the target's head reads it.
//
// A packed batch holds several samples; a block sees only its own
// sample's context rows strictly before its anchor, and every row of its
// own block (bidirectional). Position ids restart per sample: context row
// t sits at t, block row k of an anchor at position a at a + k.
//
// Two ways to run it (DFlashKernels): the plain formulation (one softmax
// over every context and block row with a materialised [rows, T + rows]
// mask, ATen norms), the reference the other is checked against; and the
// fast one (the default): ops/dflash_block_attention.h's attention, which
// never builds that mask and keeps memory linear in the tokens, and the
// fused RMSNorm kernels of ops/rms_norm.h on the GPU.
#ifndef E3_STUDENT_TRAINER_DRAFT_DFLASH_DRAFT_H_
#define E3_STUDENT_TRAINER_DRAFT_DFLASH_DRAFT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/target_identity.h"
#include "common/torch/rope.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/draft_model.h"
#include "student_trainer/draft/flat_parameters.h"
#include "student_trainer/ops/dflash_block_attention.h"

namespace e3 {

struct DFlashDraftConfig {
  int64_t hidden_size = 0;  // the target's H: context and block rows
  int64_t intermediate_size = 0;
  int64_t num_layers = 5;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  int64_t vocab_size = 0;   // the target's, whose embedding and head the draft uses
  int64_t block_size = 16;  // B: the anchor and B - 1 drafted tokens
  int64_t mask_token_id = -1;
  // The target layers whose outputs form the context ("output of decoder
  // layer i", the loaders' numbering too), k of them, in this order.
  std::vector<int32_t> target_layer_ids;
  int64_t num_target_layers = 0;        // L of the target
  int64_t max_position_embeddings = 0;  // the target's
  // The model the draft is trained for (empty when not known).
  TargetIdentity target;

  // InvalidArgument naming the first field that is missing or
  // inconsistent: a mask token outside the embedding, heads that do not
  // divide, a block of fewer than two rows.
  absl::Status Validate() const;
};

// The blocks of one packed batch, one per anchor.
struct DFlashBlocks {
  std::vector<int64_t> anchor_rows;  // each anchor's packed row, ascending
  std::vector<int64_t> cu_seqlens;   // the packed samples' boundaries, [0, ..., T]
};

// The target's tensors the draft reads and never trains: its input
// embedding (the block rows) and its full lm_head (the logits), [V, H].
struct DFlashFrozenTensors {
  at::Tensor embed_tokens;
  at::Tensor lm_head;
};

enum class DFlashKernels {
  kReference,  // the plain formulation (student_kernels: reference)
  kFast,       // ops::DFlashBlockAttention and ops::RmsNormTrainable (student_kernels: fast)
};

class DFlashDraftImpl : public DraftModel {
 public:
  // Throws c10::Error on an invalid config; CreateDFlashDraft checks first.
  // Projections are drawn from `seed` in fp32 on the CPU (normal, std 0.02,
  // as transformers initialises Qwen3), so equal seeds give bit-equal
  // weights on any device; norms start at one.
  DFlashDraftImpl(const DFlashDraftConfig& config, const torch::TensorOptions& options, uint64_t seed,
                  const DFlashFrozenTensors& frozen = {});

  const DFlashDraftConfig& config() const { return config_; }
  void set_kernels(DFlashKernels kernels) { kernels_ = kernels; }
  // DraftModel. The parameters carry the names the loaders read, in
  // registration order.
  std::vector<std::pair<std::string, at::Tensor>> ExportedParameters() const override;
  FlatParameters& flat() override { return *flat_; }
  const FlatParameters& flat() const override { return *flat_; }
  at::Device device() const override { return norm.device(); }
  const at::Tensor& target_embed_tokens() const override { return embed_tokens; }
  const at::Tensor& target_lm_head() const override { return lm_head; }
  // The layout of dflash_export.h; loading checks the config first.
  absl::Status Export(const std::string& dir, const DraftExportOptions& options) const override;
  absl::Status LoadExport(const std::string& dir, OtherTarget other_target) override;
  // A serving round from each row t: the anchor is the token at t + 1 and
  // the context the rows up to t; the block's rows 1..B-1 propose the
  // tokens at t + 2 .. t + B ([T, length] int64 on the host; positions
  // past B - 1, and rows at a sample's end, hold -1, which never matches).
  absl::StatusOr<at::Tensor> ProposeChains(const EvalBatch& batch, int64_t length) override;
  // The target's logits of draft hidden states [rows, H] -> [rows, V].
  at::Tensor Logits(const at::Tensor& hidden) const;

  at::Tensor embed_tokens, lm_head;  // DFlashFrozenTensors, buffers

  // [T, k * H] captured states -> [T, H] context.
  at::Tensor ProjectContext(const at::Tensor& target_hidden);
  // The blocks' rows through every layer and the final norm: block_embeds
  // [nB * B, H] (the target's embedding of each block's tokens, block by
  // block), context [T, H] (ProjectContext) -> [nB * B, H].
  at::Tensor Forward(const at::Tensor& block_embeds, const at::Tensor& context, const DFlashBlocks& blocks);
  // The allow-mask of Forward's attention, [nB * B, T + nB * B] bool: block
  // rows against context rows, then against block rows.
  at::Tensor AttentionMask(const DFlashBlocks& blocks, int64_t context_rows) const;
  // Rope positions of the context rows [T] and the block rows [nB * B].
  std::pair<at::Tensor, at::Tensor> Positions(const DFlashBlocks& blocks, int64_t context_rows) const;

  torch::nn::Linear fc{nullptr};
  at::Tensor hidden_norm;  // [H]
  struct Layer {
    at::Tensor input_layernorm, post_attention_layernorm;  // [H]
    torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
    at::Tensor q_norm, k_norm;  // [head_dim]
    torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  };
  std::vector<Layer> layers;
  at::Tensor norm;  // [H]

 private:
  // Qwen3's RMSNorm of x's last dimension, through the kernels chosen.
  at::Tensor Norm(const at::Tensor& x, const at::Tensor& weight) const;
  // What every layer's attention shares within one Forward: the dense
  // mask, or the chunk plan.
  struct AttentionLayout {
    at::Tensor allow;
    std::shared_ptr<const ops::DFlashAttentionPlan> plan;
  };
  AttentionLayout Layout(const DFlashBlocks& blocks, int64_t context_rows, const at::Device& device) const;
  // Attention of the block rows' queries [rows, Hq, D] over the context's
  // and the block rows' keys and values ([T | rows, Hkv, D]) -> [rows, Hq * D].
  at::Tensor Attend(const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx, const at::Tensor& k_blk,
                    const at::Tensor& v_blk, const AttentionLayout& layout) const;
  at::Tensor LayerForward(Layer& layer, const at::Tensor& x, const at::Tensor& context, const AttentionLayout& layout,
                          const std::pair<at::Tensor, at::Tensor>& ctx_rope,
                          const std::pair<at::Tensor, at::Tensor>& block_rope);

  DFlashDraftConfig config_;
  DFlashKernels kernels_ = DFlashKernels::kFast;
  rope::InvFrequencies rope_freqs_;
  std::shared_ptr<FlatParameters> flat_;
};
TORCH_MODULE(DFlashDraft);

// Validates the config, then builds the draft with weights drawn from
// `seed` (equal seeds give bit-equal weights).
absl::StatusOr<DFlashDraft> CreateDFlashDraft(const DFlashDraftConfig& config, const torch::TensorOptions& options,
                                              uint64_t seed, const DFlashFrozenTensors& frozen = {});

// Each row's cross-entropy against its label, [nB * B] in at least fp32
// (a negative label's row holds its label-0 term, which the loss weighs
// zero). logits [nB * B, V] in any float dtype, labels [nB * B] int64.
at::Tensor DFlashRowNll(const at::Tensor& logits, const at::Tensor& labels);
// The block loss of those rows: drafted row k = 1..B-1 of a block weighs
// exp(-(k - 1) / gamma); rows whose label is negative (past the sample's
// end, or not supervised) and the anchor rows count for nothing. The sum
// over rows divided by the rows' weights.
at::Tensor DFlashWeightedLoss(const at::Tensor& row_nll, const at::Tensor& labels, int64_t block_size, double gamma);
// D-PACE (SpecForge's "dpace" loss): row k of a block weighs
//   W_k = sum over supervised rows i >= k of prod over supervised m <= i
//         of ((1 - alpha) q_m + alpha),
// q_m = exp(-row_loss_m), the draft's probability of row m's label: the
// rows' share in the expected accepted length, detached (no gradient
// flows through the weights). The sum of W_k * row_loss_k over supervised
// rows, divided by the number of blocks.
at::Tensor DFlashDPaceLoss(const at::Tensor& row_loss, const at::Tensor& labels, int64_t block_size, double alpha);
// Each row's cross-entropy against the target's distribution (knowledge
// distillation): -sum_v p(v) log q(v), with p = softmax(target_head @ h)
// for the target's last hidden state h of the row that predicts the
// row's token, computed `chunk_rows` rows at a time in at least fp32.
// logits [R, V]; target_hidden [R, H] (a row whose label is negative may
// hold anything: the loss weighs it zero); target_head [V, H].
at::Tensor DFlashRowSoftCe(const at::Tensor& logits, const at::Tensor& target_hidden, const at::Tensor& target_head,
                           int64_t chunk_rows = 1024);
// Both, from the logits.
at::Tensor DFlashBlockLoss(const at::Tensor& logits, const at::Tensor& labels, int64_t block_size, double gamma);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_DRAFT_DFLASH_DRAFT_H_
