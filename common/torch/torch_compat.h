// The one place where LibTorch 1.13 (Debian, CPU) and 2.x (pip, CUDA)
// differ in API. Everything else includes this instead of branching.
#ifndef E3_COMMON_TORCH_TORCH_COMPAT_H_
#define E3_COMMON_TORCH_TORCH_COMPAT_H_

#include <torch/version.h>

#include <cmath>
#include <optional>

#include "common/torch/torch_core.h"

namespace e3::compat {

constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

// Scaled dot-product attention over [B, heads, T, D] tensors with an
// optional additive/boolean mask. 1.13 only has the private op (which
// returns a tuple and takes no scale); 2.x has the public one.
inline at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& mask,
                                            bool is_causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, mask.defined() ? c10::optional<at::Tensor>(mask)
                                                                  : c10::nullopt,
                                          0.0, is_causal);
#else
  return std::get<0>(at::_scaled_dot_product_attention(
      q, k, v, mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt, 0.0,
      /*need_attn_weights=*/false, is_causal));
#endif
}

// The same with an explicit softmax scale (multi-head latent attention's
// is not 1/sqrt(head_dim)). LibTorch 2.1+ takes the scale; 1.13's private op
// always uses 1/sqrt(D), so q is scaled beforehand to give the same product.
inline at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const at::Tensor& mask, bool is_causal, double scale) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  return at::scaled_dot_product_attention(q, k, v, mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt,
                                          0.0, is_causal, scale);
#else
  const double default_scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  return ScaledDotProductAttention(q * (scale / default_scale), k, v, mask, is_causal);
#endif
}

// Causal attention over packed samples in one flash-attention call: q
// [T, heads, D], k/v [T, kv_heads, D] (last dimension contiguous; GQA
// without repeating k/v), cu_seqlens int32 [B + 1] on the device. Only
// LibTorch 2.5+ built with CUDA has both entry points with these
// arguments; callers check kHasFlashVarlen and fall back otherwise.
#if (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)) && defined(E3_HAS_CUDA)
constexpr bool kHasFlashVarlen = true;
inline at::Tensor FlashVarlenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& cu_seqlens, int64_t max_seqlen, double scale) {
  return std::get<0>(at::_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                  /*dropout_p=*/0.0, /*is_causal=*/true,
                                                  /*return_debug_mask=*/false, scale));
}
// The same forward keeping what its backward needs: the log-sum-exp of
// each query's scores (fp32 [heads, T]) and the kernel's RNG state.
struct FlashVarlenResult {
  at::Tensor out, lse, rng_state, unused;
};
inline FlashVarlenResult FlashVarlenAttentionWithLse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& cu_seqlens, int64_t max_seqlen, double scale) {
  auto r = at::_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, /*dropout_p=*/0.0,
                                        /*is_causal=*/true, /*return_debug_mask=*/false, scale);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
}
// The same forward where a query at position i sees only the keys j with
// i - window_left <= j <= i of its sample (window_left < 0: every earlier
// key), through the kernel's window arguments (LibTorch 2.5+).
inline FlashVarlenResult FlashVarlenWindowAttentionWithLse(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, const at::Tensor& cu_seqlens,
                                                           int64_t max_seqlen, double scale, int64_t window_left) {
  const std::optional<int64_t> left = window_left >= 0 ? std::optional<int64_t>(window_left) : std::nullopt;
  const std::optional<int64_t> right = window_left >= 0 ? std::optional<int64_t>(0) : std::nullopt;
  auto r = at::_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, /*dropout_p=*/0.0,
                                        /*is_causal=*/true, /*return_debug_mask=*/false, scale, left, right);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
}
// Its backward, for any `out` and `lse` of the same layout (the TTT step
// passes its merged output and log-sum-exp, so that these are the causal
// block's share of the merged softmax's gradients). Returns dq, dk, dv.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> FlashVarlenAttentionBackward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens, int64_t max_seqlen, double scale,
    const at::Tensor& rng_state, const at::Tensor& unused) {
  return at::_flash_attention_backward(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                       /*dropout_p=*/0.0, /*is_causal=*/true, rng_state, unused, scale);
}
// Causal attention over a batch of equal-length samples with cuDNN's fused
// kernel: q [B, heads, S, D], k/v [B, kv_heads, S, D] (any strides with a
// contiguous last dimension; GQA without repeating k/v). Returns
// [B, heads, S, D].
inline at::Tensor CudnnBatchedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        double scale) {
  return std::get<0>(at::_scaled_dot_product_cudnn_attention(q, k, v, /*attn_bias=*/c10::nullopt,
                                                             /*compute_log_sumexp=*/false, /*dropout_p=*/0.0,
                                                             /*is_causal=*/true, /*return_debug_mask=*/false,
                                                             scale));
}
// The same kernel keeping what its backward needs, for q/k/v [B, heads, S,
// D] views: out [B, heads, S, D] and the log-sum-exp of each query's scores
// (fp32 [B, heads, S, 1]), plus the kernel's RNG state.
struct CudnnAttentionResult {
  at::Tensor out, lse, philox_seed, philox_offset;
};
inline CudnnAttentionResult CudnnCausalAttentionWithLse(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v, double scale) {
  auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, /*attn_bias=*/c10::nullopt, /*compute_log_sumexp=*/true,
                                                   /*dropout_p=*/0.0, /*is_causal=*/true,
                                                   /*return_debug_mask=*/false, scale);
  return {std::get<0>(r), std::get<1>(r), std::get<6>(r), std::get<7>(r)};
}
// Its backward for any `out` and `lse` of those layouts (as for flash's,
// the TTT step passes its merged ones). Returns dq, dk, dv as [B, heads,
// S, D].
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> CudnnCausalAttentionBackward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const CudnnAttentionResult& forward, double scale) {
  const int64_t s = q.size(2);
  return at::_scaled_dot_product_cudnn_attention_backward(dout, q, k, v, out, lse, forward.philox_seed,
                                                          forward.philox_offset, /*attn_bias=*/at::Tensor(),
                                                          /*cum_seq_q=*/at::Tensor(), /*cum_seq_k=*/at::Tensor(), s, s,
                                                          /*dropout_p=*/0.0, /*is_causal=*/true, scale);
}
#else
constexpr bool kHasFlashVarlen = false;
inline at::Tensor FlashVarlenAttention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       int64_t, double) {
  TORCH_CHECK(false, "varlen flash attention needs LibTorch 2.x with CUDA");
}
struct FlashVarlenResult {
  at::Tensor out, lse, rng_state, unused;
};
inline FlashVarlenResult FlashVarlenAttentionWithLse(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                     const at::Tensor&, int64_t, double) {
  TORCH_CHECK(false, "varlen flash attention needs LibTorch 2.x with CUDA");
}
inline FlashVarlenResult FlashVarlenWindowAttentionWithLse(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                           const at::Tensor&, int64_t, double, int64_t) {
  TORCH_CHECK(false, "varlen flash attention needs LibTorch 2.x with CUDA");
}
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> FlashVarlenAttentionBackward(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, int64_t, double, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "varlen flash attention needs LibTorch 2.x with CUDA");
}
inline at::Tensor CudnnBatchedAttention(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
  TORCH_CHECK(false, "cuDNN attention needs LibTorch 2.x with CUDA");
}
struct CudnnAttentionResult {
  at::Tensor out, lse, philox_seed, philox_offset;
};
inline CudnnAttentionResult CudnnCausalAttentionWithLse(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                        double) {
  TORCH_CHECK(false, "cuDNN attention needs LibTorch 2.x with CUDA");
}
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> CudnnCausalAttentionBackward(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const CudnnAttentionResult&, double) {
  TORCH_CHECK(false, "cuDNN attention needs LibTorch 2.x with CUDA");
}
#endif

// Grouped GEMM over row groups: rows [offs[g-1], offs[g]) of a [M, K]
// times w[g]^T for w [G, N, K] (offs int32 [G] on the device, cumulative;
// rows past offs[G-1] are left unwritten). LibTorch 2.8+ with CUDA has the
// op (bf16 on Hopper and later); callers check kHasGroupedMm and loop over
// the groups otherwise.
#if (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)) && defined(E3_HAS_CUDA)
constexpr bool kHasGroupedMm = true;
inline at::Tensor GroupedMm(const at::Tensor& a, const at::Tensor& w, const at::Tensor& offs) {
  return at::_grouped_mm(a, w.transpose(-2, -1), offs);
}
#else
constexpr bool kHasGroupedMm = false;
inline at::Tensor GroupedMm(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "grouped GEMMs need LibTorch 2.8+ with CUDA");
}
#endif

// a @ b for bf16 or fp16 CUDA matrices with fp32 accumulation and an fp32
// result: the exact products of the 16-bit values, summed in fp32, never
// rounded to 16 bits. LibTorch 2.8+ with CUDA has the op (mm's out_dtype);
// callers check kHasMmFloatOut and otherwise multiply fp32 copies.
#if (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)) && defined(E3_HAS_CUDA)
constexpr bool kHasMmFloatOut = true;
inline at::Tensor MmFloatOut(const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b, at::kFloat); }
// The same for batches of matrices (bmm's out_dtype).
inline at::Tensor BmmFloatOut(const at::Tensor& a, const at::Tensor& b) { return at::bmm(a, b, at::kFloat); }
#else
constexpr bool kHasMmFloatOut = false;
inline at::Tensor MmFloatOut(const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "mm with an fp32 result from 16-bit inputs needs LibTorch 2.8+ with CUDA");
}
inline at::Tensor BmmFloatOut(const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "bmm with an fp32 result from 16-bit inputs needs LibTorch 2.8+ with CUDA");
}
#endif

// Lets fp32 matmuls on CUDA use TF32 tensor cores while in scope, then
// restores the process-wide setting (which is off by default in C++).
class ScopedTf32Matmul {
 public:
  ScopedTf32Matmul() : previous_(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setAllowTF32CuBLAS(true);
  }
  ~ScopedTf32Matmul() { at::globalContext().setAllowTF32CuBLAS(previous_); }
  ScopedTf32Matmul(const ScopedTf32Matmul&) = delete;
  ScopedTf32Matmul& operator=(const ScopedTf32Matmul&) = delete;

 private:
  bool previous_;
};

}  // namespace e3::compat

#endif  // E3_COMMON_TORCH_TORCH_COMPAT_H_
