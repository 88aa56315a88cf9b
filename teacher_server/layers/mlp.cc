#include "teacher_server/layers/mlp.h"

#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/linear.h"

namespace e3 {

void FuseGateUp(MlpWeights* w) {
  w->gate_up_proj = torch::cat({w->gate_proj, w->up_proj}, 0);
  if (w->gate_bias.defined()) w->gate_up_bias = torch::cat({w->gate_bias, w->up_bias}, 0);
  w->gate_proj = w->up_proj = at::Tensor();
  w->gate_bias = w->up_bias = at::Tensor();
}

at::Tensor SwiGluMlp(const at::Tensor& x, const MlpWeights& w, bool fused_activation) {
  if (w.gate_up_proj.defined()) {
    return Linear(SiluMul(Linear(x, w.gate_up_proj, w.gate_up_bias), fused_activation), w.down_proj, w.down_bias);
  }
  return Linear(at::silu(Linear(x, w.gate_proj, w.gate_bias)) * Linear(x, w.up_proj, w.up_bias), w.down_proj,
                w.down_bias);
}

}  // namespace e3
