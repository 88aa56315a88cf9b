// The teacher's custom CUDA kernels (the `sgl` backend's; nvcc, one op
// per kernels/*.cu), behind a plain C++ interface so that neither side
// needs the other's headers: no LibTorch in the .cu files, no CUDA headers
// here. Pointers are device pointers, `stream` is a cudaStream_t. Built
// only when LibTorch has CUDA (E3_HAS_CUDA); teacher_server/layers/
// fused_ops.cc is the only caller and keeps the reference ATen op sequence
// for every other case.
//
// Each kernel reproduces the roundings of the op sequence it replaces
// (transformers' modeling_llama.py in bf16/fp16): it fuses memory passes
// and rounds to the storage dtype wherever the reference stores a tensor,
// so that a draft trained on the fast teacher sees the reference
// teacher's numbers. SiLU-mul, rope and the residual sum are bit-exact;
// the norm sums its row in another order than ATen's mean, which can move
// an output by an ulp or two.
#ifndef E3_KERNELS_TEACHER_OPS_H_
#define E3_KERNELS_TEACHER_OPS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace e3::kernels {

// Per row of `cols` elements: sum = residual + delta (rounded to the
// dtype, like a bf16 tensor add); out = weight * dtype(sum * rsqrt(mean(sum^2)
// + eps)) with the statistics in fp32 (LlamaRMSNorm). With delta null the
// add is skipped (sum is not written) and `residual` is normalised.
// Requires cols % 8 == 0 and 16-byte aligned rows; returns false (nothing
// launched) when the shape is outside what the kernel handles.
bool AddRmsNorm(Dtype dtype, const void* residual, const void* delta, const void* weight, void* sum, void* out,
                int64_t rows, int64_t cols, float eps, void* stream);

// gate_up: [rows, 2 * cols] (gate columns, then up columns), contiguous;
// out: [rows, cols] = dtype(silu(gate)) * up, silu in fp32 as at::silu.
// With row_limit (an int32 on the device, may be null) only the first
// *row_limit rows are computed and the rest of out is left unwritten: an
// expert-parallel rank's rows of a MoE layer, whose count only the device
// knows.
// SiLU comes from a per-device table of all 65536 gates' stored SiLU
// where the device has 128 KiB of shared memory per block (sm_80, sm_90),
// else from the arithmetic (same bits either way).
bool SiluMul(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t cols, const int32_t* row_limit,
             void* stream);
// Process-wide: whether SiluMul may use the table (default on). Tests
// switch it off to check the arithmetic kernel against the table's bits.
void SetSiluMulByTable(bool on);
// Whether SiluMul on the current device uses the table now (building it
// on `stream` first if this is the device's first use).
bool SiluMulByTable(void* stream);

// out[r] = x[index[r]] for rows of `cols` elements (x and out contiguous,
// index int64 [rows]), the first *row_limit rows only when row_limit is
// given (as in SiluMul). Requires cols % 8 == 0.
bool GatherRows(Dtype dtype, const void* x, const int64_t* index, void* out, int64_t rows, int64_t cols,
                const int32_t* row_limit, void* stream);

// Rotary embedding in place on x: [tokens, heads, head_dim] with element
// (t, h, d) at x + t * row_stride + h * head_stride + d. The first
// `rotary_dim` features rotate (rotate_half convention); cos/sin:
// [tokens, rotary_dim] contiguous, in the same dtype. Per element, as
// transformers: dtype(dtype(x * cos) + dtype(rotate_half(x) * sin)).
bool RopeInPlace(Dtype dtype, void* x, int64_t tokens, int64_t heads, int64_t row_stride, int64_t head_stride,
                 int64_t rotary_dim, const void* cos, const void* sin, void* stream);

// Qwen3's q/k norm followed by rope, in place on x: [tokens, heads,
// head_dim] strided as in RopeInPlace. Each head is normalised as
// AddRmsNorm (no add) normalises a row, with `weight` [head_dim], then its
// first `rotary_dim` features rotate as RopeInPlace rotates them (cos/sin
// may be null when rotary_dim is 0): the two kernels' roundings, one read
// and one write. Requires head_dim / 8 a power of two up to 32 (head_dim 8
// to 256), rotary_dim a multiple of 16, strides multiples of 8 elements and
// 16-byte aligned pointers.
bool HeadRmsNormRopeInPlace(Dtype dtype, void* x, int64_t tokens, int64_t heads, int64_t row_stride,
                            int64_t head_stride, int64_t head_dim, const void* weight, float eps, int64_t rotary_dim,
                            const void* cos, const void* sin, void* stream);

// Per row r of `cols` elements (at x + r * row_stride): out[r] = the
// index of its largest element, as at::argmax picks it: the first NaN if
// the row has one, else the first occurrence of the maximum. For the
// lm_head's target argmax: the logits are read once, at the memory's
// bandwidth (ATen's generic reduction falls well short of it).
bool RowArgmax(Dtype dtype, const void* x, int64_t rows, int64_t cols, int64_t row_stride, int32_t* out,
               void* stream);

// GPT-OSS's expert activation (clamped_swiglu.h) on a grouped gate_up
// product [rows, 2 * cols] (gate columns, then up), contiguous: with bias
// [experts, 2 * cols] and row_expert (int64 [rows]) row r's expert's bias
// is added first (both null: none); then min(gate, limit), clamp(up,
// -limit, limit), out = dtype((up + 1) * gate * sigmoid(alpha gate)),
// rounded step by step as ATen's op sequence stores each tensor. row_limit
// as in SiluMul. Requires cols % 8 == 0.
bool ClampedSwiGlu(Dtype dtype, const void* gate_up, const void* bias, const int64_t* row_expert, void* out,
                   int64_t rows, int64_t cols, float alpha, float limit, const int32_t* row_limit, void* stream);

// The routed-experts sum of a MoE layer: out[t] = sum over r < k, in r
// order starting from 0, of dtype(y[rows[t * k + r]] * weights[t * k + r]),
// the sum rounded to the dtype after each add (SparseMoe's per-expert
// index_add). Slots whose `valid` byte is 0 add nothing (valid may be null:
// every slot counts). y: [*, cols] contiguous; rows int64 and weights
// [tokens * k], in the dtype or, with fp32_weights, in fp32 (DeepSeekMoE:
// the product of the fp32 weight and the widened output, then rounded);
// out [tokens, cols]. Requires cols % 8 == 0.
bool MoeCombine(Dtype dtype, const void* y, const int64_t* rows, const void* weights, bool fp32_weights,
                const uint8_t* valid, void* out, int64_t tokens, int64_t k, int64_t cols, void* stream);

}  // namespace e3::kernels

#endif  // E3_KERNELS_TEACHER_OPS_H_
