// RMSNorm for the fast TTT step (transformers' LlamaRMSNorm numerics:
// statistics in fp32, the normalised row rounded to the dtype before the
// weight), forward and backward in one kernel each on the GPU, with the
// weight gradient added into the flat gradient buffer.
#ifndef E3_STUDENT_TRAINER_OPS_RMS_NORM_H_
#define E3_STUDENT_TRAINER_OPS_RMS_NORM_H_

#include <utility>

#include "common/torch/torch_core.h"

namespace e3::ops {

struct RmsNormResult {
  at::Tensor y;     // [rows, cols], x's dtype
  at::Tensor rstd;  // [rows], fp32 (fp64 for fp64 x): rsqrt(mean(x^2) + eps)
};

// No autograd: x [rows, cols] (rows may be strided), weight [cols] in x's dtype.
RmsNormResult RmsNormForward(const at::Tensor& x, const at::Tensor& weight, double eps);
// {dx in x's dtype, dw in rstd's dtype} for dy [rows, cols]. A defined
// `dresidual` (x's shape and dtype) is the gradient of a residual path
// that also read x: dx includes it, added in fp32 before dx is rounded.
std::pair<at::Tensor, at::Tensor> RmsNormBackward(const at::Tensor& dy, const at::Tensor& x,
                                                  const at::Tensor& rstd, const at::Tensor& weight,
                                                  const at::Tensor& dresidual = {});
// The same with dx written into `dx` (contiguous, x's shape and dtype: a
// range of rows of a larger tensor, say); returns dw.
at::Tensor RmsNormBackwardInto(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& rstd,
                               const at::Tensor& weight, const at::Tensor& dx,
                               const at::Tensor& dresidual = {});

// Autograd op: y = RmsNormForward(x).y; backward returns dx and adds dw
// into weight_grad. `anchor` as in ops::LinearAccumulate.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_grad,
                   const at::Tensor& anchor, double eps);

// Autograd op over x [..., cols] (any leading dims) for a model whose
// parameters take ordinary gradients: the backward returns the weight's
// gradient (summed in fp32, then in the weight's dtype) beside dx.
at::Tensor RmsNormTrainable(const at::Tensor& x, const at::Tensor& weight, double eps);

// RmsNorm(x) and x itself, for a block whose residual add reads x:
// autograd would sum the two paths' gradients of x in a kernel of its own;
// here the norm's backward kernel adds the residual's gradient into dx.
struct NormedWithResidual {
  at::Tensor normed;    // RmsNorm(x)
  at::Tensor residual;  // x's values; pass it, not x, to the residual add
};
NormedWithResidual RmsNormWithResidual(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& weight_grad, const at::Tensor& anchor,
                                       double eps);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_RMS_NORM_H_
