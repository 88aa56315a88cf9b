// The Hopper GEMM with a fused epilogue (hopper_gemm_kernel.cuh) behind a
// plain C++ interface, as teacher_ops.h: no CUDA headers here, no
// LibTorch in the .cu file. Built for sm_90a only (when LibTorch has
// CUDA); teacher_server/layers/fused_ops.cc is the caller and keeps the
// unfused path for every other device, dtype and shape.
#ifndef E3_KERNELS_HOPPER_GEMM_H_
#define E3_KERNELS_HOPPER_GEMM_H_

#include <cstdint>

namespace e3::kernels {

// The lm_head's target argmax without the logits: out[r] = the column c <
// vocab whose bf16-rounded logit bf16(sum_k x[r, k] w[c, k]) (fp32 sum) is
// largest, as at::argmax picks it from the stored logits (a NaN first,
// else the first maximum). bf16 x: [rows, k] with row stride x_stride, w:
// [vocab, k] with row stride w_stride (elements), 16-byte aligned, k and
// vocab multiples of 8. `keys`: rows * 8 bytes of device scratch. Runs on
// the current device and `stream`; returns false (nothing launched) when
// the device (compute capability 9.0 only) or shape is not one the kernel
// takes.
bool LinearArgmaxBf16(const void* x, int64_t x_stride, const void* w, int64_t w_stride, int64_t rows, int64_t vocab,
                      int64_t k, void* keys, int32_t* out, void* stream);

}  // namespace e3::kernels

#endif  // E3_KERNELS_HOPPER_GEMM_H_
