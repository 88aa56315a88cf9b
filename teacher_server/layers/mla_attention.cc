#include "teacher_server/layers/mla_attention.h"

#include <vector>

#include "common/torch/rope.h"
#include "teacher_server/layers/kv_cache.h"
#include "teacher_server/layers/rms_norm.h"

namespace e3 {
namespace {

// The (even, odd) pairs of x's last dimension, and the per-pair angles'
// cos and sin (the first half of rope::CosSin's), broadcast over heads.
struct Pairs {
  at::Tensor even, odd, cos, sin;
};

Pairs SplitPairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = half;
  sizes.push_back(2);
  const at::Tensor pairs = x.reshape(sizes);
  return {pairs.select(-1, 0), pairs.select(-1, 1), cos.narrow(-1, 0, half).unsqueeze(1),
          sin.narrow(-1, 0, half).unsqueeze(1)};
}

// Queries [T, heads, qk_head_dim] (whole-latent or LoRA form).
at::Tensor Queries(const at::Tensor& x, const MlaWeights& w, const MlaShape& s, GemmPath gemm) {
  at::Tensor q;
  if (w.q_proj.defined()) {
    q = Gemm(x, w.q_proj, at::Tensor(), at::Tensor(), gemm);
  } else {
    const at::Tensor q_latent = Gemm(x, w.q_a_proj, w.q_a_bias, at::Tensor(), gemm);
    q = Gemm(RmsNorm(q_latent, w.q_a_layernorm, s.latent_norm_eps), w.q_b_proj, at::Tensor(), at::Tensor(), gemm);
  }
  return q.view({x.size(0), s.num_heads, s.qk_nope_head_dim + s.qk_rope_head_dim});
}

}  // namespace

at::Tensor ApplyMlaRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, MlaRope rope) {
  switch (rope) {
    case MlaRope::kHalves:
      return rope::Apply(x, cos.to(x.scalar_type()), sin.to(x.scalar_type()));
    case MlaRope::kInterleaved: {
      // modeling_deepseek_v3.py apply_rotary_pos_emb_interleave.
      const Pairs p = SplitPairs(x, cos.to(x.scalar_type()), sin.to(x.scalar_type()));
      return torch::cat({p.even * p.cos - p.odd * p.sin, p.odd * p.cos + p.even * p.sin}, -1);
    }
    case MlaRope::kComplexPairs: {
      // modeling_deepseek_v2.py apply_rotary_emb: (even + i odd) times
      // (cos + i sin) in fp32, the real and imaginary parts kept adjacent.
      const Pairs p = SplitPairs(x.to(at::kFloat), cos.to(at::kFloat), sin.to(at::kFloat));
      const at::Tensor real = p.even * p.cos - p.odd * p.sin;
      const at::Tensor imag = p.even * p.sin + p.odd * p.cos;
      return torch::stack({real, imag}, -1).flatten(-2).to(x.scalar_type());
    }
  }
  return x;
}

at::Tensor MlaAttention(const at::Tensor& x, const MlaWeights& w, const MlaShape& s, const at::Tensor& cos,
                        const at::Tensor& sin, const PackedLayout& layout, AttentionKernel kernel, GemmPath gemm,
                        KvCacheSlot cache) {
  const int64_t T = x.size(0), heads = s.num_heads;
  const int64_t nope = s.qk_nope_head_dim, rope_dim = s.qk_rope_head_dim, qk = nope + rope_dim;
  const at::Tensor q = Queries(x, w, s, gemm);
  const at::Tensor compressed = Gemm(x, w.kv_a_proj_with_mqa, w.kv_a_bias, at::Tensor(), gemm);
  const at::Tensor latent = RmsNorm(compressed.narrow(-1, 0, s.kv_lora_rank), w.kv_a_layernorm, s.latent_norm_eps);
  const at::Tensor kv = Gemm(latent, w.kv_b_proj, at::Tensor(), at::Tensor(), gemm).view({T, heads, nope + s.v_head_dim});
  const at::Tensor q_rope = ApplyMlaRope(q.narrow(-1, nope, rope_dim), cos, sin, s.rope);
  const at::Tensor k_rope =
      ApplyMlaRope(compressed.narrow(-1, s.kv_lora_rank, rope_dim).reshape({T, 1, rope_dim}), cos, sin, s.rope);
  const at::Tensor query = torch::cat({q.narrow(-1, 0, nope), q_rope}, -1);
  const at::Tensor key = torch::cat({kv.narrow(-1, 0, nope), k_rope.expand({T, heads, rope_dim})}, -1);
  at::Tensor value = kv.narrow(-1, nope, s.v_head_dim).contiguous();
  // The fused varlen kernel wants one head dim for q, k and v, and the KV
  // cache holds one: v is padded with zeros, as transformers does for flash
  // attention, and the output's zero columns are cut after.
  const bool pad_v = (kernel == AttentionKernel::kFlashVarlen || cache.cache != nullptr) && s.v_head_dim != qk;
  if (pad_v) value = at::constant_pad_nd(value, {0, qk - s.v_head_dim});
  at::Tensor o = cache.cache != nullptr
                     ? cache.cache->Attend(cache.layer, query, key.contiguous(), value, s.softmax_scale, layout, kernel)
                     : PackedCausalAttention(query, key, value, layout, s.softmax_scale, kernel);
  if (pad_v) o = o.narrow(-1, 0, s.v_head_dim);
  return Gemm(o.reshape({T, heads * s.v_head_dim}), w.o_proj, w.o_bias, at::Tensor(), gemm);
}

}  // namespace e3
