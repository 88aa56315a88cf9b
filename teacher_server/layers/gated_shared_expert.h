// The shared expert of Qwen2-MoE, Qwen3-Next and Qwen3.5-MoE: a SwiGLU MLP
// every token passes through, scaled per token by sigmoid(x . g) (the
// checkpoint's shared_expert_gate [1, H]) and added to the routed experts'
// output, as transformers' SparseMoeBlock adds it:
//   out = routed + sigmoid(x g^T) * mlp(x)      (all in x's dtype)
#ifndef E3_TEACHER_SERVER_LAYERS_GATED_SHARED_EXPERT_H_
#define E3_TEACHER_SERVER_LAYERS_GATED_SHARED_EXPERT_H_

#include "common/torch/torch_core.h"
#include "teacher_server/layers/mlp.h"

namespace e3 {

struct GatedSharedExpert {
  MlpWeights mlp;
  at::Tensor gate;  // [1, H]
};

// x [T, H], routed [T, H] (the routed experts' sum). `fused_activation` as
// in SwiGluMlp.
at::Tensor AddGatedSharedExpert(const at::Tensor& x, const at::Tensor& routed,
                                const GatedSharedExpert& w, bool fused_activation = false);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_GATED_SHARED_EXPERT_H_
