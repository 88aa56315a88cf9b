// The gated SiLU MLP of Llama-family models: down(silu(gate(x)) * up(x)).
#ifndef E3_TEACHER_SERVER_LAYERS_MLP_H_
#define E3_TEACHER_SERVER_LAYERS_MLP_H_

#include <torch/torch.h>

namespace e3 {

struct MlpWeights {
  at::Tensor gate_proj, up_proj, down_proj;  // [out, in]
  at::Tensor gate_bias, up_bias, down_bias;  // undefined when absent
};

at::Tensor SwiGluMlp(const at::Tensor& x, const MlpWeights& w);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_MLP_H_
