#include "teacher_server/layers/rotary.h"

#include "common/torch/rope.h"

namespace e3 {

// The arithmetic lives in common/torch/rope.cc so that the student's draft
// computes the target's rope with the same code.
RopeFrequencies ComputeRopeFrequencies(const RopeConfig& rope, int64_t dim) {
  rope::InvFrequencies f = rope::ComputeInvFrequencies(rope, dim);
  RopeFrequencies out;
  out.inv_freq = f.inv_freq;
  out.attention_scaling = f.attention_scaling;
  return out;
}

RotaryEmbedding::RotaryEmbedding(const RopeConfig& rope, int64_t rotary_dim,
                                 const at::Device& device)
    : freqs_(ComputeRopeFrequencies(rope, rotary_dim)) {
  freqs_.inv_freq = freqs_.inv_freq.to(device);
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::CosSin(const at::Tensor& position_ids,
                                                          at::ScalarType dtype) const {
  return rope::CosSin(rope::InvFrequencies{freqs_.inv_freq, freqs_.attention_scaling}, position_ids,
                      dtype);
}

at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return rope::Apply(x, cos, sin);
}

}  // namespace e3
