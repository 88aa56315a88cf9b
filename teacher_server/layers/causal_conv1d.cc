#include "teacher_server/layers/causal_conv1d.h"

namespace e3 {
namespace {

void CheckConvInputs(const at::Tensor& x, const at::Tensor& weight,
                     const std::vector<int64_t>& cu_seqlens) {
  TORCH_CHECK(
      x.dim() == 2 && weight.dim() == 2 && weight.size(0) == x.size(1) && weight.size(1) >= 1,
      "causal conv1d: x must be [T, C] and the weight [C, K], got ", x.sizes(), " and ",
      weight.sizes());
  TORCH_CHECK(cu_seqlens.size() >= 2 && cu_seqlens.front() == 0 && cu_seqlens.back() == x.size(0),
              "causal conv1d: cu_seqlens must run from 0 to the ", x.size(0), " rows");
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    TORCH_CHECK(cu_seqlens[i] >= cu_seqlens[i - 1],
                "causal conv1d: cu_seqlens must not decrease (entry ", i, ")");
  }
}

}  // namespace

at::Tensor CausalConv1dSilu(const at::Tensor& x, const at::Tensor& weight,
                            const std::vector<int64_t>& cu_seqlens, at::Tensor* state) {
  CheckConvInputs(x, weight, cu_seqlens);
  torch::NoGradGuard no_grad;
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t n = static_cast<int64_t>(cu_seqlens.size()) - 1, C = x.size(1), K = weight.size(1);
  const std::vector<int64_t> state_shape{n, C, K - 1};
  at::Tensor states;
  if (state != nullptr && state->defined()) {
    TORCH_CHECK(state->sizes() == at::IntArrayRef(state_shape), "causal conv1d: the state must be ",
                at::IntArrayRef(state_shape), ", got ", state->sizes());
    states = state->to(x.device(), wide, /*non_blocking=*/false, /*copy=*/true);
  } else {
    states = at::zeros(state_shape, x.options().dtype(wide));
  }
  const at::Tensor w = weight.to(wide);
  at::Tensor y = at::empty_like(x);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t begin = cu_seqlens[s], length = cu_seqlens[s + 1] - begin;
    if (length == 0) continue;
    const at::Tensor rows =
        at::cat({states[s].t(), x.narrow(0, begin, length).to(wide)});  // [K - 1 + L, C]
    at::Tensor sum = at::zeros({length, C}, rows.options());
    for (int64_t i = 0; i < K; ++i) sum.add_(rows.narrow(0, i, length) * w.select(1, i));
    y.narrow(0, begin, length).copy_(at::silu(sum));
    states[s].copy_(rows.narrow(0, rows.size(0) - (K - 1), K - 1).t());
  }
  if (state != nullptr) *state = states;
  return y;
}

}  // namespace e3
