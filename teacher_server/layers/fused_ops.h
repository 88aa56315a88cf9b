// The `sgl` backend's fused element-wise steps: residual add + RMSNorm,
// SiLU-and-multiply, rotary embedding in place, and the lm_head's row
// argmax (from logits, or fused into the lm_head GEMM). With `fused` set
// and a CUDA bf16/fp16 tensor the step is one custom kernel (kernels/);
// everywhere else (CPU, fp32, a build without CUDA, a shape the kernel
// does not take) it is the reference op sequence of transformers, so the
// CPU suite runs the same control flow. Both round at the same points
// (see kernels/teacher_ops.h for the one difference: the norm's reduction
// order).
#ifndef E3_TEACHER_SERVER_LAYERS_FUSED_OPS_H_
#define E3_TEACHER_SERVER_LAYERS_FUSED_OPS_H_

#include "common/torch/torch_core.h"
#include "teacher_server/layers/clamped_swiglu.h"

namespace e3 {

// Whether this build has the custom CUDA kernels.
bool FusedKernelsBuilt();
// Whether the kernels (and the fused attention calls, which need the same
// hardware) run on this device: a CUDA build, a CUDA device of compute
// capability 8.0 or newer (the kernels are built for sm_80 and sm_90).
bool FusedKernelsRunOn(const at::Device& device);
// How many custom-kernel launches this process has made (all threads): the
// tests' proof that the kernel, not the fallback, ran.
int64_t FusedKernelLaunches();

// *h <- *h + delta (when delta is defined; *h becomes a new tensor, never
// written in place, so earlier references such as captured aux states keep
// their values), then returns LlamaRMSNorm(*h) with `weight`.
at::Tensor AddRmsNorm(at::Tensor* h, const at::Tensor& delta, const at::Tensor& weight, double eps, bool fused);

// gate_up: [..., 2I] (gate, then up). Returns silu(gate) * up: [..., I].
// `row_limit` (an int32 tensor of one element on gate_up's device, or
// undefined): only the first row_limit rows of a 2-D gate_up are needed.
// The kernel then leaves the other rows of the result unwritten, without
// reading the count on the host (a MoE layer's rows of this
// expert-parallel rank); the reference ops compute every row.
at::Tensor SiluMul(const at::Tensor& gate_up, bool fused, const at::Tensor& row_limit = at::Tensor());
// The SiLU-mul kernel's two forms (kernels/teacher_ops.h): whether it
// may look SiLU up in its table (process-wide; tests switch the table off
// to check the arithmetic form), and whether it does on `device` now.
void SetSiluMulByTable(bool on);
bool SiluMulByTable(const at::Device& device);

// x.index_select(0, index) for x [N, H] and int64 index [P]; with
// row_limit as in SiluMul (rows past it unwritten by the kernel). The
// kernel does not check the indices (index_select does): callers pass
// indices they computed, such as GroupedMoe's pair order.
at::Tensor GatherRows(const at::Tensor& x, const at::Tensor& index, const at::Tensor& row_limit, bool fused);

// GPT-OSS's expert activation on a grouped gate_up product [P, 2I]
// (gate, then up): with `bias` [E, 2I] and `row_expert` [P] (int64), each
// row's expert's bias added first (a rounding, as the loop adds it after
// its product; both undefined: none), then ClampedSwiGluActivation. With
// `fused` on CUDA one kernel, else that op sequence; row_limit as in
// SiluMul.
at::Tensor BiasClampedSwiGlu(const at::Tensor& gate_up, const at::Tensor& bias, const at::Tensor& row_expert,
                             const ClampedSwiGlu& act, bool fused, const at::Tensor& row_limit = at::Tensor());

// A MoE layer's sum over each token's k experts: y [P, H] holds the
// experts' outputs, rows [T, k] (int64) the row of y of each token's r-th
// choice, weights [T, k] their router weights (y's dtype, or fp32: each
// product then in fp32 and rounded to y's dtype), valid [T, k]
// (bool, or undefined: all) whether the choice counts. Returns [T, H]:
// for r in order, out += dtype(y[rows[t, r]] * weights[t, r]), each add
// rounded to the dtype. With `fused` on CUDA one kernel, else that op
// sequence.
at::Tensor MoeCombine(const at::Tensor& y, const at::Tensor& rows, const at::Tensor& weights,
                      const at::Tensor& valid, bool fused);

// x: [T, heads, head_dim], possibly a strided view (of a fused qkv
// product); rotates its first cos.size(-1) features in place.
// cos/sin: [T, rotary_dim] in x's dtype.
void RopeInPlace(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool fused);

// Qwen3's per-head q/k RMSNorm (LlamaRMSNorm over head_dim with `weight`)
// and then rope, on x: [T, heads, head_dim], possibly a strided view of
// the fused qkv product. With `fused` on CUDA one kernel that reads and
// writes x once, in place (the norm alone takes five ATen passes);
// elsewhere RmsNorm (a new tensor) and then RopeInPlace. Returns the
// result. The norm's sum of squares runs in another order than ATen's
// mean, as in AddRmsNorm.
at::Tensor HeadRmsNormRope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                           const at::Tensor& sin, bool fused);

// logits: [rows, cols], unit stride along cols. Returns the per-row
// argmax as int32 [rows], exactly at::argmax's (first NaN, else first
// maximum); with `fused` on CUDA one bandwidth-bound kernel.
at::Tensor RowArgmax(const at::Tensor& logits, bool fused);

// The lm_head's target argmax without the logits: x [rows, H] and the head
// w [V, H], bf16 on a Hopper GPU, in one GEMM whose epilogue keeps each
// row's best column (kernels/hopper_gemm.h), so the [rows, V] logits never
// reach memory. The answer is RowArgmax's on the bf16 logits x w^T (ties
// and NaNs included). Returns an undefined tensor when the kernel does not
// take the inputs (CPU, another dtype or GPU, a layout it cannot read);
// the caller then computes the logits.
at::Tensor LinearArgmax(const at::Tensor& x, const at::Tensor& w);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_FUSED_OPS_H_
