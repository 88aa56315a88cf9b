// bf16 on GPU: both backends (hf, and sgl with its fused CUDA kernels and
// varlen flash attention) against transformers' own bf16 (sdpa, CUDA)
// outputs stored in the golden fixtures (hf_bf16.*), under the same bound.
//
// The bound and its reason: tests/teacher_server/bf16_golden.h.
#include <gtest/gtest.h>

#include "common/model/model_dir.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/models/causal_lm.h"
#include "tests/teacher_server/bf16_golden.h"
#include "tests/teacher_server/golden_fixture.h"

namespace e3 {
namespace {

using testing::LoadGoldenCase;
using testing::RelInf;

class LlamaBf16GpuTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(LlamaBf16GpuTest, MatchesTransformersBf16WithinStatedBound) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  const auto& [case_name, backend] = GetParam();
  const auto c = LoadGoldenCase(case_name);
  if (!c.tensors.count("hf_bf16.aux_hidden")) GTEST_SKIP() << "fixture made without CUDA";
  std::unique_ptr<CausalLM> model;
  int64_t layers = 0;
  const int64_t launches = FusedKernelLaunches();
  const ForwardOutput out = testing::Bf16Forward(c, backend, &model, &layers);
  // sgl really ran its kernels: per layer 2 norms, 1 SiLU-mul and rope
  // (one launch for q and k together, as qkv is fused at load).
  if (backend == "sgl") EXPECT_GE(FusedKernelLaunches() - launches, 4 * layers);
  testing::ExpectWithinTransformersBf16(c, backend, out);
}

INSTANTIATE_TEST_SUITE_P(Cases, LlamaBf16GpuTest,
                         ::testing::Combine(::testing::Values("tiny_code_llama", "rand_llama3_gqa", "rand_yarn_mqa",
                                                              "rand_linear_headdim", "rand_default_mha"),
                                            ::testing::Values("hf", "sgl")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace e3
