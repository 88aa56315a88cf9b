#include "teacher_server/layers/gated_delta_net.h"

#include <cmath>
#include <string>

#include "teacher_server/layers/causal_conv1d.h"
#include "teacher_server/layers/gated_delta_rule.h"

namespace e3 {
namespace {

void CheckWeight(const at::Tensor& t, const char* name, at::IntArrayRef expected) {
  TORCH_CHECK(t.defined(), "Gated DeltaNet: no ", name);
  TORCH_CHECK(t.sizes() == expected, "Gated DeltaNet: ", name, " is ", t.sizes(), ", expected ",
              expected);
}

// x * rsqrt(sum(x^2) + 1e-6) over the last dimension.
at::Tensor L2Normalize(const at::Tensor& x) {
  return x * at::rsqrt(x.square().sum(-1, true) + 1e-6);
}

// dtype(weight * dtype(rmsnorm(o))) * silu(z), rounded to z's dtype: the
// norm over each value head's Dv, the weight applied in the model dtype.
at::Tensor GatedRmsNorm(const at::Tensor& o, const at::Tensor& z, const at::Tensor& weight,
                        double eps) {
  const at::ScalarType f = o.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor of = o.to(f);
  const at::Tensor normed = weight.to(z.scalar_type()) *
                            of.mul(at::rsqrt(of.square().mean(-1, true) + eps)).to(z.scalar_type());
  return (normed.to(f) * at::silu(z.to(f))).to(z.scalar_type());
}

}  // namespace

void FromQwen3NextProjections(const at::Tensor& in_proj_qkvz, const at::Tensor& in_proj_ba,
                              const GatedDeltaNetShape& shape, GatedDeltaNetWeights* w) {
  const int64_t nk = shape.key_heads, dk = shape.key_dim;
  TORCH_CHECK(nk > 0 && shape.value_heads % nk == 0, "Gated DeltaNet: value heads (",
              shape.value_heads, ") must be a multiple of key heads (", nk, ")");
  const int64_t rdv = shape.value_heads / nk * shape.value_dim, r = shape.value_heads / nk;
  const int64_t H = in_proj_qkvz.size(-1);
  CheckWeight(in_proj_qkvz, "in_proj_qkvz", {nk * (2 * dk + 2 * rdv), H});
  CheckWeight(in_proj_ba, "in_proj_ba", {nk * 2 * r, H});
  const auto qkvz =
      in_proj_qkvz.view({nk, 2 * dk + 2 * rdv, H}).split_with_sizes({dk, dk, rdv, rdv}, 1);
  const auto ba = in_proj_ba.view({nk, 2 * r, H}).split_with_sizes({r, r}, 1);
  auto rows = [H](const at::Tensor& t) { return t.reshape({-1, H}); };
  w->in_proj_qkv = at::cat({rows(qkvz[0]), rows(qkvz[1]), rows(qkvz[2])}).contiguous();
  w->in_proj_z = rows(qkvz[3]).contiguous();
  w->in_proj_b = rows(ba[0]).contiguous();
  w->in_proj_a = rows(ba[1]).contiguous();
}

void CheckGatedDeltaNetWeights(const GatedDeltaNetWeights& w, const GatedDeltaNetShape& shape,
                               int64_t hidden) {
  TORCH_CHECK(shape.key_heads > 0 && shape.value_heads % shape.key_heads == 0,
              "Gated DeltaNet: value heads (", shape.value_heads,
              ") must be a multiple of key heads (", shape.key_heads, ")");
  CheckWeight(w.in_proj_qkv, "in_proj_qkv", {shape.conv_width(), hidden});
  CheckWeight(w.in_proj_z, "in_proj_z", {shape.value_width(), hidden});
  CheckWeight(w.in_proj_b, "in_proj_b", {shape.value_heads, hidden});
  CheckWeight(w.in_proj_a, "in_proj_a", {shape.value_heads, hidden});
  CheckWeight(w.conv, "conv1d", {shape.conv_width(), shape.conv_kernel});
  CheckWeight(w.dt_bias, "dt_bias", {shape.value_heads});
  CheckWeight(w.a_log, "A_log", {shape.value_heads});
  CheckWeight(w.norm, "norm", {shape.value_dim});
  CheckWeight(w.out_proj, "out_proj", {hidden, shape.value_width()});
}

at::Tensor GatedDeltaNetForward(const at::Tensor& x, const GatedDeltaNetWeights& w,
                                const GatedDeltaNetShape& s, const std::vector<int64_t>& cu_seqlens,
                                DeltaRuleForm form, GatedDeltaNetState* state) {
  TORCH_CHECK(x.dim() == 2, "Gated DeltaNet: x must be [T, H], got ", x.sizes());
  CheckGatedDeltaNetWeights(w, s, x.size(1));
  torch::NoGradGuard no_grad;
  const int64_t T = x.size(0), r = s.value_heads / s.key_heads;
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor mixed = CausalConv1dSilu(at::linear(x, w.in_proj_qkv), w.conv, cu_seqlens,
                                            state != nullptr ? &state->conv : nullptr);
  const auto parts = mixed.split_with_sizes({s.key_width(), s.key_width(), s.value_width()}, 1);
  GatedDeltaRuleInputs in;
  in.q =
      L2Normalize(parts[0].reshape({T, s.key_heads, s.key_dim}).to(wide).repeat_interleave(r, 1)) /
      std::sqrt(static_cast<double>(s.key_dim));
  in.k =
      L2Normalize(parts[1].reshape({T, s.key_heads, s.key_dim}).to(wide).repeat_interleave(r, 1));
  in.v = parts[2].reshape({T, s.value_heads, s.value_dim}).to(wide);
  in.beta = at::sigmoid(at::linear(x, w.in_proj_b)).to(wide);
  in.g = -w.a_log.to(wide).exp() *
         at::softplus(at::linear(x, w.in_proj_a).to(wide) + w.dt_bias.to(wide));
  at::Tensor* rule_state = state != nullptr ? &state->recurrent : nullptr;
  const at::Tensor o = form == DeltaRuleForm::kChunked
                           ? GatedDeltaRuleChunked(in, cu_seqlens, rule_state)
                           : GatedDeltaRuleRecurrent(in, cu_seqlens, rule_state);
  const at::Tensor z = at::linear(x, w.in_proj_z).view({T, s.value_heads, s.value_dim});
  const at::Tensor gated = GatedRmsNorm(o.to(x.scalar_type()), z, w.norm, s.eps);
  return at::linear(gated.reshape({T, s.value_width()}), w.out_proj);
}

}  // namespace e3
