// Causal GQA self-attention over packed samples: each sample attends only
// within itself (cu_seqlens), never across samples.
#ifndef E3_TEACHER_SERVER_LAYERS_ATTENTION_H_
#define E3_TEACHER_SERVER_LAYERS_ATTENTION_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace e3 {

enum class AttentionKernel {
  kEager,  // transformers' eager_attention_forward: matmul, fp32 softmax, matmul
  kSdpa,   // scaled_dot_product_attention (fused kernels on GPU)
};

struct AttentionShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;
  double qk_norm_eps = 1e-6;  // used when q_norm/k_norm are set
};

struct AttentionWeights {
  at::Tensor q_proj, k_proj, v_proj, o_proj;  // [out, in], nn.Linear layout
  at::Tensor q_bias, k_bias, v_bias, o_bias;  // undefined when absent
  at::Tensor q_norm, k_norm;  // [D] per-head RMSNorm before rope (Qwen3); undefined when absent
  // Set by FuseQkv: [q_out + 2 kv_out, in] (and its bias); q/k/v_proj are
  // then released.
  at::Tensor qkv_proj, qkv_bias;
};

// Concatenates q/k/v into qkv_proj (rows q, then k, then v).
void FuseQkv(AttentionWeights* w);

// x: [T, H]; cos/sin: [T, rotary_dim]. Returns [T, H].
at::Tensor SelfAttention(const at::Tensor& x, const AttentionWeights& w, const AttentionShape& shape,
                         const at::Tensor& cos, const at::Tensor& sin,
                         const std::vector<int64_t>& cu_seqlens, AttentionKernel kernel);

// q: [T, heads, D], k/v: [T, kv_heads, D]. Returns [T, heads, D].
at::Tensor PackedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::vector<int64_t>& cu_seqlens, double scaling,
                                 AttentionKernel kernel);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_ATTENTION_H_
