// The hf backend against HF transformers 5.17 (fp32, eager attention) on
// the bundled tiny-code-llama with real chat samples and on random-weight
// configs covering rope types (default, linear, llama3, yarn), GQA/MQA,
// explicit head_dim, tied embeddings, fp16/bf16/fp32 weights, sharded and
// single-file checkpoints, and both config layouts; and on the other
// architectures: Qwen2 (q/k/v bias), Qwen3 (q/k norm, tied), Mixtral (top-2
// of 4 experts) and Qwen3-MoE (top-2 of 8 renormalised with a dense layer
// in between; top-3 of 4 not renormalised, MoE every second layer).
// Fixtures: tests/golden/make_llama_golden.py, make_arch_golden.py.
//
// Tolerance: 1e-4 relative (max abs error over the tensor's max abs).
// Measured on the CPU machine (LibTorch 1.13 + BLIS, fp32, 2026-11-30), worst
// over the cases and both attention kernels: aux 7.0e-7, last hidden 9.8e-7,
// logits 1.1e-6 (tiny_code_llama: 1.1e-7 / 7.2e-7 / 1.1e-6). The bound leaves
// two orders of magnitude for BLAS blocking differences between machines.
#include <gtest/gtest.h>

#include <string>

#include "common/model_dir.h"
#include "teacher_server/causal_lm.h"
#include "tests/teacher_server/golden_fixture.h"

namespace e3 {
namespace {

using testing::GoldenCase;
using testing::LoadGoldenCase;
using testing::RelInf;

constexpr double kRelTol = 1e-4;

struct Param {
  std::string name;
  AttentionKernel kernel;
};

class DecoderGoldenTest : public ::testing::TestWithParam<Param> {};

TEST_P(DecoderGoldenTest, MatchesTransformersFp32) {
  const GoldenCase c = LoadGoldenCase(GetParam().name);
  auto dir = ModelDir::Open(c.model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  ModelOptions options;
  options.dtype = at::kFloat;
  options.attention = GetParam().kernel;
  auto model = LoadCausalLM(**dir, options);
  ASSERT_TRUE(model.ok()) << model.status();

  auto batch = MakePackedBatch(c.tensors.at("input_ids").to(at::kLong), c.cu_seqlens,
                               (*dir)->config().vocab_size, at::kCPU);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ForwardOptions fwd;
  fwd.aux_layer_ids = c.aux_layer_ids;
  fwd.return_logits = true;
  auto out = (*model)->Forward(*batch, fwd);
  ASSERT_TRUE(out.ok()) << out.status();

  const double aux_err = RelInf(out->aux_hidden, c.tensors.at("aux_hidden"));
  const double last_err = RelInf(out->last_hidden, c.tensors.at("last_hidden"));
  at::Tensor rows = c.tensors.at("logits_row_index").to(at::kLong);
  const double logit_err = RelInf(out->logits.index_select(0, rows), c.tensors.at("logits_rows"));
  RecordProperty("aux_rel_err", std::to_string(aux_err));
  RecordProperty("last_rel_err", std::to_string(last_err));
  RecordProperty("logits_rel_err", std::to_string(logit_err));
  std::printf("[%s] rel inf error: aux %.3g, last %.3g, logits %.3g\n", c.name.c_str(), aux_err, last_err,
              logit_err);
  EXPECT_EQ(out->aux_hidden.sizes(), c.tensors.at("aux_hidden").sizes());
  EXPECT_LT(aux_err, kRelTol);
  EXPECT_LT(last_err, kRelTol);
  EXPECT_LT(logit_err, kRelTol);
  // The argmax can only differ where the top two logits tie within fp32
  // noise; none do in these fixtures.
  EXPECT_TRUE(out->target_argmax.equal(c.tensors.at("target_argmax")));
}

std::vector<Param> AllCases() {
  std::vector<Param> out;
  for (const char* name :
       {"tiny_code_llama", "rand_llama3_gqa", "rand_yarn_mqa", "rand_linear_headdim", "rand_default_mha",
        "rand_qwen2", "rand_qwen3", "rand_mixtral", "rand_qwen3_moe", "rand_qwen3_moe_unnorm"}) {
    out.push_back({name, AttentionKernel::kEager});
    out.push_back({name, AttentionKernel::kSdpa});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, DecoderGoldenTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.name +
                                  (info.param.kernel == AttentionKernel::kEager ? "_eager" : "_sdpa");
                         });

TEST(DecoderForwardTest, SamplesDoNotSeeEachOther) {
  // Packing two samples must give each the outputs it gets alone.
  const GoldenCase c = LoadGoldenCase("rand_default_mha");
  auto dir = ModelDir::Open(c.model_dir);
  ASSERT_TRUE(dir.ok());
  auto model = LoadCausalLM(**dir, ModelOptions{});
  ASSERT_TRUE(model.ok());
  std::vector<int32_t> a = {5, 9, 17, 3, 200, 44, 1}, b = {8, 8, 8, 100};
  ForwardOptions fwd;
  fwd.aux_layer_ids = {0, 3};
  auto packed = (*model)->Forward(*PackSamples({a, b}, 256, at::kCPU), fwd);
  auto alone_b = (*model)->Forward(*PackSamples({b}, 256, at::kCPU), fwd);
  ASSERT_TRUE(packed.ok() && alone_b.ok());
  EXPECT_TRUE(torch::allclose(packed->aux_hidden.narrow(0, 7, 4), alone_b->aux_hidden, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(packed->last_hidden.narrow(0, 7, 4), alone_b->last_hidden, 1e-5, 1e-6));
}

TEST(DecoderForwardTest, BadInputsAreErrors) {
  const GoldenCase c = LoadGoldenCase("rand_default_mha");
  auto dir = ModelDir::Open(c.model_dir);
  ASSERT_TRUE(dir.ok());
  auto model = LoadCausalLM(**dir, ModelOptions{});
  ASSERT_TRUE(model.ok());
  ForwardOptions fwd;
  fwd.aux_layer_ids = {0, 6};
  auto out = (*model)->Forward(*PackSamples({{1, 2, 3}}, 256, at::kCPU), fwd);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("aux layer id 6"), std::string::npos);
  auto oov = PackSamples({{1, 256}}, 256, at::kCPU);
  ASSERT_FALSE(oov.ok());
  EXPECT_NE(oov.status().message().find("256"), std::string::npos);
  EXPECT_FALSE(PackSamples({{1}, {}}, 256, at::kCPU).ok());
}

}  // namespace
}  // namespace e3
