// The Gated DeltaNet token mixer of Qwen3-Next and Qwen3.5 (transformers'
// Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet), over packed sequences:
//   qkv = x W_qkv^T  ([q heads | k heads | v heads]),  z = x W_z^T,
//   b = x W_b^T,  a = x W_a^T
//   qkv <- silu(causal depthwise conv(qkv))            (causal_conv1d.h)
//   beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)   (fp32)
//   q, k: each key head serves value_heads / key_heads value heads, then
//         q = l2norm(q) / sqrt(Dk), k = l2norm(k)     (fp32, eps 1e-6)
//   o = gated delta rule(q, k, v, g, beta)             (gated_delta_rule.h)
//   o = dtype(w * dtype(rmsnorm(o))) * silu(z), per value head over Dv
//   out = o W_out^T
// The weights take Qwen3.5's layout; Qwen3-Next's fused projections
// (in_proj_qkvz and in_proj_ba, grouped per key head) are regrouped into
// it at load (FromQwen3NextProjections).
//
// The L2 norms run in fp32, as flash-linear-attention's kernels (which
// transformers calls on a GPU) run them; transformers' torch fallback
// normalises in the model dtype first, which only differs below fp32.
#ifndef E3_TEACHER_SERVER_LAYERS_GATED_DELTA_NET_H_
#define E3_TEACHER_SERVER_LAYERS_GATED_DELTA_NET_H_

#include <cstdint>
#include <vector>

#include "common/torch/torch_core.h"

namespace e3 {

struct GatedDeltaNetShape {
  int64_t key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0, conv_kernel = 4;
  double eps = 1e-6;  // the gated RMSNorm's
  int64_t key_width() const { return key_heads * key_dim; }
  int64_t value_width() const { return value_heads * value_dim; }
  int64_t conv_width() const { return 2 * key_width() + value_width(); }
};

struct GatedDeltaNetWeights {
  at::Tensor in_proj_qkv;  // [conv_width, H]
  at::Tensor in_proj_z;    // [value_width, H]
  at::Tensor in_proj_b;    // [value_heads, H]
  at::Tensor in_proj_a;    // [value_heads, H]
  at::Tensor conv;         // [conv_width, K]
  at::Tensor dt_bias;      // [value_heads]
  at::Tensor a_log;        // [value_heads]
  at::Tensor norm;         // [value_dim]
  at::Tensor out_proj;     // [H, value_width]
};

// Qwen3-Next's in_proj_qkvz ([key_heads * (2 Dk + 2 r Dv), H], per key head
// [q | k | v (r heads) | z (r heads)]) and in_proj_ba ([key_heads * 2r, H],
// per key head [b (r) | a (r)]) into the four projections above.
void FromQwen3NextProjections(const at::Tensor& in_proj_qkvz, const at::Tensor& in_proj_ba,
                              const GatedDeltaNetShape& shape, GatedDeltaNetWeights* w);
// Throws c10::Error naming the first weight whose shape does not fit.
void CheckGatedDeltaNetWeights(const GatedDeltaNetWeights& w, const GatedDeltaNetShape& shape,
                               int64_t hidden);

// What generation carries per sequence between calls (fp32, or fp64 for
// fp64 inputs): the conv's last K - 1 inputs [N, conv_width, K - 1] and
// the delta rule's state [N, value_heads, Dk, Dv]. Undefined tensors:
// fresh sequences.
struct GatedDeltaNetState {
  at::Tensor conv, recurrent;
};

enum class DeltaRuleForm { kRecurrent, kChunked };

// x [T, H] packed by cu_seqlens (host, N + 1 offsets); returns [T, H] in
// x's dtype. With `state`, continues from it and leaves the new state.
at::Tensor GatedDeltaNetForward(const at::Tensor& x, const GatedDeltaNetWeights& w,
                                const GatedDeltaNetShape& shape,
                                const std::vector<int64_t>& cu_seqlens, DeltaRuleForm form,
                                GatedDeltaNetState* state = nullptr);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_GATED_DELTA_NET_H_
