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
// Measured on the CPU machine (LibTorch 1.13 + BLIS, fp32), worst
// over the cases and both attention kernels: aux 7.0e-7, last hidden 9.8e-7,
// logits 1.1e-6 (tiny_code_llama: 1.1e-7 / 7.2e-7 / 1.1e-6). The bound leaves
// two orders of magnitude for BLAS blocking differences between machines.
#include <gtest/gtest.h>

#include <string>

#include "common/model/model_dir.h"
#include "teacher_server/models/causal_lm.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/golden_forward.h"

namespace e3 {
namespace {

using testing::GoldenCase;
using testing::GoldenModel;
using testing::KernelCase;
using testing::LoadGoldenCase;

constexpr double kDecoderRelTol = 1e-4;

class DecoderGoldenTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(DecoderGoldenTest, MatchesTransformersFp32) {
  const GoldenCase c = LoadGoldenCase(GetParam().name);
  const GoldenModel m = testing::LoadGoldenModel(c, testing::ReferenceOptions(GetParam().kernel));
  ASSERT_NE(m.model, nullptr);
  auto out = testing::GoldenForward(*m.model, c, /*return_logits=*/true);
  ASSERT_TRUE(out.ok()) << out.status();
  testing::ExpectMatchesGolden(*out, c, kDecoderRelTol, c.name);
}

INSTANTIATE_TEST_SUITE_P(Cases, DecoderGoldenTest,
                         ::testing::ValuesIn(testing::EagerAndSdpa(
                             {"tiny_code_llama", "rand_llama3_gqa", "rand_yarn_mqa", "rand_linear_headdim",
                              "rand_default_mha", "rand_qwen2", "rand_qwen3", "rand_mixtral", "rand_qwen3_moe",
                              "rand_qwen3_moe_unnorm"})),
                         testing::KernelCaseName);

TEST(DecoderForwardTest, SamplesDoNotSeeEachOther) {
  const GoldenModel m = testing::LoadGoldenModel(LoadGoldenCase("rand_default_mha"), ModelOptions{});
  ASSERT_NE(m.model, nullptr);
  testing::ExpectPackedLikeAlone(*m.model, {5, 9, 17, 3, 200, 44, 1}, {8, 8, 8, 100}, {0, 3}, 256);
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
