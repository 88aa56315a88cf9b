#include "teacher_server/layers/clamped_swiglu.h"

namespace e3 {
namespace {

// transformers computes `x @ W + b`: the product, then the bias added.
at::Tensor LinearThenBias(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  at::Tensor y = at::matmul(x, w.t());
  return bias.defined() ? y + bias : y;
}

}  // namespace

at::Tensor ClampedSwiGluMlp(const at::Tensor& x, const MlpWeights& w, const ClampedSwiGlu& act) {
  const at::Tensor gate = LinearThenBias(x, w.gate_proj, w.gate_bias).clamp_max(act.limit);
  const at::Tensor up = LinearThenBias(x, w.up_proj, w.up_bias).clamp(-act.limit, act.limit);
  const at::Tensor glu = gate * at::sigmoid(gate * act.alpha);
  return LinearThenBias((up + 1) * glu, w.down_proj, w.down_bias);
}

}  // namespace e3
