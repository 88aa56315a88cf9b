#include "teacher_server/layers/gated_delta_rule.h"

#include <limits>
#include <utility>

namespace e3 {
namespace {

at::ScalarType WideType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

void CheckInputs(const GatedDeltaRuleInputs& in, const std::vector<int64_t>& cu_seqlens) {
  TORCH_CHECK(in.q.dim() == 3 && in.k.sizes() == in.q.sizes(),
              "gated delta rule: q and k must be [T, H, Dk], got ", in.q.sizes(), " and ",
              in.k.sizes());
  const int64_t T = in.q.size(0), H = in.q.size(1);
  TORCH_CHECK(in.v.dim() == 3 && in.v.size(0) == T && in.v.size(1) == H,
              "gated delta rule: v must be [", T, ", ", H, ", Dv], got ", in.v.sizes());
  TORCH_CHECK(in.g.sizes() == at::IntArrayRef({T, H}) && in.beta.sizes() == at::IntArrayRef({T, H}),
              "gated delta rule: g and beta must be [", T, ", ", H, "], got ", in.g.sizes(),
              " and ", in.beta.sizes());
  TORCH_CHECK(cu_seqlens.size() >= 2 && cu_seqlens.front() == 0 && cu_seqlens.back() == T,
              "gated delta rule: cu_seqlens must run from 0 to the ", T, " rows");
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    TORCH_CHECK(cu_seqlens[i] >= cu_seqlens[i - 1],
                "gated delta rule: cu_seqlens must not decrease (entry ", i, ")");
  }
}

// Each sequence's initial state [N, H, Dk, Dv] in `wide` (zeros where none is given).
at::Tensor InitialStates(const at::Tensor* state, int64_t n, const GatedDeltaRuleInputs& in,
                         at::ScalarType wide) {
  const std::vector<int64_t> shape{n, in.q.size(1), in.q.size(2), in.v.size(2)};
  if (state == nullptr || !state->defined()) return at::zeros(shape, in.q.options().dtype(wide));
  TORCH_CHECK(state->sizes() == at::IntArrayRef(shape), "gated delta rule: the state must be ",
              at::IntArrayRef(shape), ", got ", state->sizes());
  return state->to(in.q.device(), wide, /*non_blocking=*/false, /*copy=*/true);
}

struct Sequence {
  at::Tensor q, k, v, g, beta;  // rows of one sequence, in the wide dtype
};

Sequence Rows(const GatedDeltaRuleInputs& in, int64_t begin, int64_t length, at::ScalarType wide) {
  return {in.q.narrow(0, begin, length).to(wide), in.k.narrow(0, begin, length).to(wide),
          in.v.narrow(0, begin, length).to(wide), in.g.narrow(0, begin, length).to(wide),
          in.beta.narrow(0, begin, length).to(wide)};
}

// One sequence, token by token; updates s [H, Dk, Dv] and writes out [L, H, Dv].
void RecurrentSequence(const Sequence& x, at::Tensor& s, at::Tensor out) {
  const int64_t H = x.q.size(1);
  for (int64_t t = 0; t < x.q.size(0); ++t) {
    s.mul_(x.g[t].exp().view({H, 1, 1}));
    const at::Tensor k = x.k[t].unsqueeze(1);                            // [H, 1, Dk]
    const at::Tensor read = at::matmul(k, s).squeeze(1);                 // [H, Dv]
    const at::Tensor delta = (x.v[t] - read) * x.beta[t].unsqueeze(-1);  // [H, Dv]
    s.add_(k.transpose(1, 2) * delta.unsqueeze(1));
    out[t].copy_(at::matmul(x.q[t].unsqueeze(1), s).squeeze(1));
  }
}

// [L, H, *] -> [n, H, C, *], zero rows appended up to n * C (a zero row has
// k = v = beta = g = 0: it changes no state and its output is dropped).
at::Tensor Chunks(const at::Tensor& x, int64_t n, int64_t C) {
  const int64_t pad = n * C - x.size(0);
  at::Tensor padded = x.dim() == 3 ? at::constant_pad_nd(x, {0, 0, 0, 0, 0, pad})
                                   : at::constant_pad_nd(x, {0, 0, 0, pad});
  std::vector<int64_t> shape{n, C};
  for (int64_t d = 1; d < x.dim(); ++d) shape.push_back(x.size(d));
  padded = padded.reshape(shape);
  return x.dim() == 3 ? padded.permute({0, 2, 1, 3}) : padded.permute({0, 2, 1});
}

// One sequence in chunks of C; updates s [H, Dk, Dv] and writes out [L, H, Dv].
void ChunkedSequence(const Sequence& x, int64_t C, at::Tensor& s, at::Tensor out) {
  const int64_t L = x.q.size(0), n = (L + C - 1) / C;
  const at::Tensor q = Chunks(x.q, n, C), k = Chunks(x.k, n, C), v = Chunks(x.v, n, C);
  const at::Tensor beta = Chunks(x.beta, n, C);       // [n, H, C]
  const at::Tensor G = Chunks(x.g, n, C).cumsum(-1);  // cumulative log decay
  const at::Tensor causal = at::ones({C, C}, x.q.options().dtype(at::kBool)).tril();
  const at::Tensor M =
      (G.unsqueeze(-1) - G.unsqueeze(-2))  // e^(G_i - G_j), j <= i
          .masked_fill(causal.logical_not(), -std::numeric_limits<double>::infinity())
          .exp();
  const at::Tensor kt = k.transpose(-1, -2);
  const at::Tensor strict = (at::matmul(k, kt) * M * beta.unsqueeze(-1)).tril(-1);  // L
  const at::Tensor W = at::linalg_solve_triangular(strict, beta.unsqueeze(-1) * v, /*upper=*/false,
                                                   /*left=*/true, /*unitriangular=*/true);
  const at::Tensor Y =
      at::linalg_solve_triangular(strict, (beta * G.exp()).unsqueeze(-1) * k, /*upper=*/false,
                                  /*left=*/true, /*unitriangular=*/true);
  const at::Tensor qkm = at::matmul(q, kt) * M;
  const at::Tensor qg = q * G.exp().unsqueeze(-1);
  const at::Tensor last = G.select(-1, C - 1);  // [n, H]
  const at::Tensor kd = (k * (last.unsqueeze(-1) - G).exp().unsqueeze(-1)).transpose(-1, -2);
  at::Tensor o = at::empty({n, v.size(1), C, v.size(3)}, v.options());
  for (int64_t c = 0; c < n; ++c) {
    const at::Tensor u = W[c] - at::matmul(Y[c], s);  // [H, C, Dv]
    o[c].copy_(at::matmul(qg[c], s) + at::matmul(qkm[c], u));
    s = s * last[c].exp().view({-1, 1, 1}) + at::matmul(kd[c], u);
  }
  out.copy_(o.permute({0, 2, 1, 3}).reshape({n * C, v.size(1), v.size(3)}).narrow(0, 0, L));
}

template <typename PerSequence>
at::Tensor Run(const GatedDeltaRuleInputs& in, const std::vector<int64_t>& cu_seqlens,
               at::Tensor* state, PerSequence per_sequence) {
  CheckInputs(in, cu_seqlens);
  const at::ScalarType wide = WideType(in.q.scalar_type());
  const int64_t n = static_cast<int64_t>(cu_seqlens.size()) - 1;
  at::Tensor states = InitialStates(state, n, in, wide);
  at::Tensor out =
      at::zeros({in.q.size(0), in.q.size(1), in.v.size(2)}, in.q.options().dtype(wide));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t begin = cu_seqlens[i], length = cu_seqlens[i + 1] - begin;
    if (length == 0) continue;
    at::Tensor s = states[i].clone();
    per_sequence(Rows(in, begin, length, wide), s, out.narrow(0, begin, length));
    states[i].copy_(s);
  }
  if (state != nullptr) *state = states;
  return out;
}

}  // namespace

at::Tensor GatedDeltaRuleRecurrent(const GatedDeltaRuleInputs& in,
                                   const std::vector<int64_t>& cu_seqlens, at::Tensor* state) {
  torch::NoGradGuard no_grad;
  return Run(in, cu_seqlens, state, RecurrentSequence);
}

at::Tensor GatedDeltaRuleChunked(const GatedDeltaRuleInputs& in,
                                 const std::vector<int64_t>& cu_seqlens, at::Tensor* state,
                                 int64_t chunk) {
  TORCH_CHECK(chunk > 0, "gated delta rule: the chunk size must be positive, got ", chunk);
  torch::NoGradGuard no_grad;
  return Run(in, cu_seqlens, state, [chunk](const Sequence& x, at::Tensor& s, at::Tensor out) {
    ChunkedSequence(x, chunk, s, out);
  });
}

}  // namespace e3
