// The gated SiLU MLP of Llama-family models: down(silu(gate(x)) * up(x)).
#ifndef E3_TEACHER_SERVER_LAYERS_MLP_H_
#define E3_TEACHER_SERVER_LAYERS_MLP_H_

#include "common/torch/gemm.h"
#include "common/torch/torch_core.h"

namespace e3 {

struct MlpWeights {
  at::Tensor gate_proj, up_proj, down_proj;  // [out, in]
  at::Tensor gate_bias, up_bias, down_bias;  // undefined when absent
  // Set by FuseGateUp: [2I, in] (gate rows, then up rows); gate/up_proj
  // are then released.
  at::Tensor gate_up_proj, gate_up_bias;
};

void FuseGateUp(MlpWeights* w);

// With `fused_activation`, silu(gate) * up is one kernel on CUDA
// (fused_ops.h). `gemm` picks the projections' GEMM (gemm.h); a
// defined `residual` is added to the output in the down_proj GEMM.
at::Tensor SwiGluMlp(const at::Tensor& x, const MlpWeights& w, bool fused_activation = false,
                     GemmPath gemm = GemmPath::kAten, const at::Tensor& residual = at::Tensor());

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_MLP_H_
