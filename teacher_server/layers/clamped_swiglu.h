// GPT-OSS's expert MLP: a SwiGLU whose gate is clamped from above and whose
// up projection is clamped on both sides, with a sigmoid gain alpha and
// (up + 1) in place of up, and biases on every projection:
//   down((up + 1) * gate * sigmoid(alpha * gate)) + down_bias,
//   gate = min(x W_g^T + b_g, limit), up = clamp(x W_u^T + b_u, -limit, limit)
// (transformers 5.17 modeling_gpt_oss.py GptOssExperts._apply_gate). The
// checkpoints interleave gate and up in one gate_up_proj (gate in even
// columns, up in odd ones); the loader de-interleaves them into MlpWeights'
// gate_proj and up_proj, which computes the same dot products.
#ifndef E3_TEACHER_SERVER_LAYERS_CLAMPED_SWIGLU_H_
#define E3_TEACHER_SERVER_LAYERS_CLAMPED_SWIGLU_H_

#include "common/torch/torch_core.h"
#include "teacher_server/layers/mlp.h"

namespace e3 {

struct ClampedSwiGlu {
  double alpha = 1.702;
  double limit = 7.0;
};

// x: [T, H] -> [T, H]. Under tensor parallelism w holds a slice of the
// intermediate dimension and down_bias only on the rank that adds it (the
// caller all-reduces the partial sums). An undefined bias is skipped.
at::Tensor ClampedSwiGluMlp(const at::Tensor& x, const MlpWeights& w, const ClampedSwiGlu& act);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_CLAMPED_SWIGLU_H_
