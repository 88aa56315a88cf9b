#include "teacher_server/layers/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "common/torch/torch_compat.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/kv_cache.h"
#include "teacher_server/layers/rms_norm.h"
#include "teacher_server/layers/rotary.h"
#include "teacher_server/layers/sink_attention.h"

namespace e3 {
namespace {

// transformers' repeat_kv: kv head j serves query heads [j*n_rep, (j+1)*n_rep).
at::Tensor RepeatKv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t kvh = x.size(0), n = x.size(1), d = x.size(2);
  return x.unsqueeze(1).expand({kvh, n_rep, n, d}).reshape({kvh * n_rep, n, d});
}

at::Tensor RopeOnPrefix(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotary_dim) {
  if (rotary_dim == x.size(-1)) return ApplyRotary(x, cos, sin);
  at::Tensor rot = ApplyRotary(x.narrow(-1, 0, rotary_dim), cos, sin);
  return torch::cat({rot, x.narrow(-1, rotary_dim, x.size(-1) - rotary_dim)}, -1);
}

std::atomic<bool> g_cudnn_attention{true};

void DisableCudnnAttention(const std::string& why) {
  if (g_cudnn_attention.exchange(false)) {
    std::fprintf(stderr, "attention: cuDNN's batched kernel failed (%s); using varlen flash attention\n",
                 why.substr(0, 300).c_str());
  }
}

// Whether the varlen flash kernel takes these tensors; otherwise the
// per-sample SDPA loop runs.
bool FlashVarlenApplies(const at::Tensor& q, const PackedLayout& layout) {
  return layout.cu_seqlens_device.defined() && FlashVarlenAppliesTo(q.scalar_type(), q.size(-1), q.device());
}

}  // namespace

bool FlashVarlenAppliesTo(at::ScalarType dtype, int64_t head_dim, const at::Device& device) {
  return compat::kHasFlashVarlen && FusedKernelsRunOn(device) && (dtype == at::kBFloat16 || dtype == at::kHalf) &&
         head_dim % 8 == 0 && head_dim <= 256;
}

bool CudnnAttentionUsable() { return g_cudnn_attention.load(std::memory_order_relaxed); }

at::Tensor PinnedCuSeqlens(const std::vector<int64_t>& cu_seqlens) {
  const int64_t n = static_cast<int64_t>(cu_seqlens.size());
  at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
  int32_t* p = host.data_ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(cu_seqlens[i]);
  return host;
}

PackedLayout MakePackedLayout(const std::vector<int64_t>& cu_seqlens, const at::Device& device,
                              AttentionKernel kernel) {
  PackedLayout layout;
  layout.cu_seqlens = cu_seqlens;
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    layout.max_seqlen = std::max(layout.max_seqlen, cu_seqlens[s + 1] - cu_seqlens[s]);
  }
  const int64_t samples = static_cast<int64_t>(cu_seqlens.size()) - 1;
  layout.uniform = samples > 0 && cu_seqlens.back() == samples * layout.max_seqlen;
  if (kernel == AttentionKernel::kFlashVarlen && device.is_cuda()) {
    layout.cu_seqlens_device = PinnedCuSeqlens(cu_seqlens).to(device, /*non_blocking=*/true);
  }
  return layout;
}

at::Tensor PackedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const PackedLayout& layout, double scaling, AttentionKernel kernel) {
  if (kernel == AttentionKernel::kFlashVarlen && FlashVarlenApplies(q, layout)) {
    if (layout.uniform && q.size(-1) <= 128 && CudnnAttentionUsable()) {
      const int64_t B = static_cast<int64_t>(layout.cu_seqlens.size()) - 1, S = layout.max_seqlen;
      // [T, h, D] -> [B, h, S, D] as views (cuDNN takes the strides).
      auto batched = [&](const at::Tensor& x) { return x.view({B, S, x.size(1), x.size(2)}).transpose(1, 2); };
      try {
        at::Tensor o = compat::CudnnBatchedAttention(batched(q), batched(k), batched(v), scaling);
        return o.transpose(1, 2).reshape({B * S, q.size(1), q.size(2)});
      } catch (const c10::OutOfMemoryError&) {
        throw;  // transient: the batch fails, cuDNN stays in use
      } catch (const c10::Error& e) {
        // A LibTorch without cuDNN attention (or a cuDNN that refuses the
        // shape): say so once, then use the flash kernel for every batch.
        DisableCudnnAttention(e.what_without_backtrace());
      }
    }
    return compat::FlashVarlenAttention(q, k, v, layout.cu_seqlens_device, layout.max_seqlen, scaling);
  }
  const std::vector<int64_t>& cu_seqlens = layout.cu_seqlens;
  const int64_t n_rep = q.size(1) / k.size(1);
  // v's head dim may differ from q's (multi-head latent attention).
  at::Tensor out = torch::empty({q.size(0), q.size(1), v.size(-1)}, q.options());
  // SDPA's own scale is 1/sqrt(D); a model with another passes it.
  const bool default_scale = std::abs(scaling * std::sqrt(static_cast<double>(q.size(-1))) - 1.0) < 1e-12;
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    const int64_t begin = cu_seqlens[s];
    const int64_t n = cu_seqlens[s + 1] - begin;
    // [n, heads, D] -> [heads, n, D]
    at::Tensor qs = q.narrow(0, begin, n).transpose(0, 1);
    at::Tensor ks = RepeatKv(k.narrow(0, begin, n).transpose(0, 1), n_rep);
    at::Tensor vs = RepeatKv(v.narrow(0, begin, n).transpose(0, 1), n_rep);
    at::Tensor o;
    if (kernel == AttentionKernel::kEager) {
      at::Tensor scores = at::matmul(qs, ks.transpose(1, 2)) * scaling;
      at::Tensor causal = torch::ones({n, n}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
      scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
      at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
      o = at::matmul(probs, vs);
    } else {
      o = default_scale ? compat::ScaledDotProductAttention(qs.unsqueeze(0), ks.unsqueeze(0), vs.unsqueeze(0),
                                                            at::Tensor(), /*is_causal=*/true)
                        : compat::ScaledDotProductAttention(qs.unsqueeze(0), ks.unsqueeze(0), vs.unsqueeze(0),
                                                            at::Tensor(), /*is_causal=*/true, scaling);
      o = o.squeeze(0);
    }
    out.narrow(0, begin, n).copy_(o.transpose(0, 1));
  }
  return out;
}

void FuseQkv(AttentionWeights* w) {
  w->qkv_proj = torch::cat({w->q_proj, w->k_proj, w->v_proj}, 0);
  if (w->q_bias.defined()) w->qkv_bias = torch::cat({w->q_bias, w->k_bias, w->v_bias}, 0);
  w->q_proj = w->k_proj = w->v_proj = at::Tensor();
  w->q_bias = w->k_bias = w->v_bias = at::Tensor();
}

at::Tensor SelfAttention(const at::Tensor& x, const AttentionWeights& w, const AttentionShape& shape,
                         const at::Tensor& cos, const at::Tensor& sin, const PackedLayout& layout,
                         const AttentionOptions& options, const at::Tensor& residual, KvCacheSlot cache) {
  const int64_t T = x.size(0);
  at::Tensor q, k, v, gate;
  at::Tensor qk_heads;  // q's heads then k's, [T, heads + kv heads, D], where the qkv product is fused
  const int64_t q_per_head = shape.head_dim * (shape.output_gate ? 2 : 1);
  if (w.qkv_proj.defined()) {
    const int64_t q_out = shape.num_heads * q_per_head, kv_out = shape.num_kv_heads * shape.head_dim;
    at::Tensor qkv = Gemm(x, w.qkv_proj, w.qkv_bias, at::Tensor(), options.gemm);
    q = qkv.narrow(-1, 0, q_out).view({T, shape.num_heads, q_per_head});
    k = qkv.narrow(-1, q_out, kv_out).view({T, shape.num_kv_heads, shape.head_dim});
    v = qkv.narrow(-1, q_out + kv_out, kv_out).view({T, shape.num_kv_heads, shape.head_dim});
    if (!shape.output_gate) {
      qk_heads = qkv.narrow(-1, 0, q_out + kv_out).view({T, shape.num_heads + shape.num_kv_heads, shape.head_dim});
    }
  } else {
    q = Gemm(x, w.q_proj, w.q_bias, at::Tensor(), options.gemm).view({T, shape.num_heads, q_per_head});
    k = Gemm(x, w.k_proj, w.k_bias, at::Tensor(), options.gemm).view({T, shape.num_kv_heads, shape.head_dim});
    v = Gemm(x, w.v_proj, w.v_bias, at::Tensor(), options.gemm).view({T, shape.num_kv_heads, shape.head_dim});
  }
  if (shape.output_gate) {
    gate = q.narrow(-1, shape.head_dim, shape.head_dim).reshape({T, shape.num_heads * shape.head_dim});
    q = q.narrow(-1, 0, shape.head_dim).contiguous();
  }
  if (options.rope_in_place && !shape.qk_norm_weight_in_fp32) {
    // Qwen3's q/k norms and rope in one pass where the kernel takes them.
    auto norm_and_rope = [&](at::Tensor& x, const at::Tensor& norm) {
      if (norm.defined()) {
        x = HeadRmsNormRope(x, norm, shape.qk_norm_eps, cos, sin, /*fused=*/true);
      } else {
        RopeInPlace(x, cos, sin, /*fused=*/true);
      }
    };
    if (qk_heads.defined() && !w.q_norm.defined() && !w.k_norm.defined()) {
      // q's and k's heads are adjacent in the fused product and rotate by
      // the same per-token angles: one launch for both instead of one per
      // tensor (k alone is too small a launch to fill the GPU).
      RopeInPlace(qk_heads, cos, sin, /*fused=*/true);
    } else {
      norm_and_rope(q, w.q_norm);
      norm_and_rope(k, w.k_norm);
    }
  } else {
    const auto norm = shape.qk_norm_weight_in_fp32 ? RmsNormWeightInFp32 : RmsNorm;
    if (w.q_norm.defined()) q = norm(q, w.q_norm, shape.qk_norm_eps);
    if (w.k_norm.defined()) k = norm(k, w.k_norm, shape.qk_norm_eps);
    q = RopeOnPrefix(q, cos, sin, shape.rotary_dim);
    k = RopeOnPrefix(k, cos, sin, shape.rotary_dim);
  }
  const double scaling = 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
  at::Tensor o;
  if (w.sinks.defined() || shape.sliding_window > 0) {
    // The varlen flash kernel takes the window, and its log-sum-exp the
    // sink (FlashSinkAttention); elsewhere the eager sink attention
    // (transformers, too, runs GPT-OSS eagerly). The cache's own paths know
    // no window.
    if (cache.cache != nullptr) {
      o = CachedSinkAttention(q, k, v, cache, layout, scaling, w.sinks, shape.sliding_window);
    } else if (options.kernel == AttentionKernel::kFlashVarlen && FlashVarlenApplies(q, layout)) {
      o = FlashSinkAttention(q, k, v, layout, scaling, w.sinks, shape.sliding_window);
    } else {
      o = PackedSinkAttention(q, k, v, layout, scaling, w.sinks, shape.sliding_window);
    }
  } else if (cache.cache != nullptr) {
    o = cache.cache->Attend(cache.layer, q, k, v, scaling, layout, options.kernel);
  } else {
    o = PackedCausalAttention(q, k, v, layout, scaling, options.kernel);
  }
  o = o.reshape({T, shape.num_heads * shape.head_dim});
  if (gate.defined()) o = o * at::sigmoid(gate);
  return Gemm(o, w.o_proj, w.o_bias, residual, options.gemm);
}

}  // namespace e3
