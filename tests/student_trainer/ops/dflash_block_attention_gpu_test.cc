// The DFlash block attention on the GPU in bf16 (16-bit GEMM operands,
// fp32 scores and softmax) against the plain formulation in fp64 on the
// same bf16-valued inputs, its context part three ways: the flash kernels,
// the chunks with their fused softmax kernels, and the chunks in ATen
// statements. Shapes: the Qwen3-8B draft's heads (32 query heads, 8
// key/value heads, head_dim 128, blocks of 16) over packed samples whose
// lengths are and are not multiples of the 64-row key tile, and a smaller
// head (head_dim 64, 4 query heads per key/value head, blocks of 8). Also
// its memory at 16k tokens, where the dense mask would not fit.
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

struct HeadShape {
  int64_t block_size, q_heads, kv_heads, head_dim;
};
constexpr HeadShape kQwen3_8B{16, 32, 8, 128};

// Anchors drawn at random, ascending, in each sample of `lengths`.
ops::DFlashAttentionBlocks RandomBlocks(const std::vector<int64_t>& lengths,
                                        int64_t anchors_per_sample, int64_t block_size) {
  ops::DFlashAttentionBlocks b;
  b.block_size = block_size;
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

Inputs RandomInputs(int64_t T, int64_t R, const HeadShape& h, const torch::TensorOptions& o) {
  Inputs in;
  for (const auto& shape : {std::vector<int64_t>{R, h.q_heads, h.head_dim},
                            {T, h.kv_heads, h.head_dim},
                            {T, h.kv_heads, h.head_dim},
                            {R, h.kv_heads, h.head_dim},
                            {R, h.kv_heads, h.head_dim}}) {
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

// How the context part runs.
enum class ContextPath { kFlash, kChunkKernels, kChunkAten };
const char* Name(ContextPath p) {
  return p == ContextPath::kFlash ? "flash kernels" : p == ContextPath::kChunkKernels ? "chunk kernels" : "ATen";
}

void ExpectWithinBounds(const HeadShape& h, const std::vector<int64_t>& lengths, int64_t anchors) {
  const at::Device gpu(at::kCUDA, 0);
  const ops::DFlashAttentionBlocks blocks = RandomBlocks(lengths, anchors, h.block_size);
  const int64_t T = blocks.context_rows, R = blocks.num_blocks() * h.block_size;
  // bf16-valued inputs, so that every formulation reads the same numbers.
  const auto bf16_valued = torch::TensorOptions().dtype(at::kBFloat16);
  Inputs in = RandomInputs(T, R, h, bf16_valued);
  const at::Tensor dout = torch::randn({R, h.q_heads, h.head_dim}, bf16_valued);
  for (at::Tensor& t : in.t) t = t.to(at::kDouble);
  const Outcome exact = Backprop(in, dout.to(at::kDouble), at::kDouble, at::kCPU, [&](auto... t) {
    return testing::PlainDFlashAttention(blocks, t...);
  });
  const Outcome dense = Backprop(in, dout, at::kBFloat16, gpu, [&](auto... t) {
    return testing::PlainDFlashAttention(blocks, t...);
  });
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.head_dim));
  for (ContextPath path : {ContextPath::kFlash, ContextPath::kChunkKernels, ContextPath::kChunkAten}) {
    for (int64_t budget : {int64_t{1} << 22, int64_t{1} << 27}) {
      if (path == ContextPath::kFlash && budget != int64_t{1} << 27) continue;  // no chunks
      ops::SetStudentKernelsEnabled(path != ContextPath::kChunkAten);
      ops::DFlashAttentionOptions o;
      o.chunk_scores = budget;
      o.flash = path == ContextPath::kFlash;
      const auto plan = ops::PlanDFlashAttention(blocks, h.q_heads, gpu, o);
      const int64_t launches = ops::StudentKernelLaunches();
      const Outcome fast = Backprop(in, dout, at::kBFloat16, gpu, [&](auto... t) {
        return ops::DFlashBlockAttention(t..., plan, scale);
      });
      ops::SetStudentKernelsEnabled(true);
      // The flash path launches one forward and one backward; the chunk kernels one pair per chunk.
      const int64_t launched = ops::StudentKernelLaunches() - launches;
      if (path == ContextPath::kFlash) {
        EXPECT_EQ(launched, 2);
      } else {
        EXPECT_EQ(launched > 0, path == ContextPath::kChunkKernels);
      }
      const char* names[] = {"q", "k_ctx", "v_ctx", "k_blk", "v_blk"};
      const double out_err = RelInf(fast.out, exact.out), dense_out_err = RelInf(dense.out, exact.out);
      std::printf("head_dim %ld, %s, chunk budget %ld: output rel err %.2e (dense bf16 %.2e)\n",
                  static_cast<long>(h.head_dim), Name(path), static_cast<long>(budget), out_err, dense_out_err);
      EXPECT_LT(out_err, std::min(2e-2, std::max(2 * dense_out_err, 4e-3))) << Name(path);
      for (size_t i = 0; i < exact.grads.size(); ++i) {
        const double err = RelInf(fast.grads[i], exact.grads[i]), dense_err = RelInf(dense.grads[i], exact.grads[i]);
        std::printf("  d%s rel err %.2e (dense bf16 %.2e)\n", names[i], err, dense_err);
        EXPECT_LT(err, std::min(2e-2, std::max(2 * dense_err, 4e-3))) << Name(path) << " d" << names[i];
      }
    }
  }
}

TEST(DFlashBlockAttentionGpuTest, Bf16MatchesTheFp64PlainFormulationWithinStatedBounds) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  torch::manual_seed(5);
  ExpectWithinBounds(kQwen3_8B, {1536, 512}, 48);
}

TEST(DFlashBlockAttentionGpuTest, RaggedSamplesAcrossKeyTilesWithinStatedBounds) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  torch::manual_seed(7);
  ExpectWithinBounds(kQwen3_8B, {1000, 37, 700, 311}, 24);
}

TEST(DFlashBlockAttentionGpuTest, SmallHeadWithinStatedBounds) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  torch::manual_seed(8);
  ExpectWithinBounds({8, 8, 2, 64}, {900, 124}, 32);
}

TEST(DFlashBlockAttentionGpuTest, MemoryStaysBoundedAt16kTokens) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
#ifdef E3_HAS_CUDA
  torch::manual_seed(6);
  const at::Device gpu(at::kCUDA, 0);
  const ops::DFlashAttentionBlocks blocks = RandomBlocks({16384}, 512, kQwen3_8B.block_size);
  const int64_t T = 16384, R = blocks.num_blocks() * kQwen3_8B.block_size;
  Inputs in = RandomInputs(T, R, kQwen3_8B, torch::TensorOptions().device(gpu).dtype(at::kBFloat16));
  for (at::Tensor& t : in.t) t.requires_grad_();
  const auto plan = ops::PlanDFlashAttention(blocks, kQwen3_8B.q_heads, gpu);
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
