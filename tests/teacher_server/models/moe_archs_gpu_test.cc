// DeepSeek and GPT-OSS on a GPU, both backends, and the sgl pieces they
// add: GPT-OSS's sink attention through the varlen flash kernel, the
// grouped experts with biases and the clamped activation, DeepSeekMoE's
// fp32 router weights in the combine kernel. (SglModelGpuTest, in
// sgl_kernels_gpu_test.cc, holds their whole sgl forward to hf under the
// Llama family's consistency bound and checks their CUDA graphs.)
//
// Bounds and their reasons:
// - Against transformers' own bf16 outputs stored in the golden fixtures
//   (hf_bf16.*): the bound of tests/teacher_server/bf16_golden.h, with
//   three positions' slack in the argmax agreement (see the test).
// - FlashSinkAttention against the eager sink attention, both on the same
//   bf16 inputs: no further from an fp32 evaluation than 1.5x the eager
//   bf16 path plus 2^-9 (FusedPackedAttentionMatchesPerSampleSdpa's bound:
//   flash keeps fp32 statistics, the eager path takes its softmax in bf16
//   as transformers does). The window must take effect: the windowed result
//   is far (> 5%) from the unwindowed truth.
// - Grouped experts against the per-expert loop: GroupedMoeGpuTest's bound
//   (RMS error against fp32 within 1.1x the loop's; no NaN from the rows of
//   other ranks' experts). The combine kernel with fp32 weights and the
//   clamped activation kernel: exact (each rounds where the ATen sequence
//   stores a tensor, with the same fp32 operations).
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_runtime.h"
#include "common/model/model_dir.h"
#include "common/torch/torch_compat.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/clamped_swiglu.h"
#include "teacher_server/layers/deepseek_moe.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/moe.h"
#include "teacher_server/layers/sink_attention.h"
#include "teacher_server/models/causal_lm.h"
#include "tests/teacher_server/bf16_golden.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/random_experts.h"

namespace e3 {
namespace {

using testing::LoadGoldenCase;
using testing::RelInf;

class MoeArchsBf16GpuTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(MoeArchsBf16GpuTest, MatchesTransformersBf16WithinStatedBound) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  const auto& [case_name, backend] = GetParam();
  const auto c = LoadGoldenCase(case_name);
  if (!c.tensors.count("hf_bf16.aux_hidden")) GTEST_SKIP() << "fixture made without CUDA";
  std::unique_ptr<CausalLM> model;
  const int64_t launches = FusedKernelLaunches();
  const ForwardOutput out = testing::Bf16Forward(c, backend, &model);
  ASSERT_NE(model, nullptr);
  const std::string techniques = model->Techniques();
  std::printf("[%s %s] %s\n", c.name.c_str(), backend.c_str(), techniques.c_str());
  const int cc = CudaComputeCapability(0);
  if (backend == "sgl" && compat::kHasGroupedMm && (cc / 10 == 9 || cc / 10 == 10)) {
    EXPECT_NE(techniques.find("experts by grouped GEMMs"), std::string::npos) << techniques;
  }
  if (backend == "sgl" && c.name.find("gpt_oss") != std::string::npos && compat::kHasFlashVarlen) {
    EXPECT_NE(techniques.find("sinks through its log-sum-exp"), std::string::npos) << techniques;
  }
  if (backend == "sgl") {
    EXPECT_GT(FusedKernelLaunches(), launches) << "sgl ran its kernels";
  }
  // Three positions' slack in the argmax agreement: these fixtures have 70
  // positions, and where the fp32 logits' top two are closer than bf16's
  // rounding, the head's precision alone decides (the MXFP4 GPT-OSS
  // case's hidden states match transformers' own bf16 error exactly under
  // hf, 0.5506 and 0.4331, while 63 against 65 of 70 argmaxes agree with
  // fp32).
  testing::ExpectWithinTransformersBf16(c, backend, out, /*argmax_slack_positions=*/3);
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeArchsBf16GpuTest,
                         ::testing::Combine(::testing::Values("rand_deepseek_v3", "rand_deepseek_v2_lite",
                                                              "rand_deepseek_v3_fp8", "rand_gpt_oss",
                                                              "rand_gpt_oss_mxfp4"),
                                            ::testing::Values("hf", "sgl")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// GPT-OSS's attention core through the varlen flash kernel: ragged samples
// (one shorter than the window, some longer), GQA, head dims 64 and 16,
// with sinks and without, with a window and without.
TEST(FlashSinkAttentionGpuTest, MatchesTheEagerSinkAttention) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  ASSERT_TRUE(compat::kHasFlashVarlen) << "LibTorch 2.5+ with CUDA has the varlen flash kernel";
  torch::manual_seed(12);
  const at::Device cuda("cuda:0");
  const std::vector<int64_t> cu{0, 5, 300, 429, 1453};
  const int64_t T = cu.back(), heads = 8, kv = 2;
  for (const int64_t D : {64, 16}) {
    for (const int64_t window : {int64_t{0}, int64_t{128}}) {
      for (const bool with_sinks : {true, false}) {
        const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
        const at::Tensor q = torch::randn({T, heads, D}, bf16), k = torch::randn({T, kv, D}, bf16),
                         v = torch::randn({T, kv, D}, bf16);
        const at::Tensor sinks = with_sinks ? (torch::randn({heads}) * 2).to(cuda, at::kBFloat16) : at::Tensor();
        const double scale = 1.0 / std::sqrt(static_cast<double>(D));
        const PackedLayout flash_layout = MakePackedLayout(cu, cuda, AttentionKernel::kFlashVarlen);
        const PackedLayout eager_layout = MakePackedLayout(cu, cuda, AttentionKernel::kEager);
        ASSERT_TRUE(FlashVarlenAppliesTo(at::kBFloat16, D, cuda));
        const at::Tensor flash = FlashSinkAttention(q, k, v, flash_layout, scale, sinks, window);
        const at::Tensor eager = PackedSinkAttention(q, k, v, eager_layout, scale, sinks, window);
        auto f32 = [](const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; };
        const at::Tensor truth = PackedSinkAttention(f32(q), f32(k), f32(v), eager_layout, scale, f32(sinks), window);
        const double flash_err = RelInf(flash.to(at::kFloat).cpu(), truth.cpu());
        const double eager_err = RelInf(eager.to(at::kFloat).cpu(), truth.cpu());
        std::printf("D=%ld window %ld sinks %d: vs fp32: flash %.3g, eager bf16 %.3g\n", static_cast<long>(D),
                    static_cast<long>(window), with_sinks ? 1 : 0, flash_err, eager_err);
        EXPECT_LE(flash_err, 1.5 * eager_err + 1.0 / 512) << "D " << D << ", window " << window;
        if (window > 0) {
          const at::Tensor unwindowed =
              PackedSinkAttention(f32(q), f32(k), f32(v), eager_layout, scale, f32(sinks), /*sliding_window=*/0);
          EXPECT_GT(RelInf(flash.to(at::kFloat).cpu(), unwindowed.cpu()), 0.05) << "the window took no effect";
        }
      }
    }
  }
}

// The combine kernel with DeepSeekMoE's fp32 router weights: each fp32
// product of a widened output and its weight rounded to the dtype, then
// added: the op sequence's bits.
TEST(MoeCombineGpuTest, Fp32WeightsAreExact) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  torch::manual_seed(13);
  const int64_t T = 257, k = 6, H = 1024;
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const auto opts = at::TensorOptions().dtype(dtype).device(at::kCUDA);
    const at::Tensor y = torch::randn({T * k, H}, opts);
    const at::Tensor rows =
        torch::randperm(T * k, at::TensorOptions().dtype(at::kLong).device(at::kCUDA)).view({T, k});
    const at::Tensor weights = torch::rand({T, k}, at::TensorOptions().device(at::kCUDA)) * 2.5;
    const at::Tensor valid = torch::rand({T, k}, at::TensorOptions().device(at::kCUDA)) > 0.2;
    for (const at::Tensor& v : {at::Tensor(), valid}) {
      const int64_t launches = FusedKernelLaunches();
      const at::Tensor got = MoeCombine(y, rows, weights, v, /*fused=*/true);
      EXPECT_EQ(FusedKernelLaunches(), launches + 1) << "the kernel takes fp32 weights";
      EXPECT_TRUE(got.equal(MoeCombine(y, rows, weights, v, /*fused=*/false))) << c10::toString(dtype);
    }
  }
}

// GPT-OSS's activation kernel (bias add, clamps, sigmoid gain, (up + 1)
// product) against the ATen sequence it replaces: exact, with and without
// the per-row expert bias, and below a device-side row limit (rows past it
// unwritten). The gate/up values reach past the clamp on both sides.
TEST(BiasClampedSwiGluGpuTest, IsExact) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  torch::manual_seed(15);
  const int64_t P = 1001, I = 2880, E = 7;
  const ClampedSwiGlu act{1.702, 7.0};
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const auto opts = at::TensorOptions().dtype(dtype).device(at::kCUDA);
    const at::Tensor gate_up = torch::randn({P, 2 * I}, opts) * 6;
    const at::Tensor bias = torch::randn({E, 2 * I}, opts);
    const at::Tensor row_expert =
        torch::randint(E, {P}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
    for (const bool biased : {true, false}) {
      const at::Tensor b = biased ? bias : at::Tensor(), r = biased ? row_expert : at::Tensor();
      const int64_t launches = FusedKernelLaunches();
      const at::Tensor got = BiasClampedSwiGlu(gate_up, b, r, act, /*fused=*/true);
      EXPECT_EQ(FusedKernelLaunches(), launches + 1);
      const at::Tensor want = BiasClampedSwiGlu(gate_up, b, r, act, /*fused=*/false);
      const int64_t differ = got.ne(want).sum().item<int64_t>();
      EXPECT_EQ(differ, 0) << c10::toString(dtype) << (biased ? " with" : " without") << " bias: " << differ
                           << " of " << want.numel() << " differ, max "
                           << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
      const at::Tensor limit = torch::full({1}, 400, at::TensorOptions().dtype(at::kInt).device(at::kCUDA));
      const at::Tensor limited = BiasClampedSwiGlu(gate_up, b, r, act, /*fused=*/true, limit);
      EXPECT_TRUE(limited.narrow(0, 0, 400).equal(want.narrow(0, 0, 400))) << "rows below the limit";
    }
  }
}

// The grouped experts on a GPU against the per-expert loop: GPT-OSS's
// clamped experts with biases (its routing), and DeepSeek's SwiGLU experts
// under its routing with fp32 weights; all experts and an EP subset.
TEST(GroupedMoeGpuTest, GptOssAndDeepseekExpertsMatchTheLoop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  torch::manual_seed(14);
  const at::Device cuda("cuda:0");
  const int64_t H = 256, I = 128, T = 700, total = 16;
  MoeRouting gpt_oss;
  gpt_oss.top_k = 4;
  gpt_oss.topk_then_softmax = true;
  gpt_oss.clamped_swiglu = ClampedSwiGlu{1.702, 7.0};
  DeepseekRouting deepseek;
  deepseek.n_group = 4;
  deepseek.topk_group = 2;
  deepseek.top_k = 4;
  deepseek.normalize = true;
  deepseek.routed_scaling_factor = 2.5;
  for (const bool clamped : {true, false}) {
    for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 16}, {4, 6}}) {
      MoeWeights w = testing::RandomExperts(total, first, count, H, I, at::kBFloat16, 1.0 / 8, cuda);
      if (clamped) {
        w.router_bias = torch::randn({total}).to(cuda, at::kBFloat16);
        for (MlpWeights& m : w.experts) {
          m.gate_up_bias = torch::randn({2 * I}).to(cuda, at::kBFloat16);
          m.down_bias = torch::randn({H}).to(cuda, at::kBFloat16);
        }
      }
      // The fp32 evaluation of the same (rounded) weights.
      MoeWeights f32 = w;
      f32.router = w.router.to(at::kFloat);
      if (f32.router_bias.defined()) f32.router_bias = w.router_bias.to(at::kFloat);
      for (MlpWeights& m : f32.experts) {
        for (at::Tensor* t : {&m.gate_up_proj, &m.down_proj, &m.gate_up_bias, &m.down_bias}) {
          if (t->defined()) *t = t->to(at::kFloat);
        }
      }
      const at::Tensor x = (torch::randn({T, H}) * (clamped ? 4 : 1)).to(cuda, at::kBFloat16);
      MoeWeights stacked = w;
      ASSERT_TRUE(ExpertsStackable(stacked));
      StackExperts(&stacked);
      at::Tensor loop, grouped, truth;
      if (clamped) {
        loop = SparseMoe(x, w, gpt_oss, /*fused_activation=*/true);
        grouped = GroupedMoe(x, stacked, gpt_oss, /*fused_activation=*/true);
        truth = SparseMoe(x.to(at::kFloat), f32, gpt_oss);
      } else {
        // One routing for all three (bf16 and fp32 routers could choose
        // differently near ties).
        const at::Tensor score_bias = torch::randn({total}, at::TensorOptions().device(cuda)) * 0.1;
        auto [ids, weights] = DeepseekRoute(x, w.router, score_bias, deepseek);
        loop = WeightedExpertsSum(x, w, weights, ids, /*fused_activation=*/true);
        grouped = GroupedExpertsSum(x, stacked, weights, ids, /*fused_activation=*/true);
        truth = WeightedExpertsSum(x.to(at::kFloat), f32, weights, ids);
      }
      const std::string what =
          absl::StrCat(clamped ? "GPT-OSS" : "DeepSeek", " experts [", first, ", ", first + count, ")");
      EXPECT_FALSE(grouped.isnan().any().item<bool>()) << what;
      const at::Tensor t64 = truth.to(at::kDouble);
      const double rms_grouped = (grouped.to(at::kDouble) - t64).pow(2).mean().sqrt().item<double>();
      const double rms_loop = (loop.to(at::kDouble) - t64).pow(2).mean().sqrt().item<double>();
      std::printf("%s: RMS error against fp32, grouped %.3g, loop %.3g\n", what.c_str(), rms_grouped, rms_loop);
      EXPECT_LE(rms_grouped, 1.1 * rms_loop) << what;
    }
  }
}

}  // namespace
}  // namespace e3
