// The DFlash block attention of ops/dflash_block_attention.h against the
// plain formulation (dflash_attention_reference.h), in fp64: one softmax
// per query row over a materialised mask of every context and block row.
// Packed samples (no attention across them), GQA, a block anchored at its
// sample's first row (no context at all), and chunk budgets from one
// block per chunk to one chunk for all: the output and the gradients of
// all five inputs agree to fp64 rounding.
#include "student_trainer/ops/dflash_block_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/student_trainer/ops/dflash_attention_reference.h"

namespace e3 {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

struct Case {
  int64_t B = 3, Hq = 4, Hkv = 2, D = 8;
  std::vector<int64_t> cu = {0, 9, 16, 22};  // three packed samples
  ops::DFlashAttentionBlocks blocks;
  at::Tensor q, k_ctx, v_ctx, k_blk, v_blk;
  int64_t T() const { return cu.back(); }
  int64_t R() const { return blocks.num_blocks() * B; }
};

// Blocks anchored at rows 0 (no context), 2, 3, 7 of sample 0; 9 (no
// context), 13 of sample 1; 18, 21 of sample 2.
Case MakeCase() {
  torch::manual_seed(11);
  Case c;
  c.blocks.block_size = c.B;
  c.blocks.context_rows = c.T();  // chunks padded past their last anchor, up to the context's end
  const std::vector<std::pair<int64_t, int64_t>> anchors = {{0, 0}, {0, 2}, {0, 3}, {0, 7},
                                                            {9, 9}, {9, 13}, {16, 18}, {16, 21}};
  for (const auto& [begin, anchor] : anchors) {
    c.blocks.context_begin.push_back(begin);
    c.blocks.context_end.push_back(anchor);
  }
  c.q = torch::randn({c.R(), c.Hq, c.D}, kF64);
  c.k_ctx = torch::randn({c.T(), c.Hkv, c.D}, kF64);
  c.v_ctx = torch::randn({c.T(), c.Hkv, c.D}, kF64);
  c.k_blk = torch::randn({c.R(), c.Hkv, c.D}, kF64);
  c.v_blk = torch::randn({c.R(), c.Hkv, c.D}, kF64);
  return c;
}

at::Tensor PlainAttention(const Case& c, const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx,
                          const at::Tensor& k_blk, const at::Tensor& v_blk) {
  return testing::PlainDFlashAttention(c.blocks, q, k_ctx, v_ctx, k_blk, v_blk);
}

struct Result {
  at::Tensor out;
  std::vector<at::Tensor> grads;  // q, k_ctx, v_ctx, k_blk, v_blk
};

template <typename Attention>
Result RunAttention(const Case& c, const at::Tensor& dout, Attention attention) {
  std::vector<at::Tensor> in = {c.q.clone().requires_grad_(), c.k_ctx.clone().requires_grad_(),
                                c.v_ctx.clone().requires_grad_(), c.k_blk.clone().requires_grad_(),
                                c.v_blk.clone().requires_grad_()};
  Result r;
  r.out = attention(in[0], in[1], in[2], in[3], in[4]);
  (r.out * dout).sum().backward();
  for (const at::Tensor& t : in) r.grads.push_back(t.grad());
  r.out = r.out.detach();
  return r;
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(DFlashBlockAttentionTest, EqualsThePlainFormulationForwardAndBackwardAtEveryChunkBudget) {
  const Case c = MakeCase();
  const at::Tensor dout = torch::randn({c.R(), c.Hq, c.D}, kF64);
  const Result plain = RunAttention(c, dout, [&](auto... t) { return PlainAttention(c, t...); });
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  // 1: one block per chunk; 200: a few blocks; 1 << 20: one chunk per sample.
  for (int64_t budget : {int64_t{1}, int64_t{200}, int64_t{1} << 20}) {
    SCOPED_TRACE(budget);
    ops::DFlashAttentionOptions o;
    o.chunk_scores = budget;
    const auto plan = ops::PlanDFlashAttention(c.blocks, c.Hq, at::kCPU, o);
    const Result fast = RunAttention(c, dout, [&](auto... t) { return ops::DFlashBlockAttention(t..., plan, scale); });
    EXPECT_LT(MaxDiff(fast.out, plain.out), 1e-13);
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_LT(MaxDiff(fast.grads[i], plain.grads[i]), 1e-12) << "input " << i;
      EXPECT_GT(plain.grads[i].abs().max().item<double>(), 0.0) << "input " << i << " gets no gradient";
    }
  }
}

TEST(DFlashBlockAttentionTest, ABlockReadsNoOtherSampleAndNoRowFromItsAnchorOn) {
  Case c = MakeCase();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const auto plan = ops::PlanDFlashAttention(c.blocks, c.Hq, at::kCPU);
  const at::Tensor before = ops::DFlashBlockAttention(c.q, c.k_ctx, c.v_ctx, c.k_blk, c.v_blk, plan, scale);
  // Context row 13 is block 5's anchor (not its context) and sample 1's:
  // changing it changes nothing anywhere.
  c.k_ctx[13] += 5.0;
  c.v_ctx[13] += 5.0;
  // Context row 8 is sample 0's last row, before no anchor of it.
  c.v_ctx[8] += 5.0;
  const at::Tensor after = ops::DFlashBlockAttention(c.q, c.k_ctx, c.v_ctx, c.k_blk, c.v_blk, plan, scale);
  EXPECT_EQ(MaxDiff(before, after), 0.0);
  // Row 12 is block 5's context only.
  c.v_ctx[12] += 5.0;
  const at::Tensor again = ops::DFlashBlockAttention(c.q, c.k_ctx, c.v_ctx, c.k_blk, c.v_blk, plan, scale);
  for (int64_t block = 0; block < c.blocks.num_blocks(); ++block) {
    const double d = MaxDiff(again.narrow(0, block * c.B, c.B), after.narrow(0, block * c.B, c.B));
    if (block == 5) {
      EXPECT_GT(d, 0.0);
    } else {
      EXPECT_EQ(d, 0.0) << "block " << block;
    }
  }
}

TEST(DFlashBlockAttentionTest, ABlockWithoutContextAttendsToItsOwnRowsAlone) {
  const Case c = MakeCase();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const auto plan = ops::PlanDFlashAttention(c.blocks, c.Hq, at::kCPU);
  const at::Tensor out = ops::DFlashBlockAttention(c.q, c.k_ctx, c.v_ctx, c.k_blk, c.v_blk, plan, scale);
  // Block 4 is anchored at sample 1's first row: plain attention over its
  // own three rows.
  const int64_t g = c.Hq / c.Hkv;
  const at::Tensor q = c.q.narrow(0, 4 * c.B, c.B).transpose(0, 1);
  const at::Tensor k = c.k_blk.narrow(0, 4 * c.B, c.B).repeat_interleave(g, 1).transpose(0, 1);
  const at::Tensor v = c.v_blk.narrow(0, 4 * c.B, c.B).repeat_interleave(g, 1).transpose(0, 1);
  const at::Tensor own = torch::matmul(torch::softmax(torch::matmul(q, k.transpose(1, 2)) * scale, -1), v);
  EXPECT_LT(MaxDiff(out.narrow(0, 4 * c.B, c.B), own.transpose(0, 1)), 1e-14);
  EXPECT_FALSE(out.isnan().any().item<bool>());
}

TEST(DFlashBlockAttentionTest, AMismatchedPlanIsRefusedNamingTheShapes) {
  const Case c = MakeCase();
  const auto plan = ops::PlanDFlashAttention(c.blocks, /*num_heads=*/8, at::kCPU);
  try {
    ops::DFlashBlockAttention(c.q, c.k_ctx, c.v_ctx, c.k_blk, c.v_blk, plan, 1.0);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("the plan is for 8 blocks of 3 rows and 8 heads"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace
}  // namespace e3
