// The `sgl` backend's load-time fusion (QKV and gate-up as one matmul each)
// against the `hf` reference on the same weights and packed batches, in
// fp32 on the CPU: the same products in a larger GEMM, so the aux states and
// the final hidden state agree to fp32 rounding (bound 1e-5 relative to
// each tensor's max; measured 0 with BLIS, which computes every output
// column the same way however many there are) and the target argmax agrees
// at every position. The layer-level test checks that the fused path is the
// one that runs.
#include <gtest/gtest.h>

#include "common/model_dir.h"
#include "teacher_server/causal_lm.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/mlp.h"
#include "tests/teacher_server/golden_fixture.h"

namespace e3 {
namespace {

using testing::LoadGoldenCase;
using testing::RelInf;

TEST(SglLayersTest, FusedQkvAndGateUpReplaceTheSeparateWeightsAndMatchThem) {
  torch::manual_seed(0);
  const int64_t T = 9, H = 48, heads = 6, kv = 2, D = 8, I = 80;
  AttentionShape shape{heads, kv, D, D};
  AttentionWeights aw;
  aw.q_proj = torch::randn({heads * D, H}) * 0.1;
  aw.k_proj = torch::randn({kv * D, H}) * 0.1;
  aw.v_proj = torch::randn({kv * D, H}) * 0.1;
  aw.o_proj = torch::randn({H, heads * D}) * 0.1;
  aw.q_bias = torch::randn({heads * D});  // Qwen2-style qkv bias
  aw.k_bias = torch::randn({kv * D});
  aw.v_bias = torch::randn({kv * D});
  MlpWeights mw;
  mw.gate_proj = torch::randn({I, H}) * 0.1;
  mw.up_proj = torch::randn({I, H}) * 0.1;
  mw.down_proj = torch::randn({H, I}) * 0.1;
  const at::Tensor x = torch::randn({T, H});
  const at::Tensor pos = torch::cat({torch::arange(5), torch::arange(4)}).to(at::kFloat);
  const at::Tensor inv = 1.0 / torch::pow(10000.0, torch::arange(0, D, 2).to(at::kFloat) / D);
  const at::Tensor ang = torch::cat({pos.unsqueeze(1) * inv, pos.unsqueeze(1) * inv}, -1);
  const std::vector<int64_t> cu = {0, 5, 9};
  const at::Tensor a0 = SelfAttention(x, aw, shape, ang.cos(), ang.sin(), cu, AttentionKernel::kEager);
  const at::Tensor m0 = SwiGluMlp(x, mw);
  FuseQkv(&aw);
  FuseGateUp(&mw);
  EXPECT_FALSE(aw.q_proj.defined());
  EXPECT_FALSE(mw.gate_proj.defined());
  EXPECT_EQ(aw.qkv_proj.sizes(), (at::IntArrayRef{(heads + 2 * kv) * D, H}));
  EXPECT_EQ(aw.qkv_bias.sizes(), (at::IntArrayRef{(heads + 2 * kv) * D}));
  EXPECT_EQ(mw.gate_up_proj.sizes(), (at::IntArrayRef{2 * I, H}));
  const at::Tensor a1 = SelfAttention(x, aw, shape, ang.cos(), ang.sin(), cu, AttentionKernel::kEager);
  const at::Tensor m1 = SwiGluMlp(x, mw);
  EXPECT_LE(RelInf(a1, a0), 1e-6);
  EXPECT_LE(RelInf(m1, m0), 1e-6);
}

class SglBackendTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SglBackendTest, FusedProjectionsMatchTheReference) {
  const auto c = LoadGoldenCase(GetParam());
  auto dir = ModelDir::Open(c.model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  ForwardOutput out[2];
  for (int fused = 0; fused < 2; ++fused) {
    ModelOptions options;
    options.fuse_projections = fused == 1;
    auto model = LoadCausalLM(**dir, options);
    ASSERT_TRUE(model.ok()) << model.status();
    auto batch = MakePackedBatch(c.tensors.at("input_ids").to(at::kLong), c.cu_seqlens,
                                 (*dir)->config().vocab_size, options.device);
    ASSERT_TRUE(batch.ok());
    ForwardOptions fwd;
    fwd.aux_layer_ids = c.aux_layer_ids;
    fwd.return_argmax = true;
    auto o = (*model)->Forward(*batch, fwd);
    ASSERT_TRUE(o.ok()) << o.status();
    out[fused] = *o;
  }
  const double aux = RelInf(out[1].aux_hidden, out[0].aux_hidden);
  const double last = RelInf(out[1].last_hidden, out[0].last_hidden);
  std::printf("[%s] sgl vs hf, fp32: aux %.3g, last %.3g\n", c.name.c_str(), aux, last);
  EXPECT_LE(aux, 1e-5);
  EXPECT_LE(last, 1e-5);
  EXPECT_TRUE(out[1].target_argmax.equal(out[0].target_argmax));
}

INSTANTIATE_TEST_SUITE_P(Cases, SglBackendTest,
                         ::testing::Values("tiny_code_llama", "rand_llama3_gqa", "rand_yarn_mqa",
                                           "rand_linear_headdim", "rand_default_mha"));

}  // namespace
}  // namespace e3
