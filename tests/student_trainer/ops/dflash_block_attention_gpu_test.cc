// The DFlash block attention on the GPU in bf16 (16-bit GEMM operands,
// fp32 scores and softmax; the chunk softmax in its fused kernels and in
// ATen statements) against the plain formulation in fp64 on the
// same bf16-valued inputs, at the Qwen3-8B draft's head shape (32 query
// heads, 8 key/value heads, head_dim 128, blocks of 16) over two packed
// samples; and its memory at 16k tokens, where the dense mask would not fit.
//
// Tolerance: the relative max-norm error of the output and of every
// input's gradient stays within 2e-2 (bf16's ulp is 2^-8 = 3.9e-3
// relative; P and dS are rounded to bf16 before their GEMMs, as flash
// attention rounds them), and within twice the error of the plain
// formulation run in bf16 on the same GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#ifdef E3_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "common/torch/torch_core.h"
#include "student_trainer/ops/dflash_block_attention.h"
#include "student_trainer/ops/kernel_switch.h"
#include "tests/rel_inf.h"
#include "tests/student_trainer/ops/dflash_attention_reference.h"

namespace e3 {
namespace {

using testing::RelInf;

constexpr int64_t kB = 16, kHq = 32, kHkv = 8, kD = 128;

// Anchors drawn at random, ascending, in each sample of `lengths`.
ops::DFlashAttentionBlocks RandomBlocks(const std::vector<int64_t>& lengths,
                                        int64_t anchors_per_sample) {
  ops::DFlashAttentionBlocks b;
  b.block_size = kB;
  int64_t begin = 0;
  for (int64_t n : lengths) {
    const at::Tensor picked =
        std::get<0>(torch::randperm(n, torch::kLong).narrow(0, 0, anchors_per_sample).sort());
    for (int64_t i = 0; i < anchors_per_sample; ++i) {
      b.context_begin.push_back(begin);
      b.context_end.push_back(begin + picked[i].item<int64_t>());
    }
    begin += n;
  }
  b.context_rows = begin;
  return b;
}

struct Inputs {
  std::vector<at::Tensor> t;  // q, k_ctx, v_ctx, k_blk, v_blk
};

Inputs RandomInputs(int64_t T, int64_t R, const torch::TensorOptions& o) {
  Inputs in;
  for (const auto& shape : {std::vector<int64_t>{R, kHq, kD},
                            {T, kHkv, kD},
                            {T, kHkv, kD},
                            {R, kHkv, kD},
                            {R, kHkv, kD}}) {
    in.t.push_back(torch::randn(shape, o));
  }
  return in;
}

struct Outcome {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};

template <typename Attention>
Outcome Backprop(const Inputs& in, const at::Tensor& dout, const at::ScalarType dtype,
                 const at::Device& device, Attention attention) {
  std::vector<at::Tensor> x;
  for (const at::Tensor& t : in.t) x.push_back(t.detach().to(device, dtype).clone().requires_grad_());
  Outcome r;
  r.out = attention(x[0], x[1], x[2], x[3], x[4]);
  (r.out * dout.to(device, dtype)).sum().backward();
  for (const at::Tensor& t : x) r.grads.push_back(t.grad());
  r.out = r.out.detach();
  return r;
}

TEST(DFlashBlockAttentionGpuTest, Bf16MatchesTheFp64PlainFormulationWithinStatedBounds) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  torch::manual_seed(5);
  const at::Device gpu(at::kCUDA, 0);
  const ops::DFlashAttentionBlocks blocks = RandomBlocks({1536, 512}, 48);
  const int64_t T = 2048, R = blocks.num_blocks() * kB;
  // bf16-valued inputs, so that every formulation reads the same numbers.
  const auto bf16_valued = torch::TensorOptions().dtype(at::kBFloat16);
  Inputs in = RandomInputs(T, R, bf16_valued);
  const at::Tensor dout = torch::randn({R, kHq, kD}, bf16_valued);
  for (at::Tensor& t : in.t) t = t.to(at::kDouble);
  const Outcome exact = Backprop(in, dout.to(at::kDouble), at::kDouble, at::kCPU, [&](auto... t) {
    return testing::PlainDFlashAttention(blocks, t...);
  });
  const Outcome dense = Backprop(in, dout, at::kBFloat16, gpu, [&](auto... t) {
    return testing::PlainDFlashAttention(blocks, t...);
  });
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  // Both chunk softmaxes: the fused kernels, and the ATen statements.
  for (bool kernels : {true, false}) {
    for (int64_t budget : {int64_t{1} << 22, int64_t{1} << 27}) {
      ops::SetStudentKernelsEnabled(kernels);
      ops::DFlashAttentionOptions o;
      o.chunk_scores = budget;
      const auto plan = ops::PlanDFlashAttention(blocks, kHq, gpu, o);
      const int64_t launches = ops::StudentKernelLaunches();
      const Outcome fast = Backprop(in, dout, at::kBFloat16, gpu, [&](auto... t) {
        return ops::DFlashBlockAttention(t..., plan, scale);
      });
      ops::SetStudentKernelsEnabled(true);
      EXPECT_EQ(ops::StudentKernelLaunches() > launches, kernels);
      const char* names[] = {"q", "k_ctx", "v_ctx", "k_blk", "v_blk"};
      const double out_err = RelInf(fast.out, exact.out),
                   dense_out_err = RelInf(dense.out, exact.out);
      std::printf("%s, chunk budget %ld: output rel err %.2e (dense bf16 %.2e)\n",
                  kernels ? "kernels" : "ATen", static_cast<long>(budget), out_err, dense_out_err);
      EXPECT_LT(out_err, std::min(2e-2, std::max(2 * dense_out_err, 4e-3)));
      for (size_t i = 0; i < exact.grads.size(); ++i) {
        const double err = RelInf(fast.grads[i], exact.grads[i]),
                     dense_err = RelInf(dense.grads[i], exact.grads[i]);
        std::printf("  d%s rel err %.2e (dense bf16 %.2e)\n", names[i], err, dense_err);
        EXPECT_LT(err, std::min(2e-2, std::max(2 * dense_err, 4e-3))) << names[i];
      }
    }
  }
}

TEST(DFlashBlockAttentionGpuTest, MemoryStaysBoundedAt16kTokens) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
#ifdef E3_HAS_CUDA
  torch::manual_seed(6);
  const at::Device gpu(at::kCUDA, 0);
  const ops::DFlashAttentionBlocks blocks = RandomBlocks({16384}, 512);
  const int64_t T = 16384, R = blocks.num_blocks() * kB;
  Inputs in = RandomInputs(T, R, torch::TensorOptions().device(gpu).dtype(at::kBFloat16));
  for (at::Tensor& t : in.t) t.requires_grad_();
  const auto plan = ops::PlanDFlashAttention(blocks, kHq, gpu);
  torch::cuda::synchronize(0);
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const at::Tensor out =
      ops::DFlashBlockAttention(in.t[0], in.t[1], in.t[2], in.t[3], in.t[4], plan, 0.088);
  out.sum().backward();
  torch::cuda::synchronize(0);
  const double peak_gb =
      static_cast<double>(
          c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak - before) /
      1e9;
  // The dense mask's fp32 scores alone: 32 heads x 8192 rows x (16384 + 8192) keys x 4 bytes = 25.8
  // GB.
  std::printf("16k tokens, 512 blocks: peak %.2f GB beyond the inputs\n", peak_gb);
  EXPECT_LT(peak_gb, 4.0);
#endif
}

}  // namespace
}  // namespace e3
