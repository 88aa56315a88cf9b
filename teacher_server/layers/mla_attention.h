// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2), as transformers
// 5.17's DeepseekV2Attention / DeepseekV3Attention compute it:
//   q = q_b(RMSNorm(q_a(x))) (or q_proj(x) without a q_lora_rank), split per
//       head into a no-rope part and a rope part;
//   [latent, k_rope] = kv_a_proj_with_mqa(x); k_nope | v = kv_b(RMSNorm(latent))
//       per head; k_rope is one head shared by all;
//   rope on q's and k's rope parts; attention over [nope, rope] with the
//   config's softmax scale (DeepseekConfig::softmax_scale); o_proj.
// The two latent RMSNorms use eps 1e-6 whatever rms_norm_eps says: the
// modeling files build them without passing it.
//
// Under tensor parallelism a rank holds some heads: rows of q_b (or q_proj)
// and kv_b, columns of o_proj; the latent projections q_a and kv_a and
// their norms are whole on every rank (they are small, and every head reads
// them). The output is the rank's partial o_proj product, for the caller
// to all-reduce.
#ifndef E3_TEACHER_SERVER_LAYERS_MLA_ATTENTION_H_
#define E3_TEACHER_SERVER_LAYERS_MLA_ATTENTION_H_

#include <cstdint>

#include "common/torch/torch_core.h"
#include "teacher_server/layers/attention.h"

namespace e3 {

// How the rope part of a head is laid out and rotated.
enum class MlaRope {
  // V3 with rope_interleave (the default): (even, odd) pairs rotated, the
  // result written as [rotated evens, rotated odds], in the activations'
  // dtype (apply_rotary_pos_emb_interleave).
  kInterleaved,
  // V3 without rope_interleave: rotate_half, as Llama.
  kHalves,
  // V2: (even, odd) pairs multiplied as complex numbers in fp32 and kept
  // interleaved (apply_rotary_emb with freqs_cis), then cast back.
  kComplexPairs,
};

struct MlaShape {
  int64_t num_heads = 0;  // this rank's
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t kv_lora_rank = 0;
  double softmax_scale = 0;
  MlaRope rope = MlaRope::kInterleaved;
  double latent_norm_eps = 1e-6;
};

struct MlaWeights {
  at::Tensor q_proj;  // [heads * qk_head_dim, H], without q_lora
  at::Tensor q_a_proj, q_a_bias, q_a_layernorm, q_b_proj;  // with q_lora (bias with attention_bias)
  at::Tensor kv_a_proj_with_mqa, kv_a_bias, kv_a_layernorm, kv_b_proj;
  at::Tensor o_proj, o_bias;  // o_bias: attention_bias, on one rank only under TP
};

// x [T, heads, rope_dim]; cos and sin [T, rope_dim] in fp32 as
// rope::CosSin gives them (cat(freqs, freqs), times the attention factor).
at::Tensor ApplyMlaRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, MlaRope rope);

// x [T, H] -> [T, H] (this rank's partial sum under TP). With a KV cache
// slot, the new tokens' per-head keys and values go into the cache (values
// padded with zeros to the keys' qk head dim, the cache's one head dim; see
// MlaCacheHeadDim) and the queries attend over each sequence's cached ones.
at::Tensor MlaAttention(const at::Tensor& x, const MlaWeights& w, const MlaShape& shape, const at::Tensor& cos,
                        const at::Tensor& sin, const PackedLayout& layout, AttentionKernel kernel, GemmPath gemm,
                        KvCacheSlot cache = {});

// The head dim a KV cache for MLA holds: the keys' (no-rope + rope part).
inline int64_t MlaCacheHeadDim(const MlaShape& s) { return s.qk_nope_head_dim + s.qk_rope_head_dim; }

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_MLA_ATTENTION_H_
