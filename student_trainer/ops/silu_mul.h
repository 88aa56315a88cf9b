// SiLU-mul over the fused gate/up projection of the draft's MLP:
// out = silu(gate) * up with gate_up = [gate | up] along the last
// dimension, one kernel forward and one backward on the GPU (ATen's
// silu, mul and their backward make six passes over the activations).
#ifndef E3_STUDENT_TRAINER_OPS_SILU_MUL_H_
#define E3_STUDENT_TRAINER_OPS_SILU_MUL_H_

#include "common/torch/torch_core.h"

namespace e3::ops {

// No autograd: gate_up [rows, 2 * cols] contiguous -> [rows, cols].
at::Tensor SiluMulForward(const at::Tensor& gate_up);
// d_gate_up [rows, 2 * cols] for dout [rows, cols].
at::Tensor SiluMulBackward(const at::Tensor& dout, const at::Tensor& gate_up);
// Autograd op.
at::Tensor SiluMul(const at::Tensor& gate_up);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_SILU_MUL_H_
