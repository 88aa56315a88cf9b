// Rotary position embeddings shared by the teacher's layers and the
// student's draft: inverse frequencies for the rope types of transformers'
// modeling_rope_utils.py (default, linear, llama3, yarn), cos/sin tables
// and rotate_half application, all in HF's precision.
//
// The draft must use exactly the target's rope (SGLang and vLLM run it with
// the target's config), so both services compute it with this one code.
#ifndef E3_COMMON_TORCH_ROPE_H_
#define E3_COMMON_TORCH_ROPE_H_

#include <cstdint>
#include <utility>

#include "common/model/model_config.h"
#include "common/torch/torch_core.h"

namespace e3::rope {

struct InvFrequencies {
  at::Tensor inv_freq;             // [rotary_dim / 2] fp32, CPU
  double attention_scaling = 1.0;  // multiplies cos and sin (yarn)
};

InvFrequencies ComputeInvFrequencies(const RopeConfig& rope, int64_t rotary_dim);

// cos and sin [T, rotary_dim] for `position_ids` [T], computed in fp32 as
// LlamaRotaryEmbedding.forward does, then cast to `dtype`. `freqs.inv_freq`
// must be on the positions' device.
std::pair<at::Tensor, at::Tensor> CosSin(const InvFrequencies& freqs,
                                         const at::Tensor& position_ids, at::ScalarType dtype);

// x is [T, heads, head_dim]; cos and sin are [T, rotary_dim] with
// rotary_dim <= head_dim. Rotates the first rotary_dim dims (rotate_half,
// as in HF's apply_rotary_pos_emb) and passes the rest through (partial
// rotary). Differentiable.
at::Tensor Apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace e3::rope

#endif  // E3_COMMON_TORCH_ROPE_H_
