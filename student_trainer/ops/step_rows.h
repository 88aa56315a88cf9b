// A projection computed once per batch whose rows every TTT step gathers:
// the embedding half of q/k/v (step j's row t reads position t + j + 1's
// normalised embedding, the same rows shifted).
//
// With plain autograd each step's index_select has its own backward: an
// index_add of the step's gradient into a new zero tensor of the whole
// projection (16-bit atomics), then adds of those tensors, one of each per
// TTT step. Here each step's backward adds its rows into one fp32 sum
// (StepRowsGradient), and the projection's backward, which autograd runs
// only after all of its consumers', reads that sum once: one zero fill,
// one scatter-add per step, one cast. Gradients sum in fp32 instead of the
// activation dtype.
#ifndef E3_STUDENT_TRAINER_OPS_STEP_ROWS_H_
#define E3_STUDENT_TRAINER_OPS_STEP_ROWS_H_

#include <memory>

#include "common/torch/torch_core.h"

namespace e3::ops {

// The steps' gradients of a projection, summed by row.
class StepRowsGradient {
 public:
  StepRowsGradient(int64_t rows, int64_t cols, const at::TensorOptions& options);
  // sum[rows[i]] += dy[i] (rows int64 on dy's device, distinct: the CUDA
  // kernel adds without atomics).
  void Add(const at::Tensor& rows, const at::Tensor& dy);
  // The sum in `dtype`, then forgets it; undefined when nothing was added.
  at::Tensor Take(at::ScalarType dtype);

 private:
  int64_t rows_, cols_;
  at::TensorOptions options_;  // the sum's: fp32 (fp64 for fp64 activations)
  at::Tensor sum_;
};

struct ProjectedForSteps {
  at::Tensor projection;  // [R, out]; read it only through GatherStepRows
  std::shared_ptr<StepRowsGradient> gradient;
};

// RmsNorm(input) @ weight^T for input [R, in] that takes no gradient (the
// frozen embeddings), norm and projection as RmsNorm and LinearAccumulate
// (rms_norm.h, linear.h): both weights' gradients are accumulated into
// norm_grad and weight_grad in place, `anchor` gives the result an
// autograd edge, and the output gradient is what the steps'
// GatherStepRows backward added (anything else autograd passes is
// ignored). The norm weight's gradient is taken in weight space:
// with G = dP^T @ xhat, xhat = dtype(input * rstd) (the norm's rounded
// rows, recomputed in the backward),
//   d weight = G * norm_weight (each column scaled),
//   d norm_weight[c] = sum_n weight[n, c] * G[n, c],
// the same sums as the token-space dy = dP @ weight followed by the norm's
// backward, without that GEMM (rows x out x in multiply-adds) or the
// norm's backward pass over the rows: one pass over the weight instead.
ProjectedForSteps ProjectNormedForSteps(const at::Tensor& input, const at::Tensor& norm_weight,
                                        const at::Tensor& norm_grad, const at::Tensor& weight,
                                        const at::Tensor& weight_grad, const at::Tensor& anchor, double eps);

// projection.index_select(0, rows) whose backward adds into the shared sum;
// rows distinct. Where the host knows them to be the range [first_row,
// first_row + n) (one long sample), the rows are a view instead: no copy,
// and the GEMM that adds them reads them in place.
at::Tensor GatherStepRows(const ProjectedForSteps& p, const at::Tensor& rows, int64_t first_row = -1);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_STEP_ROWS_H_
