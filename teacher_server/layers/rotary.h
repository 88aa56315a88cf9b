// Rotary position embeddings: inverse frequencies for the rope types of
// transformers' modeling_rope_utils.py (default, linear, llama3, yarn), and
// their application to q/k with rotate_half, in HF's precision.
#ifndef E3_TEACHER_SERVER_LAYERS_ROTARY_H_
#define E3_TEACHER_SERVER_LAYERS_ROTARY_H_

#include <utility>

#include "common/model/model_config.h"
#include "common/torch/torch_core.h"

namespace e3 {

struct RopeFrequencies {
  at::Tensor inv_freq;             // [rotary_dim / 2] fp32
  double attention_scaling = 1.0;  // multiplies cos and sin (yarn)
};

RopeFrequencies ComputeRopeFrequencies(const RopeConfig& rope, int64_t rotary_dim);

class RotaryEmbedding {
 public:
  RotaryEmbedding(const RopeConfig& rope, int64_t rotary_dim, const at::Device& device);
  // cos and sin [T, rotary_dim] for the positions, in `dtype`.
  std::pair<at::Tensor, at::Tensor> CosSin(const at::Tensor& position_ids, at::ScalarType dtype) const;

 private:
  RopeFrequencies freqs_;
};

// x is [T, heads, head_dim]; cos and sin are [T, head_dim].
at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_ROTARY_H_
