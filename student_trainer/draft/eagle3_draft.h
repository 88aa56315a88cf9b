// The EAGLE-3 draft model (https://arxiv.org/abs/2503.01840) as LibTorch
// modules, in the layout SpecForge trains and SGLang/vLLM load
// (specforge/modeling/draft/llama3_eagle.py, LlamaForCausalLMEagle3):
//
//   fc:       [3 * H_target] -> H, applied once to the concatenated aux states
//   midlayer: one Llama decoder layer whose q/k/v read
//             concat(input_layernorm(embed(ids)), hidden_norm(h)) (width 2H)
//             and whose residual is h
//   norm, lm_head: final RMSNorm and a head over the draft vocabulary.
//
// EAGLE-3.1 (Eagle3DraftConfig::fc_norm and norm_output) adds an RMSNorm
// per aux state before fc (`fc_norm.<k>`), and feeds the normalised
// output, the state lm_head reads, to the next TTT step instead of the
// raw layer output: the semantics vLLM, SGLang and SpecForge give the two
// config keys.
//
// Trainable parameters carry exactly the names the export writes (see
// DESIGN.md "Export"). The frozen tensors the teacher serves (the target's
// embed_tokens, the target lm_head rows of the draft vocab and the vocab
// map) are buffers: never trained, never exported except d2t/t2d.
//
// Do not call `->to(dtype)` on the module: LibTorch's Module::to converts
// every buffer, including the integer d2t and boolean t2d. Choose the
// dtype and device in Eagle3DraftOptions instead.
#ifndef E3_STUDENT_TRAINER_DRAFT_EAGLE3_DRAFT_H_
#define E3_STUDENT_TRAINER_DRAFT_EAGLE3_DRAFT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data/vocab_map.h"
#include "common/model/model_config.h"
#include "common/model/target_identity.h"
#include "common/torch/rope.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/draft_model.h"
#include "student_trainer/draft/flat_parameters.h"

namespace e3 {

struct Eagle3DraftConfig {
  int64_t hidden_size = 0;         // the draft's H; must equal target_hidden_size (see Validate)
  int64_t target_hidden_size = 0;  // width of each aux state and of last_hidden
  int64_t num_aux = 3;             // fc reads num_aux * target_hidden_size
  int64_t intermediate_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;  // the target's: the serving engines run the draft with it
  int64_t max_position_embeddings = 0;
  int64_t vocab_size = 0;        // the target's vocabulary
  int64_t draft_vocab_size = 0;  // rows of lm_head
  // EAGLE-3.1: an RMSNorm over each aux state before fc ...
  bool fc_norm = false;
  // ... and norm(h), not h, as the next step's hidden state.
  bool norm_output = false;
  // Aux layer ids counted "output of decoder layer i"; the export writes
  // them in each serving engine's own numbering (draft_export.h).
  std::vector<int32_t> aux_layer_ids;
  // The model the draft was trained for (empty when not known, as in
  // exports written before it was recorded).
  TargetIdentity target;

  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  }
  // InvalidArgument naming the first field that is missing or inconsistent.
  absl::Status Validate() const;
};

// The draft's config derived from the target's: same dims, heads, eps,
// rope and vocabulary (what SpecForge's shipped draft configs do), with
// `draft_vocab_size` rows in the head. Empty `aux_layer_ids` means the
// target's default ([1, L/2-1, L-4]).
absl::StatusOr<Eagle3DraftConfig> DraftConfigFromTarget(const ModelConfig& target,
                                                        int64_t draft_vocab_size,
                                                        std::vector<int32_t> aux_layer_ids = {});

// Frozen tensors from the teacher (GetWeights). Any float dtype, any device.
struct Eagle3FrozenTensors {
  at::Tensor embed_tokens;  // [vocab_size, target_hidden_size]
  // [vocab_size, target_hidden_size] (the full head; the draft rows are
  // selected here) or [draft_vocab_size, target_hidden_size] (already
  // selected, in draft id order).
  at::Tensor target_lm_head;
  VocabMap vocab;
  // Optional [vocab_size - draft_vocab_size, target_hidden_size]: the head
  // rows outside the draft vocab in target id order, for
  // keep_full_target_head when target_lm_head holds only the draft rows.
  at::Tensor target_head_rest;
};

struct Eagle3DraftOptions {
  Eagle3DraftConfig config;
  at::ScalarType dtype = at::kFloat;  // trainable parameters and activations
  at::Device device = at::kCPU;
  // Storage of the target head rows. The target distribution is the
  // reference the draft learns; fp32 keeps bf16 rounding out of it.
  at::ScalarType target_head_dtype = at::kFloat;
  uint64_t seed = 0;  // initialisation; equal seeds give bit-equal weights
  // lm_head starts as the target head rows (the draft then begins by
  // predicting what the target would from its own last hidden state);
  // false draws it like the other projections.
  bool init_lm_head_from_target = true;
  // Also keep the target head's rows outside the draft vocab (buffer
  // target_head_rest), so that TargetDraftLogMass can normalise over the
  // full vocabulary: the LK losses need the target's full distribution.
  // Costs (V - N) * H_t values of target_head_dtype on the device.
  bool keep_full_target_head = false;
};

class Eagle3RmsNormImpl : public torch::nn::Module {
 public:
  Eagle3RmsNormImpl(int64_t size, double eps, const torch::TensorOptions& options);
  // transformers' LlamaRMSNorm: statistics in (at least) fp32, the weight
  // applied after the cast back to x's dtype.
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(Eagle3RmsNorm);

// Keys and values of the TTT steps run so far, one entry per step, each
// [T, num_heads, head_dim] (kv heads already repeated for GQA).
struct TttKvCache {
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
};

// What every step shares: the packing and the rotary tables.
struct PackedRope {
  std::vector<int64_t> cu_seqlens;  // host copy, [num_samples + 1]
  at::Tensor cos, sin;              // [T, rotary_dim], activation dtype
};

class Eagle3AttentionImpl : public torch::nn::Module {
 public:
  explicit Eagle3AttentionImpl(const Eagle3DraftConfig& config);

  // x: [T, 2H]. Appends this step's k/v to `cache`, then lets the query at
  // t attend to step-0 keys at positions <= t of its own sample and to the
  // keys of steps 1..j at position t (SpecForge's cache_hidden), with one
  // softmax in (at least) fp32 over the concatenation. Returns [T, H].
  at::Tensor forward(const at::Tensor& x, const PackedRope& rope, TttKvCache* cache);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
};
TORCH_MODULE(Eagle3Attention);

// Without autograd (the acceptance eval drafting chains) the attention
// takes each sample's queries in row chunks whose scores stay within this
// many bytes (default 1 GiB), so its memory grows linearly in the sample's
// length. For tests and benchmarks.
void SetNoGradAttentionScoreBytes(int64_t bytes);

class Eagle3MlpImpl : public torch::nn::Module {
 public:
  explicit Eagle3MlpImpl(const Eagle3DraftConfig& config);
  at::Tensor forward(const at::Tensor& x);  // down(silu(gate(x)) * up(x))

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Eagle3Mlp);

class Eagle3DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit Eagle3DecoderLayerImpl(const Eagle3DraftConfig& config);
  // embeds, hidden: [T, H]. Returns the layer output [T, H] (before `norm`).
  at::Tensor forward(const at::Tensor& embeds, const at::Tensor& hidden, const PackedRope& rope,
                     TttKvCache* cache);

  Eagle3RmsNorm input_layernorm{nullptr}, hidden_norm{nullptr}, post_attention_layernorm{nullptr};
  Eagle3Attention self_attn{nullptr};
  Eagle3Mlp mlp{nullptr};
};
TORCH_MODULE(Eagle3DecoderLayer);

class Eagle3DraftImpl : public DraftModel {
 public:
  // Throws c10::Error on inconsistent input; use CreateEagle3Draft, which
  // validates first and returns a status.
  Eagle3DraftImpl(const Eagle3DraftOptions& options, const Eagle3FrozenTensors& frozen);

  const Eagle3DraftConfig& config() const { return options_.config; }
  const Eagle3DraftOptions& options() const { return options_; }

  // The pieces of one TTT step (student_trainer/step/ttt_step.h runs the loop).
  // Like any module forward they throw c10::Error; RunTtt catches it.
  // [T, num_aux*H_t] -> [T, H]: fc, after fc_norm where the config has it.
  at::Tensor ProjectAux(const at::Tensor& aux_hidden);
  at::Tensor Embed(const at::Tensor& ids);              // [T] -> [T, H] in the activation dtype
  at::Tensor Step(const at::Tensor& embeds, const at::Tensor& hidden, const PackedRope& rope,
                  TttKvCache* cache);           // one midlayer pass
  // What one step's output gives: lm_head(norm(out)) [T, N], and the
  // hidden state the next step reads (out, or norm(out) with norm_output).
  struct HeadOutput {
    at::Tensor logits, next_hidden;
  };
  HeadOutput Head(const at::Tensor& out);
  // Target logits over the draft vocab, last_hidden @ target_head^T, in
  // (at least) fp32 and without autograd: [T, N].
  at::Tensor TargetLogits(const at::Tensor& last_hidden);
  // log of the target's probability mass on the draft vocab per position,
  // draft_lse - logsumexp over all V rows, given draft_lse = logsumexp of
  // TargetLogits [T]; no autograd. Zeros when the draft vocab is the whole
  // vocab. Needs keep_full_target_head otherwise (throws c10::Error).
  at::Tensor TargetDraftLogMass(const at::Tensor& last_hidden, const at::Tensor& draft_lse);
  // Packing and rope tables for positions that restart at every sample,
  // plus `offset` (TTT step j's positions are t + j).
  PackedRope MakePackedRope(const std::vector<int64_t>& cu_seqlens, int64_t offset = 0);
  // cos and sin [T, rotary_dim] in the activation dtype for int64
  // positions [T] on the draft's device.
  std::pair<at::Tensor, at::Tensor> RopeTables(const at::Tensor& positions);

  // DraftModel. The flat buffer is what the fast TTT step works on too.
  std::vector<std::pair<std::string, at::Tensor>> ExportedParameters() const override;
  FlatParameters& flat() override { return *flat_; }
  const FlatParameters& flat() const override { return *flat_; }
  at::Device device() const override { return options_.device; }
  const at::Tensor& target_embed_tokens() const override { return embed_tokens; }
  // Undefined: the draft's own lm_head proposes (target_head is only the
  // training loss's).
  const at::Tensor& target_lm_head() const override {
    static const at::Tensor kNone;
    return kNone;
  }
  // The export of draft_export.h; loading checks the config's shapes, aux
  // layers and target first.
  absl::Status Export(const std::string& dir, const DraftExportOptions& options) const override;
  absl::Status LoadExport(const std::string& dir, OtherTarget other_target) override;
  // SGLang's chain mode (eval/acceptance.h): step j of a round feeds back
  // step j-1's token and its output (pre-norm, or post-norm with
  // norm_output), one position further on.
  absl::StatusOr<at::Tensor> ProposeChains(const EvalBatch& batch, int64_t chain_length) override;
  // t2d on the host, for the fast step's masks.
  const std::vector<uint8_t>& t2d_host() const { return t2d_host_; }

  at::Tensor embed_tokens;  // [V, H_t] frozen, the teacher's dtype
  at::Tensor target_head;   // [N, H_t] frozen, options.target_head_dtype
  // [V - N, H_t]: the other rows (keep_full_target_head; else undefined)
  at::Tensor target_head_rest;
  at::Tensor d2t;           // [N] int64: target id = i + d2t[i]
  at::Tensor t2d;           // [V] bool: target id is in the draft vocab

  torch::nn::Linear fc{nullptr};
  std::vector<Eagle3RmsNorm> fc_norms;  // "fc_norm.<k>", with config.fc_norm only
  Eagle3DecoderLayer midlayer{nullptr};
  Eagle3RmsNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  // TargetLogits takes the 16-bit GEMM with an fp32 result for these states.
  bool UsesFloatOutMm(const at::Tensor& last_hidden) const;

  Eagle3DraftOptions options_;
  rope::InvFrequencies rope_freqs_;
  // target_head in the 16-bit dtype where that holds it exactly (CUDA
  // builds with LibTorch 2.8+); else undefined.
  at::Tensor target_head_16bit_;
  std::shared_ptr<FlatParameters> flat_;
  std::vector<uint8_t> t2d_host_;
};
TORCH_MODULE(Eagle3Draft);

// Validates the config and the frozen tensors' shapes and vocab map, then
// builds and initialises the draft on options.device.
absl::StatusOr<Eagle3Draft> CreateEagle3Draft(const Eagle3DraftOptions& options,
                                              const Eagle3FrozenTensors& frozen);

// Activations never go below fp32 where HF upcasts (norm statistics,
// attention softmax, losses); fp64 stays fp64 so golden tests can compare
// tightly.
inline at::ScalarType AtLeastFloat(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_DRAFT_EAGLE3_DRAFT_H_
