#include "teacher_server/layers/mlp.h"

#include "teacher_server/layers/fused_ops.h"

namespace e3 {

void FuseGateUp(MlpWeights* w) {
  w->gate_up_proj = torch::cat({w->gate_proj, w->up_proj}, 0);
  if (w->gate_bias.defined()) w->gate_up_bias = torch::cat({w->gate_bias, w->up_bias}, 0);
  w->gate_proj = w->up_proj = at::Tensor();
  w->gate_bias = w->up_bias = at::Tensor();
}

at::Tensor SwiGluMlp(const at::Tensor& x, const MlpWeights& w, bool fused_activation, GemmPath gemm,
                     const at::Tensor& residual) {
  at::Tensor act;
  if (w.gate_up_proj.defined()) {
    act = SiluMul(Gemm(x, w.gate_up_proj, w.gate_up_bias, at::Tensor(), gemm), fused_activation);
  } else {
    act = at::silu(Gemm(x, w.gate_proj, w.gate_bias, at::Tensor(), gemm)) *
          Gemm(x, w.up_proj, w.up_bias, at::Tensor(), gemm);
  }
  return Gemm(act, w.down_proj, w.down_bias, residual, gemm);
}

}  // namespace e3
