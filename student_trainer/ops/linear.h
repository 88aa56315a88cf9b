// A linear layer of the fast TTT step whose weight gradient bypasses
// autograd: backward adds dy^T x straight into `weight_grad` (a view of the
// flat gradient buffer, student_trainer/draft/flat_parameters.h) with one GEMM
// that accumulates (beta = 1). Autograd would instead make a new gradient
// tensor at every TTT step and add it in a separate pass; with seven steps
// that is seven allocations and seven extra reads and writes of every
// weight's gradient.
#ifndef E3_STUDENT_TRAINER_OPS_LINEAR_H_
#define E3_STUDENT_TRAINER_OPS_LINEAR_H_

#include "common/torch/torch_core.h"

namespace e3::ops {

// y = x @ weight^T + residual (residual may be undefined; on the GPU it is
// cuBLASLt's epilogue input, read in place: common/torch/gemm.h), x [rows, in],
// weight [out, in] (any strides the GEMM takes, e.g. a column block of a
// fused weight), weight_grad laid out as weight. `anchor` is the flat
// parameters' autograd edge (FlatParameters::anchor()): an input that
// requires grad, so that y requires grad even where x does not (the fc
// projection of the teacher's states). Its own gradient stays undefined.
at::Tensor LinearAccumulate(const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& weight_grad, const at::Tensor& anchor,
                            const at::Tensor& residual = at::Tensor());

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_LINEAR_H_
