#include "teacher_server/layers/clamped_swiglu.h"

namespace e3 {
namespace {

// transformers computes `x @ W + b`: the product, then the bias added.
at::Tensor LinearThenBias(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  at::Tensor y = at::matmul(x, w.t());
  return bias.defined() ? y + bias : y;
}

// The activation from gate and up (biases added).
at::Tensor Activation(const at::Tensor& gate_in, const at::Tensor& up_in, const ClampedSwiGlu& act) {
  const at::Tensor gate = gate_in.clamp_max(act.limit);
  const at::Tensor up = up_in.clamp(-act.limit, act.limit);
  const at::Tensor glu = gate * at::sigmoid(gate * act.alpha);
  return (up + 1) * glu;
}

}  // namespace

at::Tensor ClampedSwiGluActivation(const at::Tensor& gate_up, const ClampedSwiGlu& act) {
  const int64_t I = gate_up.size(-1) / 2;
  return Activation(gate_up.narrow(-1, 0, I), gate_up.narrow(-1, I, I), act);
}

at::Tensor ClampedSwiGluMlp(const at::Tensor& x, const MlpWeights& w, const ClampedSwiGlu& act) {
  const at::Tensor glu =
      w.gate_up_proj.defined()
          ? ClampedSwiGluActivation(LinearThenBias(x, w.gate_up_proj, w.gate_up_bias), act)
          : Activation(LinearThenBias(x, w.gate_proj, w.gate_bias), LinearThenBias(x, w.up_proj, w.up_bias), act);
  return LinearThenBias(glu, w.down_proj, w.down_bias);
}

}  // namespace e3
