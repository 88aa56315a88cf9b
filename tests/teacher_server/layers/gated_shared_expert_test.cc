// Qwen3-Next's sparse MoE block in fp64: the routed experts (SparseMoe:
// softmax over every expert, top-k, renormalised) plus the shared expert
// scaled by sigmoid(x . shared_expert_gate), against a plain statement of
// transformers' Qwen3NextSparseMoeBlock (its routing in fp32, the rest in
// fp64); and a gate of the wrong width
// is named.
#include "teacher_server/layers/gated_shared_expert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "teacher_server/layers/moe.h"
#include "tests/rel_inf.h"

namespace e3 {
namespace {

using ::testing::HasSubstr;
using testing::RelInf;

constexpr int64_t kSeHidden = 12, kSeExperts = 4, kSeTopK = 2, kSeInter = 8, kSeSharedInter = 10;

MlpWeights RandomMlp(int64_t inter) {
  MlpWeights m;
  m.gate_proj = 0.3 * torch::randn({inter, kSeHidden}, torch::kDouble);
  m.up_proj = 0.3 * torch::randn({inter, kSeHidden}, torch::kDouble);
  m.down_proj = 0.3 * torch::randn({kSeHidden, inter}, torch::kDouble);
  return m;
}

at::Tensor PlainMlp(const at::Tensor& x, const MlpWeights& m) {
  return at::linear(at::silu(at::linear(x, m.gate_proj)) * at::linear(x, m.up_proj), m.down_proj);
}

TEST(GatedSharedExpertTest, Qwen3NextMoeBlockMatchesItsPlainStatement) {
  torch::manual_seed(1);
  MoeWeights moe;
  moe.router = torch::randn({kSeExperts, kSeHidden}, torch::kDouble);
  for (int64_t e = 0; e < kSeExperts; ++e) moe.experts.push_back(RandomMlp(kSeInter));
  GatedSharedExpert shared{RandomMlp(kSeSharedInter), torch::randn({1, kSeHidden}, torch::kDouble)};
  const at::Tensor x = torch::randn({9, kSeHidden}, torch::kDouble);
  MoeRouting routing;
  routing.top_k = kSeTopK;
  routing.normalize = true;
  const at::Tensor got = AddGatedSharedExpert(x, SparseMoe(x, moe, routing), shared);

  // The router's softmax, top-k and renormalisation in fp32, as transformers runs them.
  const at::Tensor p = torch::softmax(at::linear(x, moe.router).to(torch::kFloat), -1);
  const auto [w, idx] = p.topk(kSeTopK, -1);
  const at::Tensor wn = (w / w.sum(-1, true)).to(torch::kDouble);
  at::Tensor expected = torch::zeros_like(x);
  for (int64_t t = 0; t < x.size(0); ++t) {
    for (int64_t j = 0; j < kSeTopK; ++j) {
      expected[t] +=
          wn[t][j] * PlainMlp(x[t].unsqueeze(0), moe.experts[idx[t][j].item<int64_t>()])[0];
    }
  }
  expected += torch::sigmoid(at::linear(x, shared.gate)) * PlainMlp(x, shared.mlp);
  EXPECT_LT(RelInf(got, expected), 1e-12);
}

TEST(GatedSharedExpertTest, AGateOfTheWrongWidthIsNamed) {
  GatedSharedExpert shared{RandomMlp(kSeSharedInter),
                           torch::randn({1, kSeHidden + 1}, torch::kDouble)};
  const at::Tensor x = torch::randn({3, kSeHidden}, torch::kDouble);
  try {
    AddGatedSharedExpert(x, x, shared);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("shared_expert_gate must be [1, 12]"));
  }
}

}  // namespace
}  // namespace e3
