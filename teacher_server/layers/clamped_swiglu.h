// GPT-OSS's expert MLP: a SwiGLU whose gate is clamped from above and whose
// up projection is clamped on both sides, with a sigmoid gain alpha and
// (up + 1) in place of up, and biases on every projection:
//   down((up + 1) * gate * sigmoid(alpha * gate)) + down_bias,
//   gate = min(x W_g^T + b_g, limit), up = clamp(x W_u^T + b_u, -limit, limit)
// (transformers 5.17 modeling_gpt_oss.py GptOssExperts._apply_gate). The
// checkpoints interleave gate and up in one gate_up_proj (gate in even
// columns, up in odd ones); the loader de-interleaves them into MlpWeights'
// gate_proj and up_proj, which computes the same dot products; the sgl
// backend fuses those again as [gate; up] (FuseGateUp's order), for one
// product and for the grouped experts (moe.h GroupedMoe).
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
// caller all-reduces the partial sums). An undefined bias is skipped. w
// has gate_proj and up_proj (with their biases), or gate_up_proj (and
// gate_up_bias) as FuseGateUp makes them.
at::Tensor ClampedSwiGluMlp(const at::Tensor& x, const MlpWeights& w, const ClampedSwiGlu& act);

// The activation alone, from gate_up [..., 2I] (gate, then up, their biases
// already added): (clamp(up) + 1) * g * sigmoid(alpha g), g = min(gate,
// limit), op by op in gate_up's dtype as ClampedSwiGluMlp computes it.
at::Tensor ClampedSwiGluActivation(const at::Tensor& gate_up, const ClampedSwiGlu& act);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_CLAMPED_SWIGLU_H_
