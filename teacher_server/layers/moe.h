// The routed mixture-of-experts MLP of Mixtral and Qwen3-MoE: a router
// picks top-k experts per token; each expert is a SwiGLU MLP; the outputs
// are summed with the router's weights. Under expert parallelism a rank
// holds only some experts (and under TP a slice of each); it returns the
// partial sum of its experts, which the caller all-reduces.
#ifndef E3_TEACHER_SERVER_LAYERS_MOE_H_
#define E3_TEACHER_SERVER_LAYERS_MOE_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "teacher_server/layers/mlp.h"

namespace e3 {

struct MoeWeights {
  at::Tensor router;                // [num_experts, H]: every expert, so every rank routes alike
  int64_t first_expert = 0;         // global id of experts[0]
  std::vector<MlpWeights> experts;  // this rank's experts, in id order
};

struct MoeRouting {
  int64_t top_k = 0;
  bool normalize = true;  // renormalise the chosen k probabilities to sum to 1
};

// x: [T, H]. Follows transformers' numerics: router logits in x's dtype,
// softmax in fp32, top-k, optional renormalisation, weights cast to x's
// dtype; experts accumulated in id order with index_add.
// `fused_activation` as in SwiGluMlp.
at::Tensor SparseMoe(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing,
                     bool fused_activation = false);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_MOE_H_
