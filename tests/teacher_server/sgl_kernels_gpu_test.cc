// The sgl backend's CUDA kernels against the reference op sequences they
// replace (fused_ops.h), in bf16 and fp16 on a GPU.
//
// Bounds and their reasons:
// - SiLU-mul, rope and the residual sum: exact. Each kernel rounds to the
//   storage dtype exactly where the reference stores a tensor, with the
//   same fp32 operations in the same order.
// - The normalised output: within two units in the last place of the
//   dtype. The mean of squares is a sum over the row whose order differs
//   (block reduction vs ATen's reduction); that can move rsqrt by an fp32
//   ulp, which can flip the rounding of the stored normalised value by one
//   ulp; the weight (|w| < 2 here) scales that step, and the final product
//   rounds once more: at most 2 ulps of the output. (Measured on an H200:
//   bf16 never differs; fp16 differs in 0.0007% of elements.)
// - Varlen flash attention against the per-sample SDPA loop: both are
//   bf16 attention with fp32 accumulation in different orders. Bound: the
//   flash output is no further from an fp32 reference than 1.5x the SDPA
//   output's distance from it, plus 2^-9.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "common/torch/torch_compat.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/rms_norm.h"
#include "teacher_server/layers/rotary.h"
#include "tests/teacher_server/golden_fixture.h"

namespace e3 {
namespace {

using testing::RelInf;

class SglKernelsGpuTest : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
    ASSERT_TRUE(FusedKernelsBuilt()) << "a CUDA build must have the kernels";
  }
  at::TensorOptions opts() const { return at::TensorOptions().dtype(GetParam()).device(at::kCUDA); }
  // Two units in the last place of |x| in this dtype (fp16's subnormal
  // spacing, 2^-24, below its normal range).
  at::Tensor TwoUlps(const at::Tensor& x) const {
    const bool bf16 = GetParam() == at::kBFloat16;
    at::Tensor mag = x.to(at::kFloat).abs().clamp_min(bf16 ? 1e-30 : 6.104e-5);
    return 2 * at::pow(2.0, at::floor(at::log2(mag)) - (bf16 ? 7 : 10));
  }
};

TEST_P(SglKernelsGpuTest, AddRmsNormMatchesTheReference) {
  torch::manual_seed(3);
  for (int64_t H : {64, 256, 2048, 4096, 8192}) {
    const at::Tensor w = (torch::randn({H}, opts()) * 0.5 + 1.0).clamp(-1.9, 1.9);
    const at::Tensor h0 = torch::randn({37, H}, opts()) * 4;
    const at::Tensor delta = torch::randn({37, H}, opts());
    const at::Tensor ref_sum = h0 + delta;
    const at::Tensor ref = RmsNorm(ref_sum, w, 1e-5);
    at::Tensor h = h0;
    const int64_t before = FusedKernelLaunches();
    const at::Tensor y = AddRmsNorm(&h, delta, w, 1e-5, /*fused=*/true);
    EXPECT_EQ(FusedKernelLaunches() - before, 1) << "H=" << H << ": the kernel did not run";
    EXPECT_TRUE(h.equal(ref_sum)) << "H=" << H;
    EXPECT_TRUE(h0.equal(h0.clone())) << "the old stream must stay";
    const at::Tensor err = (y.to(at::kFloat) - ref.to(at::kFloat)).abs();
    EXPECT_TRUE(err.le(TwoUlps(ref)).all().item<bool>()) << "H=" << H << " max err " << err.max().item<float>();
    const double differ = err.gt(0).to(at::kFloat).mean().item<double>();
    std::printf("H=%ld %s: norm outputs differing at all: %.4f%%\n", static_cast<long>(H),
                c10::toString(GetParam()), 100 * differ);
    // No delta: the norm alone, h untouched.
    at::Tensor h2 = h0;
    const at::Tensor y2 = AddRmsNorm(&h2, at::Tensor(), w, 1e-5, true);
    EXPECT_TRUE(h2.equal(h0));
    const at::Tensor ref2 = RmsNorm(h0, w, 1e-5);
    EXPECT_TRUE((y2.to(at::kFloat) - ref2.to(at::kFloat)).abs().le(TwoUlps(ref2)).all().item<bool>());
  }
}

TEST_P(SglKernelsGpuTest, SiluMulIsExact) {
  torch::manual_seed(4);
  for (int64_t I : {128, 8192, 14336}) {
    const at::Tensor gate_up = torch::randn({53, 2 * I}, opts()) * 3;
    const at::Tensor ref = at::silu(gate_up.narrow(1, 0, I)) * gate_up.narrow(1, I, I);
    const int64_t before = FusedKernelLaunches();
    const at::Tensor y = SiluMul(gate_up, /*fused=*/true);
    EXPECT_EQ(FusedKernelLaunches() - before, 1);
    EXPECT_TRUE(y.equal(ref)) << "I=" << I << " max err "
                              << (y.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<float>();
  }
  // A width the vector kernel does not take falls back to the reference.
  const at::Tensor odd = torch::randn({5, 2 * 12}, opts());
  EXPECT_TRUE(SiluMul(odd, true).equal(at::silu(odd.narrow(1, 0, 12)) * odd.narrow(1, 12, 12)));
}

TEST_P(SglKernelsGpuTest, RopeInPlaceIsExactOnFusedQkvViews) {
  torch::manual_seed(5);
  const int64_t T = 41;
  // (heads, kv heads, head_dim, rotary_dim): Llama 8B/1B-like, a scalar
  // path (half of 4 features), partial rotary.
  for (auto [heads, kv, D, rot] : std::vector<std::array<int64_t, 4>>{
           {32, 8, 128, 128}, {32, 8, 64, 64}, {8, 2, 8, 8}, {4, 2, 32, 16}}) {
    const int64_t q_out = heads * D, kv_out = kv * D;
    at::Tensor qkv = torch::randn({T, q_out + 2 * kv_out}, opts());
    const at::Tensor original = qkv.clone();
    const at::Tensor angles = torch::randn({T, rot}, opts().dtype(at::kFloat)) * 3;
    const at::Tensor cos = angles.cos().to(GetParam()), sin = angles.sin().to(GetParam());
    at::Tensor q = qkv.narrow(1, 0, q_out).view({T, heads, D});
    at::Tensor k = qkv.narrow(1, q_out, kv_out).view({T, kv, D});
    auto expected = [&](const at::Tensor& x) {
      at::Tensor r = ApplyRotary(x.narrow(-1, 0, rot), cos, sin);
      return rot == D ? r : torch::cat({r, x.narrow(-1, rot, D - rot)}, -1);
    };
    const at::Tensor eq = expected(original.narrow(1, 0, q_out).view({T, heads, D}));
    const at::Tensor ek = expected(original.narrow(1, q_out, kv_out).view({T, kv, D}));
    const int64_t before = FusedKernelLaunches();
    RopeInPlace(q, cos, sin, /*fused=*/true);
    RopeInPlace(k, cos, sin, /*fused=*/true);
    EXPECT_EQ(FusedKernelLaunches() - before, 2);
    EXPECT_TRUE(q.equal(eq)) << "D=" << D << " rot=" << rot;
    EXPECT_TRUE(k.equal(ek)) << "D=" << D << " rot=" << rot;
    EXPECT_TRUE(qkv.narrow(1, q_out + kv_out, kv_out).equal(original.narrow(1, q_out + kv_out, kv_out)))
        << "v must stay";
  }
}

TEST_P(SglKernelsGpuTest, FusedPackedAttentionMatchesPerSampleSdpa) {
  ASSERT_TRUE(compat::kHasFlashVarlen) << "LibTorch 2.x with CUDA has the varlen flash kernel";
  torch::manual_seed(6);
  // Ragged (varlen flash: lengths 1, 37, 300, 129, 1024) and uniform (cuDNN's batched kernel).
  for (const std::vector<int64_t>& cu : {std::vector<int64_t>{0, 1, 38, 338, 467, 1491},
                                         std::vector<int64_t>{0, 384, 768, 1152}})
  for (int64_t D : {64, 128}) {
    const int64_t T = cu.back(), heads = 8, kv = 2;
    const at::Tensor q = torch::randn({T, heads, D}, opts()), k = torch::randn({T, kv, D}, opts()),
                     v = torch::randn({T, kv, D}, opts());
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const PackedLayout flash_layout = MakePackedLayout(cu, q.device(), AttentionKernel::kFlashVarlen);
    ASSERT_TRUE(flash_layout.cu_seqlens_device.defined());
    EXPECT_EQ(flash_layout.max_seqlen, cu.size() == 4 ? 384 : 1024);
    EXPECT_EQ(flash_layout.uniform, cu.size() == 4);
    const PackedLayout loop_layout = MakePackedLayout(cu, q.device(), AttentionKernel::kSdpa);
    const at::Tensor flash = PackedCausalAttention(q, k, v, flash_layout, scale, AttentionKernel::kFlashVarlen);
    const at::Tensor sdpa = PackedCausalAttention(q, k, v, loop_layout, scale, AttentionKernel::kSdpa);
    const at::Tensor truth = PackedCausalAttention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                                   loop_layout, scale, AttentionKernel::kEager);
    const double flash_err = RelInf(flash.to(at::kFloat).cpu(), truth.cpu());
    const double sdpa_err = RelInf(sdpa.to(at::kFloat).cpu(), truth.cpu());
    std::printf("D=%ld %s %s: vs fp32 eager: fused %.3g, per-sample SDPA %.3g\n", static_cast<long>(D),
                c10::toString(GetParam()), flash_layout.uniform ? "uniform (cuDNN)" : "ragged (varlen flash)",
                flash_err, sdpa_err);
    EXPECT_LE(flash_err, 1.5 * sdpa_err + 1.0 / 512);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SglKernelsGpuTest, ::testing::Values(at::kBFloat16, at::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace e3
