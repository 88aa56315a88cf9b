#include "common/torch/rope.h"

#include <algorithm>
#include <cmath>

namespace e3::rope {
namespace {

constexpr double kPi = 3.14159265358979323846;

// All inverse-frequency arithmetic below is fp32 tensor arithmetic, as in
// transformers, so the results agree to the last bit where possible. Python's
// `scalar / tensor` is `tensor.reciprocal() * scalar`, hence RDiv.
at::Tensor RDiv(double numerator, const at::Tensor& t) { return t.reciprocal() * numerator; }
at::Tensor BaseInvFreq(double theta, int64_t dim) {
  at::Tensor exponent =
      torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(dim);
  return torch::pow(theta, exponent).reciprocal();
}

double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// transformers' find_correction_dim: the dimension at which a frequency
// completes `rotations` turns over the original context.
double YarnCorrectionDim(double rotations, int64_t dim, double base, double max_pos) {
  return (static_cast<double>(dim) * std::log(max_pos / (rotations * 2.0 * kPi))) /
         (2.0 * std::log(base));
}

}  // namespace

InvFrequencies ComputeInvFrequencies(const RopeConfig& rope, int64_t dim) {
  InvFrequencies out;
  switch (rope.type) {
    case RopeType::kDefault:
      out.inv_freq = BaseInvFreq(rope.theta, dim);
      break;
    case RopeType::kLinear:
      out.inv_freq = BaseInvFreq(rope.theta, dim) / rope.factor;
      break;
    case RopeType::kLlama3: {
      // _compute_llama3_parameters: keep high frequencies, divide low ones by
      // `factor`, interpolate smoothly in between.
      at::Tensor inv_freq = BaseInvFreq(rope.theta, dim);
      const double old_ctx = static_cast<double>(rope.original_max_position_embeddings);
      const double low_freq_wavelen = old_ctx / rope.low_freq_factor;
      const double high_freq_wavelen = old_ctx / rope.high_freq_factor;
      at::Tensor wavelen = RDiv(2 * kPi, inv_freq);
      at::Tensor llama = torch::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
      at::Tensor smooth = (RDiv(old_ctx, wavelen) - rope.low_freq_factor) /
                          (rope.high_freq_factor - rope.low_freq_factor);
      at::Tensor smoothed = (1 - smooth) * llama / rope.factor + smooth * llama;
      at::Tensor is_medium =
          (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
      out.inv_freq = torch::where(is_medium, smoothed, llama);
      break;
    }
    case RopeType::kYarn: {
      // _compute_yarn_parameters (transformers 5).
      const double factor = rope.factor;
      if (rope.attention_factor.has_value()) {
        out.attention_scaling = *rope.attention_factor;
      } else if (rope.mscale.has_value() && rope.mscale_all_dim.has_value() && *rope.mscale != 0 &&
                 *rope.mscale_all_dim != 0) {
        out.attention_scaling =
            YarnMscale(factor, *rope.mscale) / YarnMscale(factor, *rope.mscale_all_dim);
      } else {
        out.attention_scaling = YarnMscale(factor, 1.0);
      }
      const double max_pos = static_cast<double>(rope.original_max_position_embeddings);
      double low = YarnCorrectionDim(rope.beta_fast, dim, rope.theta, max_pos);
      double high = YarnCorrectionDim(rope.beta_slow, dim, rope.theta, max_pos);
      if (rope.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // avoid a zero-width ramp
      at::Tensor pos_freqs =
          torch::pow(rope.theta, torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) /
                                     static_cast<double>(dim));
      at::Tensor extrapolation = pos_freqs.reciprocal();
      at::Tensor interpolation = (factor * pos_freqs).reciprocal();
      at::Tensor ramp = ((torch::arange(dim / 2, torch::kFloat) - low) / (high - low)).clamp(0, 1);
      at::Tensor extrapolation_factor = 1 - ramp;
      out.inv_freq =
          interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
      break;
    }
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> CosSin(const InvFrequencies& freqs,
                                         const at::Tensor& position_ids, at::ScalarType dtype) {
  // LlamaRotaryEmbedding.forward: fp32 outer product, cat(freqs, freqs).
  at::Tensor angles = position_ids.to(at::kFloat).unsqueeze(1) * freqs.inv_freq.unsqueeze(0);
  at::Tensor emb = torch::cat({angles, angles}, -1);
  at::Tensor cos = emb.cos() * freqs.attention_scaling;
  at::Tensor sin = emb.sin() * freqs.attention_scaling;
  return {cos.to(dtype), sin.to(dtype)};
}

at::Tensor Apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rotary_dim = cos.size(-1);
  const int64_t head_dim = x.size(-1);
  at::Tensor r = rotary_dim == head_dim ? x : x.narrow(-1, 0, rotary_dim);
  const int64_t half = rotary_dim / 2;
  at::Tensor x1 = r.narrow(-1, 0, half);
  at::Tensor x2 = r.narrow(-1, half, half);
  at::Tensor rotated = torch::cat({-x2, x1}, -1);
  // cos/sin [T, D] broadcast over heads.
  at::Tensor out = r * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
  if (rotary_dim == head_dim) return out;
  return torch::cat({out, x.narrow(-1, rotary_dim, head_dim - rotary_dim)}, -1);
}

}  // namespace e3::rope
