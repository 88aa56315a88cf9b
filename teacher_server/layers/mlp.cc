#include "teacher_server/layers/mlp.h"

#include "teacher_server/layers/linear.h"

namespace e3 {

at::Tensor SwiGluMlp(const at::Tensor& x, const MlpWeights& w) {
  return Linear(at::silu(Linear(x, w.gate_proj, w.gate_bias)) * Linear(x, w.up_proj, w.up_bias), w.down_proj,
                w.down_bias);
}

}  // namespace e3
