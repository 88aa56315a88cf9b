// Qwen3-Next's gated full attention through SelfAttention
// (teacher_server/layers/attention.h: output_gate, qk_norm_weight_in_fp32)
// against a plain statement of transformers' Qwen3NextAttention in fp64
// over two packed samples: q_proj's per-head [query | gate] rows,
// zero-centred q/k norms, rotary on the first quarter of each head
// (rotate_half within it), causal GQA, sigmoid(gate) on the output before
// o_proj. Everything but the q/k norms (fp32, as transformers computes
// them) runs in fp64.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "teacher_server/layers/attention.h"
#include "tests/rel_inf.h"

namespace e3 {
namespace {

using testing::RelInf;

constexpr int64_t kGaHidden = 24, kGaHeads = 4, kGaKvHeads = 2, kGaD = 16, kGaRot = 4;

struct GaCosSin {
  at::Tensor cos, sin;  // [T, kGaRot]
};

GaCosSin PartialRope(const std::vector<int64_t>& cu) {
  std::vector<int64_t> pos;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    for (int64_t p = 0; p < cu[s + 1] - cu[s]; ++p) pos.push_back(p);
  }
  const at::Tensor inv =
      1.0 / torch::pow(10000.0, torch::arange(0, kGaRot, 2, torch::kDouble) / kGaRot);
  const at::Tensor f = torch::tensor(pos, torch::kDouble).unsqueeze(1) * inv.unsqueeze(0);
  const at::Tensor e = torch::cat({f, f}, 1);
  return {e.cos(), e.sin()};
}

// Qwen3NextRMSNorm: in fp32 whatever the input's dtype, as transformers runs it.
at::Tensor ZeroCentredNorm(const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor f = x.to(torch::kFloat);
  return (f * torch::rsqrt(f.square().mean(-1, true) + 1e-6) * (1 + w.to(torch::kFloat)))
      .to(x.scalar_type());
}

at::Tensor RotatePrefix(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor r = x.narrow(-1, 0, kGaRot);
  const at::Tensor half =
      torch::cat({-r.narrow(-1, kGaRot / 2, kGaRot / 2), r.narrow(-1, 0, kGaRot / 2)}, -1);
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return torch::cat({r * c + half * s, x.narrow(-1, kGaRot, kGaD - kGaRot)}, -1);
}

// transformers' Qwen3NextAttention for one sample.
at::Tensor PlainGatedAttention(const at::Tensor& x, const AttentionWeights& w,
                               const at::Tensor& q_norm_raw, const at::Tensor& k_norm_raw,
                               const GaCosSin& cs) {
  const int64_t L = x.size(0);
  const at::Tensor qg = at::linear(x, w.q_proj).view({L, kGaHeads, 2 * kGaD});
  at::Tensor q = ZeroCentredNorm(qg.narrow(-1, 0, kGaD), q_norm_raw);
  const at::Tensor gate = qg.narrow(-1, kGaD, kGaD).reshape({L, kGaHeads * kGaD});
  at::Tensor k = ZeroCentredNorm(at::linear(x, w.k_proj).view({L, kGaKvHeads, kGaD}), k_norm_raw);
  const at::Tensor v = at::linear(x, w.v_proj).view({L, kGaKvHeads, kGaD});
  q = RotatePrefix(q, cs.cos, cs.sin).transpose(0, 1);  // [H, L, D]
  k = RotatePrefix(k, cs.cos, cs.sin).repeat_interleave(kGaHeads / kGaKvHeads, 1).transpose(0, 1);
  const at::Tensor vv = v.repeat_interleave(kGaHeads / kGaKvHeads, 1).transpose(0, 1);
  at::Tensor s = torch::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(kGaD));
  s = s.masked_fill(torch::ones({L, L}, torch::kBool).triu(1), -INFINITY);
  const at::Tensor o =
      torch::matmul(torch::softmax(s, -1), vv).transpose(0, 1).reshape({L, kGaHeads * kGaD});
  return at::linear(o * torch::sigmoid(gate), w.o_proj);
}

TEST(GatedAttentionTest, MatchesQwen3NextAttentionOverPackedSamples) {
  torch::manual_seed(1);
  const auto o = torch::TensorOptions().dtype(torch::kDouble);
  AttentionWeights w;
  w.q_proj = 0.2 * torch::randn({kGaHeads * 2 * kGaD, kGaHidden}, o);
  w.k_proj = 0.2 * torch::randn({kGaKvHeads * kGaD, kGaHidden}, o);
  w.v_proj = 0.2 * torch::randn({kGaKvHeads * kGaD, kGaHidden}, o);
  w.o_proj = 0.2 * torch::randn({kGaHidden, kGaHeads * kGaD}, o);
  const at::Tensor q_norm_raw = 0.2 * torch::randn({kGaD}, o),
                   k_norm_raw = 0.2 * torch::randn({kGaD}, o);
  w.q_norm = (1 + q_norm_raw)
                 .to(torch::kFloat);  // the loader stores 1 + w, in fp32, for zero-centred norms
  w.k_norm = (1 + k_norm_raw).to(torch::kFloat);
  AttentionShape shape;
  shape.num_heads = kGaHeads;
  shape.num_kv_heads = kGaKvHeads;
  shape.head_dim = kGaD;
  shape.rotary_dim = kGaRot;
  shape.qk_norm_weight_in_fp32 = true;
  shape.output_gate = true;
  const std::vector<int64_t> cu{0, 13, 20};
  const at::Tensor x = torch::randn({cu.back(), kGaHidden}, o);
  const GaCosSin cs = PartialRope(cu);
  AttentionOptions options;
  options.kernel = AttentionKernel::kEager;
  for (bool fused : {false, true}) {
    AttentionWeights ww = w;
    if (fused) FuseQkv(&ww);
    const at::Tensor y = SelfAttention(x, ww, shape, cs.cos, cs.sin,
                                       MakePackedLayout(cu, torch::kCPU, options.kernel), options);
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      const int64_t len = cu[s + 1] - cu[s];
      const GaCosSin part{cs.cos.narrow(0, cu[s], len), cs.sin.narrow(0, cu[s], len)};
      EXPECT_LT(
          RelInf(y.narrow(0, cu[s], len),
                 PlainGatedAttention(x.narrow(0, cu[s], len), w, q_norm_raw, k_norm_raw, part)),
          1e-6)  // the q/k norms run in fp32 (as transformers runs them): agreement at fp32's level
          << "sample " << s << (fused ? ", fused qkv" : "");
    }
  }
}

}  // namespace
}  // namespace e3
