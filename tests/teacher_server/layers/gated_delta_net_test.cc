// The Gated DeltaNet token mixer (teacher_server/layers/gated_delta_net.h)
// in fp64: Qwen3-Next's fused projections regrouped into Qwen3.5's layout
// give the same q, k, v, z, b and a as transformers' per-key-head split of
// them; the layer against a plain statement written here from the model's
// formulas (torch's conv1d, the delta rule one token at a time, the gated
// norm) over packed sequences with two value heads per key head; a
// prefill in chunks continued token by token from its state equals the
// whole prefill; and a wrong weight shape is named.
#include "teacher_server/layers/gated_delta_net.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "teacher_server/layers/gated_delta_rule.h"
#include "tests/rel_inf.h"

namespace e3 {
namespace {

using ::testing::HasSubstr;
using testing::RelInf;

constexpr int64_t kHidden = 16;

GatedDeltaNetShape SmallShape() {
  GatedDeltaNetShape s;
  s.key_heads = 2;
  s.value_heads = 4;
  s.key_dim = 8;
  s.value_dim = 6;
  s.conv_kernel = 4;
  return s;
}

GatedDeltaNetWeights RandomWeights(const GatedDeltaNetShape& s, uint64_t seed) {
  torch::manual_seed(seed);
  const auto o = torch::TensorOptions().dtype(torch::kDouble);
  GatedDeltaNetWeights w;
  w.in_proj_qkv = 0.3 * torch::randn({s.conv_width(), kHidden}, o);
  w.in_proj_z = 0.3 * torch::randn({s.value_width(), kHidden}, o);
  w.in_proj_b = 0.3 * torch::randn({s.value_heads, kHidden}, o);
  w.in_proj_a = 0.3 * torch::randn({s.value_heads, kHidden}, o);
  w.conv = 0.5 * torch::randn({s.conv_width(), s.conv_kernel}, o);
  w.dt_bias = torch::rand({s.value_heads}, o);
  w.a_log = torch::log(torch::rand({s.value_heads}, o) * 4 + 0.5);
  w.norm = 1 + 0.1 * torch::randn({s.value_dim}, o);
  w.out_proj = 0.3 * torch::randn({kHidden, s.value_width()}, o);
  return w;
}

// The layer for one sequence as the model's formulas state it.
at::Tensor PlainLayer(const at::Tensor& x, const GatedDeltaNetWeights& w,
                      const GatedDeltaNetShape& s) {
  const int64_t T = x.size(0), r = s.value_heads / s.key_heads;
  at::Tensor mixed = at::conv1d(at::linear(x, w.in_proj_qkv).t().unsqueeze(0), w.conv.unsqueeze(1),
                                {}, 1, s.conv_kernel - 1, 1, s.conv_width());
  mixed = at::silu(mixed.squeeze(0).narrow(1, 0, T).t());
  const auto p = mixed.split_with_sizes({s.key_width(), s.key_width(), s.value_width()}, 1);
  auto unit = [](const at::Tensor& t) { return t / at::sqrt(t.square().sum(-1, true) + 1e-6); };
  GatedDeltaRuleInputs in;
  in.q = unit(p[0].reshape({T, s.key_heads, s.key_dim}).repeat_interleave(r, 1)) /
         std::sqrt(static_cast<double>(s.key_dim));
  in.k = unit(p[1].reshape({T, s.key_heads, s.key_dim}).repeat_interleave(r, 1));
  in.v = p[2].reshape({T, s.value_heads, s.value_dim});
  in.beta = at::sigmoid(at::linear(x, w.in_proj_b));
  in.g = -w.a_log.exp() * at::log1p(at::exp(at::linear(x, w.in_proj_a) + w.dt_bias));
  const at::Tensor o = GatedDeltaRuleRecurrent(in, {0, T});
  const at::Tensor z = at::linear(x, w.in_proj_z).view({T, s.value_heads, s.value_dim});
  const at::Tensor normed = o / at::sqrt(o.square().mean(-1, true) + s.eps) * w.norm * at::silu(z);
  return at::linear(normed.reshape({T, -1}), w.out_proj);
}

TEST(GatedDeltaNetTest, Qwen3NextProjectionsRegroupAsTransformersSplitsThem) {
  const GatedDeltaNetShape s = SmallShape();
  const int64_t nk = s.key_heads, dk = s.key_dim, r = s.value_heads / nk, dv = s.value_dim;
  torch::manual_seed(1);
  const at::Tensor qkvz = torch::randn({nk * (2 * dk + 2 * r * dv), kHidden}, torch::kDouble);
  const at::Tensor ba = torch::randn({nk * 2 * r, kHidden}, torch::kDouble);
  const at::Tensor x = torch::randn({5, kHidden}, torch::kDouble);
  GatedDeltaNetWeights w;
  FromQwen3NextProjections(qkvz, ba, s, &w);
  // transformers: view per key head, split, then q | k | v flattened head-major.
  const auto hf = at::linear(x, qkvz)
                      .view({5, nk, 2 * dk + 2 * r * dv})
                      .split_with_sizes({dk, dk, r * dv, r * dv}, 2);
  const at::Tensor mixed =
      at::cat({hf[0].reshape({5, -1}), hf[1].reshape({5, -1}), hf[2].reshape({5, -1})}, 1);
  EXPECT_TRUE(at::equal(at::linear(x, w.in_proj_qkv), mixed));
  EXPECT_TRUE(at::equal(at::linear(x, w.in_proj_z), hf[3].reshape({5, -1})));
  const auto hf_ba = at::linear(x, ba).view({5, nk, 2 * r}).split_with_sizes({r, r}, 2);
  EXPECT_TRUE(at::equal(at::linear(x, w.in_proj_b), hf_ba[0].reshape({5, -1})));
  EXPECT_TRUE(at::equal(at::linear(x, w.in_proj_a), hf_ba[1].reshape({5, -1})));
}

TEST(GatedDeltaNetTest, MatchesThePlainStatementOverPackedSequences) {
  const GatedDeltaNetShape s = SmallShape();
  const GatedDeltaNetWeights w = RandomWeights(s, 2);
  const std::vector<int64_t> cu{0, 3, 70, 150};
  const at::Tensor x = torch::randn({cu.back(), kHidden}, torch::kDouble);
  for (DeltaRuleForm form : {DeltaRuleForm::kRecurrent, DeltaRuleForm::kChunked}) {
    const at::Tensor y = GatedDeltaNetForward(x, w, s, cu, form);
    for (size_t i = 0; i + 1 < cu.size(); ++i) {
      const int64_t len = cu[i + 1] - cu[i];
      EXPECT_LT(RelInf(y.narrow(0, cu[i], len), PlainLayer(x.narrow(0, cu[i], len), w, s)), 1e-11)
          << "sequence " << i << (form == DeltaRuleForm::kChunked ? ", chunked" : ", recurrent");
    }
  }
}

TEST(GatedDeltaNetTest, PrefillThenTokenByTokenEqualsTheWholePrefill) {
  const GatedDeltaNetShape s = SmallShape();
  const GatedDeltaNetWeights w = RandomWeights(s, 3);
  const int64_t T = 90, prefix = 71;
  const at::Tensor x = torch::randn({T, kHidden}, torch::kDouble);
  const at::Tensor whole = GatedDeltaNetForward(x, w, s, {0, T}, DeltaRuleForm::kChunked);
  GatedDeltaNetState state;
  std::vector<at::Tensor> parts{GatedDeltaNetForward(x.narrow(0, 0, prefix), w, s, {0, prefix},
                                                     DeltaRuleForm::kChunked, &state)};
  for (int64_t t = prefix; t < T; ++t) {
    parts.push_back(
        GatedDeltaNetForward(x.narrow(0, t, 1), w, s, {0, 1}, DeltaRuleForm::kRecurrent, &state));
  }
  EXPECT_LT(RelInf(torch::cat(parts), whole), 1e-11);
  EXPECT_EQ(state.conv.sizes(), at::IntArrayRef({1, s.conv_width(), s.conv_kernel - 1}));
  EXPECT_EQ(state.recurrent.sizes(), at::IntArrayRef({1, s.value_heads, s.key_dim, s.value_dim}));
}

TEST(GatedDeltaNetTest, AWrongWeightShapeIsNamed) {
  const GatedDeltaNetShape s = SmallShape();
  GatedDeltaNetWeights w = RandomWeights(s, 4);
  w.conv = torch::randn({s.conv_width(), 3}, torch::kDouble);
  try {
    GatedDeltaNetForward(torch::randn({4, kHidden}, torch::kDouble), w, s, {0, 4},
                         DeltaRuleForm::kChunked);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("conv1d is [56, 3], expected [56, 4]"));
  }
}

}  // namespace
}  // namespace e3
