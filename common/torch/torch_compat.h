// The one place where LibTorch 1.13 (Debian, CPU) and 2.x (pip, CUDA)
// differ in API. Everything else includes this instead of branching.
#ifndef E3_COMMON_TORCH_TORCH_COMPAT_H_
#define E3_COMMON_TORCH_TORCH_COMPAT_H_

#include <torch/torch.h>
#include <torch/version.h>

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
