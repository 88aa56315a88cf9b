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
//   rounds once more: at most 2 ulps of the output. (Measured: bf16
//   never differs; fp16 differs in 0.0007% of elements.)
// - Varlen flash attention against the per-sample SDPA loop: both are
//   bf16 attention with fp32 accumulation in different orders. Bound: the
//   flash output is no further from an fp32 reference than 1.5x the SDPA
//   output's distance from it, plus 2^-9.
// - The row argmax: exact (at::argmax's answer, ties and NaNs included).
// - The argmax fused into the lm_head GEMM (Hopper, bf16): at::argmax of
//   the bf16 logits its own fp32 sums round to. Against cuBLAS's logits a
//   row can differ only where two columns' logits lie within one rounding
//   plus the reordering bound below (a different K order); ties between
//   exactly equal sums and NaNs follow at::argmax.
// - The argmax through the FP8 candidate search: the same bound (the exact
//   argmax is among the 8 FP8-nominated columns, rescored in bf16 with an
//   fp32 sum in another order than cuBLAS's).
// - cuBLASLt GEMMs: the fp32-accumulated product (plus bias, plus the
//   residual when it is in the epilogue) rounded once to the dtype. Against
//   an fp32 reference: one rounding (half an ulp of the result, at most one
//   ulp of the reference) plus what summing in another fp32 order can move,
//   at most K 2^-24 sum|x w| (the classic bound; measured ones sit far below).
// - The whole sgl model against hf on a uniform batch (cuDNN attention on
//   views of the fused QKV product) and a ragged one (varlen flash), bf16:
//   the bench's bound (backend_consistency_bench): |sgl - hf| <= 2g, where
//   g is hf-bf16's max gap to hf-fp32, and sgl's RMS error against fp32
//   within 1.1x hf's (1.5x for MoE, whose router flips are rare events).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_runtime.h"
#include "common/model/model_dir.h"
#include "common/torch/gemm.h"
#include "common/torch/torch_compat.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/fp8_head_argmax.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/moe.h"
#include "teacher_server/layers/rms_norm.h"
#include "teacher_server/layers/rotary.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/models/forward_graphs.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/random_experts.h"
#include "tests/teacher_server/trimmed_vocab_model.h"

namespace e3 {
namespace {

using testing::RelInf;

// The compute capability of cuda:0, where these tests run (90 for Hopper).
int TestDeviceCapability() { return CudaComputeCapability(0); }

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
  // The rows every lm_head argmax test plants: w's column vocab - 3 equals
  // column 5 and row 0 prefers that pair (the first, 5, must win); row 1
  // is zero (all logits 0: index 0); row 2 holds a NaN (all NaN: index 0).
  // `pull` scales row 0 so that the pair clearly leads.
  static void PlantTiesAndNans(at::Tensor& x, at::Tensor& w, double pull) {
    w[w.size(0) - 3].copy_(w[5]);
    x[0].copy_(w[5] * pull);
    x[1].zero_();
    x[2][x.size(1) / 2] = std::numeric_limits<float>::quiet_NaN();
  }
  static void ExpectPlantedRows(const at::Tensor& got) {
    EXPECT_EQ(got[0].item<int>(), 5) << "tied columns: the first";
    EXPECT_EQ(got[1].item<int>(), 0) << "all logits 0: index 0";
    EXPECT_EQ(got[2].item<int>(), 0) << "all logits NaN: index 0";
  }
  // An lm_head argmax `got` against `want` (at::argmax of cuBLAS's logits
  // x w^T): at most max_differ rows differ, and in each the two columns'
  // exact logits lie within one bf16 rounding plus what summing in another
  // fp32 order can move (K 2^-24 sum|x w|, for each column).
  void ExpectArgmaxWithinRounding(const at::Tensor& got, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& want, int64_t max_differ) const {
    const int64_t K = x.size(1);
    const at::Tensor exact = at::linear(x.to(at::kFloat), w.to(at::kFloat));
    const at::Tensor reorder =
        at::linear(x.to(at::kFloat).abs(), w.to(at::kFloat).abs()) * (K * std::ldexp(1.0, -24));
    const at::Tensor differ = got.ne(want).nonzero().flatten();
    EXPECT_LE(differ.numel(), max_differ) << "rows differing from at::argmax of cuBLAS's logits";
    for (int64_t i = 0; i < differ.numel(); ++i) {
      const int64_t r = differ[i].item<int64_t>();
      const int64_t a = got[r].item<int>(), b = want[r].item<int>();
      const double gap = std::fabs(exact[r][a].item<double>() - exact[r][b].item<double>());
      const double allowed = TwoUlps(exact[r][a]).item<double>() + reorder[r][a].item<double>() +
                             reorder[r][b].item<double>();
      EXPECT_LE(gap, allowed) << "row " << r << ": columns " << a << " and " << b;
    }
  }
};

TEST_P(SglKernelsGpuTest, AddRmsNormMatchesTheReference) {
  torch::manual_seed(3);
  // Up to 4 packs of 8 per thread in at least 32 threads: at most one
  // pack per thread up to H = 256, 2 at 512, 4 per thread from H = 1024
  // (32 threads) to 32768 (1024 threads); 32776 (too wide) and 12 (not a
  // multiple of 8) take the reference path.
  for (int64_t H : {64, 256, 512, 2048, 4096, 8192, 16384, 32768, 32776, 12}) {
    const bool kernel = H % 8 == 0 && H <= 32768;
    const at::Tensor w = (torch::randn({H}, opts()) * 0.5 + 1.0).clamp(-1.9, 1.9);
    const at::Tensor h0 = torch::randn({37, H}, opts()) * 4;
    const at::Tensor h0_copy = h0.clone();
    const at::Tensor delta = torch::randn({37, H}, opts());
    const at::Tensor ref_sum = h0 + delta;
    const at::Tensor ref = RmsNorm(ref_sum, w, 1e-5);
    at::Tensor h = h0;
    const int64_t before = FusedKernelLaunches();
    const at::Tensor y = AddRmsNorm(&h, delta, w, 1e-5, /*fused=*/true);
    EXPECT_EQ(FusedKernelLaunches() - before, kernel ? 1 : 0) << "H=" << H;
    EXPECT_TRUE(h.equal(ref_sum)) << "H=" << H;
    // The sum is a new tensor: the old stream (e.g. a captured aux state) keeps its values.
    EXPECT_NE(h.data_ptr(), h0.data_ptr());
    EXPECT_TRUE(h0.equal(h0_copy)) << "H=" << H << ": the old stream was written";
    const at::Tensor err = (y.to(at::kFloat) - ref.to(at::kFloat)).abs();
    EXPECT_TRUE(err.le(TwoUlps(ref)).all().item<bool>()) << "H=" << H << " max err " << err.max().item<float>();
    const double differ = err.gt(0).to(at::kFloat).mean().item<double>();
    std::printf("H=%ld %s: norm outputs differing at all: %.4f%%\n", static_cast<long>(H),
                c10::toString(GetParam()), 100 * differ);
    // No delta: the norm alone, h untouched.
    at::Tensor h2 = h0;
    const at::Tensor y2 = AddRmsNorm(&h2, at::Tensor(), w, 1e-5, true);
    EXPECT_EQ(h2.data_ptr(), h0.data_ptr());
    EXPECT_TRUE(h0.equal(h0_copy));
    const at::Tensor ref2 = RmsNorm(h0, w, 1e-5);
    EXPECT_TRUE((y2.to(at::kFloat) - ref2.to(at::kFloat)).abs().le(TwoUlps(ref2)).all().item<bool>());
  }
}

// The SiLU-mul kernel's two forms: SiLU looked up in a table of every
// gate's stored SiLU, and computed. Restores the table on leaving.
struct SiluTableSwitch {
  explicit SiluTableSwitch(bool on) { SetSiluMulByTable(on); }
  ~SiluTableSwitch() { SetSiluMulByTable(true); }
};

// Whether cuda:0 can hold the 128 KiB table in one block's shared memory.
bool DeviceHoldsSiluTable() { return CudaSharedMemoryPerBlockOptin(0) >= 128 * 1024; }

TEST_P(SglKernelsGpuTest, SiluMulIsExact) {
  for (const bool table : {true, false}) {
    const SiluTableSwitch form(table);
    torch::manual_seed(4);
    for (int64_t I : {128, 8192, 14336}) {
      const at::Tensor gate_up = torch::randn({53, 2 * I}, opts()) * 3;
      const at::Tensor ref = at::silu(gate_up.narrow(1, 0, I)) * gate_up.narrow(1, I, I);
      const int64_t before = FusedKernelLaunches();
      const at::Tensor y = SiluMul(gate_up, /*fused=*/true);
      EXPECT_EQ(FusedKernelLaunches() - before, 1);
      EXPECT_TRUE(y.equal(ref)) << (table ? "table" : "arithmetic") << " I=" << I << " max err "
                                << (y.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<float>();
    }
    EXPECT_EQ(SiluMulByTable(at::Device(at::kCUDA, 0)), table && DeviceHoldsSiluTable());
    // A width the vector kernel does not take falls back to the reference.
    const at::Tensor odd = torch::randn({5, 2 * 12}, opts());
    EXPECT_TRUE(SiluMul(odd, true).equal(at::silu(odd.narrow(1, 0, 12)) * odd.narrow(1, 12, 12)));
  }
}

// Every one of the dtype's 65536 values as a gate, through both forms of
// the kernel: the table (built once per device with the exact formula)
// and the arithmetic, which for bf16 divides with __fdividef and falls
// back to the IEEE division near rounding midpoints and outside
// (1e-30, 80) (kernels/silu_mul.cu, SiluStored). With up = 1 the output
// is the stored SiLU itself, with random ups the product's rounding. NaN
// gates must give NaN (ATen's NaN payload may differ from the kernel's).
TEST_P(SglKernelsGpuTest, SiluMulIsExactForEveryGate) {
  torch::manual_seed(13);
  const int64_t rows = 256, I = 256;  // rows * I = 2^16 gates
  const at::Tensor gate = at::arange(int64_t{1} << 16, at::TensorOptions().dtype(at::kInt).device(at::kCUDA))
                              .to(at::kShort)
                              .view(GetParam())
                              .view({rows, I});
  for (const bool table : {true, false}) {
    const SiluTableSwitch form(table);
    for (const bool unit_up : {true, false}) {
      const std::string what = absl::StrCat(table ? "table" : "arithmetic", unit_up ? ", up = 1" : ", random up");
      const at::Tensor up = unit_up ? at::ones({rows, I}, opts()) : torch::randn({rows, I}, opts()) * 4;
      const at::Tensor gate_up = at::cat({gate, up}, 1);
      const at::Tensor ref = at::silu(gate) * up;
      const at::Tensor y = SiluMul(gate_up, /*fused=*/true);
      const at::Tensor ref_nan = ref.isnan(), y_nan = y.isnan();
      EXPECT_TRUE(y_nan.equal(ref_nan)) << what << ": NaNs in other places";
      const at::Tensor differ = (y != ref).logical_and(ref_nan.logical_not());
      EXPECT_EQ(differ.sum().item<int64_t>(), 0)
          << what << ": first differing gate "
          << (differ.any().item<bool>() ? gate.flatten().masked_select(differ.flatten())[0].item<float>() : 0.f);
    }
  }
}

// SiLU-mul and rope index with 32 bits only where every offset fits
// (kernels/silu_mul.cu, kernels/rope.cu); past 2^32 elements they take
// 64-bit indices, and stay exact. A wrong choice would wrap: the last
// rows' outputs would land on the first rows'. Skipped where the device
// lacks the ~12 GiB.
TEST_P(SglKernelsGpuTest, SiluMulAndRopeAreExactPastFourGigaElements) {
  torch::manual_seed(12);
  {
    const int64_t rows = 32768, I = 65536, chunk = 4096;  // gate_up: 2^32 elements
    at::Tensor gate_up, y;
    try {
      gate_up = at::empty({rows, 2 * I}, opts());
      y = at::empty({rows, I}, opts());
    } catch (const c10::Error&) {
      GTEST_SKIP() << "needs 12 GiB of free device memory";
    }
    y = at::Tensor();  // its block comes back to SiluMul from the caching allocator
    gate_up.normal_(0, 3);
    for (const bool table : {true, false}) {
      const SiluTableSwitch form(table);
      const int64_t before = FusedKernelLaunches();
      y = SiluMul(gate_up, /*fused=*/true);
      EXPECT_EQ(FusedKernelLaunches() - before, 1);
      for (int64_t r = 0; r < rows; r += chunk) {
        const at::Tensor g = gate_up.narrow(0, r, chunk);
        const at::Tensor ref = at::silu(g.narrow(1, 0, I)) * g.narrow(1, I, I);
        if (!y.narrow(0, r, chunk).equal(ref)) {
          ADD_FAILURE() << (table ? "table" : "arithmetic") << ": SiLU-mul differs in rows " << r << ".."
                        << r + chunk - 1;
          break;
        }
      }
      y = at::Tensor();
    }
  }
  // Rope on two heads per token in rows 2^20 elements apart: the last
  // token's heads lie past element 2^32 of the buffer.
  const int64_t T = 4097, row_stride = int64_t{1} << 20, D = 128;
  at::Tensor buffer;
  try {
    buffer = at::empty({T, row_stride}, opts());
  } catch (const c10::Error&) {
    GTEST_SKIP() << "needs 8 GiB of free device memory";
  }
  at::Tensor x = buffer.narrow(1, 0, 2 * D).view({T, 2, D});
  x.normal_();
  const at::Tensor original = x.clone();
  const at::Tensor angles = torch::randn({T, D}, opts().dtype(at::kFloat)) * 3;
  const at::Tensor cos = angles.cos().to(GetParam()), sin = angles.sin().to(GetParam());
  const int64_t before = FusedKernelLaunches();
  RopeInPlace(x, cos, sin, /*fused=*/true);
  EXPECT_EQ(FusedKernelLaunches() - before, 1);
  EXPECT_TRUE(x.equal(ApplyRotary(original, cos, sin)));
}

// The gather and SiLU-mul kernels with a device-side row limit (an EP
// rank's pairs): the rows below the limit are the reference's bit for bit,
// and the rows past it are left as they were. A limit past the rows means
// all of them, and 0 means none. Before each call the output blocks are
// poisoned with NaN (allocated, filled and freed, so that the caching
// allocator hands the same blocks back): rows the kernel skipped stay NaN,
// and rows it should have written cannot pass by holding an earlier
// call's values.
TEST_P(SglKernelsGpuTest, RowLimitedGatherAndSiluMulAreExactBelowTheLimit) {
  torch::manual_seed(9);
  const int64_t N = 97, P = 300, H = 256, I = 128;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor x = torch::randn({N, H}, opts());
  const at::Tensor index = torch::randint(N, {P}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  const at::Tensor gate_up = torch::randn({P, 2 * I}, opts()) * 3;
  const at::Tensor want_rows = x.index_select(0, index);
  const at::Tensor want_act = SiluMul(gate_up, /*fused=*/false);
  int poisoned_blocks_reused = 0;
  for (int32_t limit : {0, 1, 173, 300, 5000}) {
    const at::Tensor lim = torch::full({1}, limit, at::TensorOptions().dtype(at::kInt).device(at::kCUDA));
    const int64_t n = std::min<int64_t>(limit, P);
    const void *poisoned_rows = nullptr, *poisoned_act = nullptr;
    {
      const at::Tensor a = at::full(want_rows.sizes(), nan, opts()), b = at::full(want_act.sizes(), nan, opts());
      poisoned_rows = a.data_ptr();
      poisoned_act = b.data_ptr();
    }
    const int64_t before = FusedKernelLaunches();
    const at::Tensor rows = GatherRows(x, index, lim, /*fused=*/true);
    const at::Tensor act = SiluMul(gate_up, /*fused=*/true, lim);
    EXPECT_EQ(FusedKernelLaunches() - before, 2);
    ASSERT_EQ(rows.sizes(), want_rows.sizes());
    ASSERT_EQ(act.sizes(), want_act.sizes());
    EXPECT_TRUE(rows.narrow(0, 0, n).equal(want_rows.narrow(0, 0, n))) << "limit " << limit;
    EXPECT_TRUE(act.narrow(0, 0, n).equal(want_act.narrow(0, 0, n))) << "limit " << limit;
    if (rows.data_ptr() == poisoned_rows && act.data_ptr() == poisoned_act) {
      ++poisoned_blocks_reused;
      EXPECT_TRUE(rows.narrow(0, n, P - n).isnan().all().item<bool>()) << "limit " << limit << ": rows past it";
      EXPECT_TRUE(act.narrow(0, n, P - n).isnan().all().item<bool>()) << "limit " << limit << ": rows past it";
    }
  }
  EXPECT_GT(poisoned_blocks_reused, 0) << "the allocator never returned the poisoned blocks: nothing checked them";
  EXPECT_TRUE(GatherRows(x, index, at::Tensor(), true).equal(want_rows)) << "no limit: every row";
}

// The MoE combine kernel against its op sequence: exact, with and without
// the valid mask, a row of y holding NaNs that only masked slots point at.
TEST_P(SglKernelsGpuTest, MoeCombineIsExact) {
  torch::manual_seed(4);
  const int64_t T = 301, k = 8, H = 2048;
  at::Tensor y = torch::randn({T * k + 5, H}, opts());
  const at::Tensor rows = torch::randperm(T * k, at::TensorOptions().dtype(at::kLong).device(at::kCUDA)).view({T, k});
  const at::Tensor weights = torch::rand({T, k}, opts());
  at::Tensor valid = torch::rand({T, k}, at::TensorOptions().device(at::kCUDA)) > 0.3;
  y[T * k + 2].fill_(std::numeric_limits<float>::quiet_NaN());
  at::Tensor rows_with_nan = rows.clone();
  rows_with_nan[7][3] = T * k + 2;
  valid[7][3] = false;
  for (const at::Tensor& v : {at::Tensor(), valid}) {
    const at::Tensor& r = v.defined() ? rows_with_nan : rows;
    const int64_t launches = FusedKernelLaunches();
    const at::Tensor got = MoeCombine(y, r, weights, v, /*fused=*/true);
    EXPECT_EQ(FusedKernelLaunches(), launches + 1);
    const at::Tensor want = MoeCombine(y, r, weights, v, /*fused=*/false);
    EXPECT_TRUE(got.equal(want)) << (v.defined() ? "masked" : "all slots");
    EXPECT_FALSE(got.isnan().any().item<bool>());
  }
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
    // The forward's path: q's and k's heads as one view, one launch.
    at::Tensor together = original.clone();
    at::Tensor qk = together.narrow(1, 0, q_out + kv_out).view({T, heads + kv, D});
    RopeInPlace(qk, cos, sin, /*fused=*/true);
    EXPECT_TRUE(together.equal(qkv)) << "q and k in one launch, D=" << D << " rot=" << rot;
  }
}

// Qwen3's q/k norm and rope in one kernel, on views of a fused qkv
// product. Without rotation (rotary_dim 0) it is the norm: within two ulps
// of RmsNorm, as AddRmsNorm. With rotation it is exactly the rope kernel
// applied to that normalised output. v and the heads' other bytes stay.
TEST_P(SglKernelsGpuTest, HeadRmsNormRopeIsTheNormThenRope) {
  torch::manual_seed(6);
  const int64_t T = 37;
  // (heads, kv heads, head_dim, rotary_dim): Qwen3's 128, 64, the widest
  // (256, one warp per head), the narrowest (8: one lane), partial rotary.
  for (auto [heads, kv, D, rot] : std::vector<std::array<int64_t, 4>>{
           {32, 4, 128, 128}, {16, 8, 64, 64}, {4, 2, 256, 256}, {8, 2, 8, 0}, {4, 2, 128, 64}}) {
    const int64_t q_out = heads * D, kv_out = kv * D;
    const at::Tensor original = torch::randn({T, q_out + 2 * kv_out}, opts()) * 3;
    const at::Tensor w = (torch::randn({D}, opts()) * 0.5 + 1.0).clamp(-1.9, 1.9);
    const at::Tensor angles = torch::randn({T, rot}, opts().dtype(at::kFloat)) * 3;
    const at::Tensor cos = angles.cos().to(GetParam()), sin = angles.sin().to(GetParam());
    const at::Tensor no_rot = torch::empty({T, 0}, opts());
    auto q_of = [&](const at::Tensor& qkv) { return qkv.narrow(1, 0, q_out).view({T, heads, D}); };
    auto k_of = [&](const at::Tensor& qkv) { return qkv.narrow(1, q_out, kv_out).view({T, kv, D}); };
    const std::string what = absl::StrCat("D=", D, " rot=", rot);

    // The norm alone.
    at::Tensor normed_qkv = original.clone();
    const int64_t before = FusedKernelLaunches();
    const at::Tensor nq = HeadRmsNormRope(q_of(normed_qkv), w, 1e-6, no_rot, no_rot, /*fused=*/true);
    const at::Tensor nk = HeadRmsNormRope(k_of(normed_qkv), w, 1e-6, no_rot, no_rot, /*fused=*/true);
    EXPECT_EQ(FusedKernelLaunches() - before, 2) << what;
    EXPECT_EQ(nq.data_ptr(), q_of(normed_qkv).data_ptr()) << "in place";
    const std::vector<std::pair<at::Tensor, at::Tensor>> norms{{nq, RmsNorm(q_of(original), w, 1e-6)},
                                                               {nk, RmsNorm(k_of(original), w, 1e-6)}};
    for (const auto& [got, ref] : norms) {
      EXPECT_TRUE((got.to(at::kFloat) - ref.to(at::kFloat)).abs().le(TwoUlps(ref)).all().item<bool>()) << what;
    }

    // Norm and rope: the rope kernel on the norm's output, bit for bit.
    at::Tensor qkv = original.clone();
    at::Tensor q = HeadRmsNormRope(q_of(qkv), w, 1e-6, cos, sin, true);
    at::Tensor k = HeadRmsNormRope(k_of(qkv), w, 1e-6, cos, sin, true);
    EXPECT_EQ(FusedKernelLaunches() - before, 4) << what;
    at::Tensor want_q = nq.clone(), want_k = nk.clone();
    if (rot > 0) {
      RopeInPlace(want_q, cos, sin, true);
      RopeInPlace(want_k, cos, sin, true);
    }
    EXPECT_TRUE(q.equal(want_q)) << what;
    EXPECT_TRUE(k.equal(want_k)) << what;
    EXPECT_TRUE(qkv.narrow(1, q_out + kv_out, kv_out).equal(original.narrow(1, q_out + kv_out, kv_out)))
        << "v must stay";
  }
  // A head the kernel does not take (40 features: 5 packs) gets the
  // reference ops, a new tensor.
  const at::Tensor x = torch::randn({T, 4, 40}, opts());
  const at::Tensor w = torch::randn({40}, opts());
  const at::Tensor angles = torch::randn({T, 40}, opts().dtype(at::kFloat));
  const at::Tensor cos = angles.cos().to(GetParam()), sin = angles.sin().to(GetParam());
  at::Tensor want = RmsNorm(x, w, 1e-6);
  RopeInPlace(want, cos, sin, false);
  const at::Tensor got = HeadRmsNormRope(x, w, 1e-6, cos, sin, true);
  EXPECT_TRUE(got.equal(want));
  EXPECT_NE(got.data_ptr(), x.data_ptr()) << "the reference ops return a new tensor";
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
    EXPECT_TRUE(CudnnAttentionUsable()) << "cuDNN's batched kernel failed (see stderr)";
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

TEST_P(SglKernelsGpuTest, RowArgmaxIsExact) {
  torch::manual_seed(9);
  // The lm_head's width (a 128k vocab), a row width the vectorised path
  // cannot take (scalar path) and a narrow one; each also as rows of a
  // wider tensor (a strided view).
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{37, 128256}, {5, 1001}, {300, 64}}) {
    at::Tensor logits = torch::randn({rows, cols}, opts());
    logits[0].fill_(0.25);  // all tied: index 0
    logits[1][cols - 1] = 100;
    logits[1][cols / 2] = 100;  // tie: the first
    logits[2][cols / 3] = std::numeric_limits<float>::quiet_NaN();
    logits[2][cols / 4] = std::numeric_limits<float>::quiet_NaN();  // the first NaN wins
    logits[3].fill_(-std::numeric_limits<float>::infinity());
    const int64_t before = FusedKernelLaunches();
    const at::Tensor got = RowArgmax(logits, /*fused=*/true);
    EXPECT_EQ(FusedKernelLaunches(), before + 1) << "the kernel, not the fallback, must run";
    EXPECT_TRUE(got.equal(logits.argmax(-1).to(at::kInt))) << rows << "x" << cols;
    EXPECT_EQ(got[2].item<int>(), cols / 4);
    const at::Tensor wide = torch::randn({rows, cols + 8}, opts());
    const at::Tensor view = wide.narrow(1, 0, cols);
    const int64_t before_view = FusedKernelLaunches();
    EXPECT_TRUE(RowArgmax(view, true).equal(view.argmax(-1).to(at::kInt))) << "strided rows";
    EXPECT_EQ(FusedKernelLaunches(), before_view + 1) << "strided rows: the kernel must run";
  }
}

TEST_P(SglKernelsGpuTest, LinearArgmaxIsTheArgmaxOfTheLogits) {
  torch::manual_seed(11);
  const bool hopper = TestDeviceCapability() / 10 == 9;
  if (GetParam() != at::kBFloat16) {
    EXPECT_FALSE(LinearArgmax(torch::randn({8, 64}, opts()), torch::randn({64, 64}, opts())).defined())
        << "bf16 only";
    return;
  }
  if (!hopper) GTEST_SKIP() << "the fused lm_head argmax is a Hopper (sm_90) kernel";
  // A 128k vocab; a vocab and K that are not whole tiles; rows that leave
  // the last cluster's second CTA without rows (777 = 6 tiles of 128 + 9).
  for (const auto& [rows, vocab, K] : std::vector<std::array<int64_t, 3>>{{300, 128256, 512}, {777, 50000, 264}}) {
    at::Tensor x = torch::randn({rows, K}, opts());
    at::Tensor w = torch::randn({vocab, K}, opts()) * 0.1;
    PlantTiesAndNans(x, w, 10);
    const at::Tensor logits = at::linear(x, w);
    const at::Tensor want = logits.argmax(-1).to(at::kInt);
    const int64_t before = FusedKernelLaunches();
    const at::Tensor got = LinearArgmax(x, w);
    ASSERT_TRUE(got.defined()) << "the kernel must take a contiguous bf16 lm_head on Hopper";
    EXPECT_EQ(FusedKernelLaunches(), before + 1);
    ExpectPlantedRows(got);
    ExpectArgmaxWithinRounding(got, x, w, want, rows / 100);
  }
  // On a second GPU (the occupancy query and shared-memory opt-in are per
  // device; a teacher on cuda:1 must not depend on cuda:0's).
  if (torch::cuda::device_count() >= 2) {
    const at::TensorOptions second = opts().device(at::Device(at::kCUDA, 1));
    const at::Tensor x1 = torch::randn({300, 512}, second);
    const at::Tensor w1 = torch::randn({4096, 512}, second) * 0.1;
    const at::Tensor got1 = LinearArgmax(x1, w1);
    ASSERT_TRUE(got1.defined()) << "the kernel must run on cuda:1 too";
    EXPECT_EQ(got1.device(), x1.device());
    EXPECT_GE(got1.eq(at::linear(x1, w1).argmax(-1).to(at::kInt)).to(at::kDouble).mean().item<double>(), 0.99);
  }
  // What the kernel does not take: a strided x (row stride not a multiple
  // of 8 elements), K not a multiple of 8, fp32.
  const at::Tensor w = torch::randn({1024, 64}, opts());
  const int64_t before = FusedKernelLaunches();
  EXPECT_FALSE(LinearArgmax(torch::randn({8, 67}, opts()).narrow(1, 0, 64), w).defined());
  EXPECT_FALSE(LinearArgmax(torch::randn({8, 60}, opts()), torch::randn({1024, 60}, opts())).defined());
  EXPECT_FALSE(LinearArgmax(torch::randn({8, 64}, opts()).to(at::kFloat), w.to(at::kFloat)).defined());
  EXPECT_EQ(FusedKernelLaunches(), before);
}

TEST_P(SglKernelsGpuTest, Fp8HeadArgmaxIsTheExactArgmaxOfItsCandidates) {
  torch::manual_seed(12);
  const bool fp8 = TestDeviceCapability() >= 89;
  if (GetParam() != at::kBFloat16) {
    EXPECT_EQ(Fp8HeadArgmax::Prepare(torch::randn({64, 64}, opts())), nullptr) << "bf16 only";
    return;
  }
  if (!fp8) GTEST_SKIP() << "FP8 tensor cores: compute capability 8.9 or newer";
  // Heads as a model's: hidden rows ~ N(0, 1) (a normed hidden state) and
  // weights ~ N(0, 0.02) (HF's init), random, so the logits are as flat as
  // a head makes them. A 128k vocab over two score chunks (4096 rows
  // each), and a smaller one.
  for (const auto& [rows, vocab, K] : std::vector<std::array<int64_t, 3>>{{4200, 128256, 512}, {777, 50000, 256}}) {
    at::Tensor x = torch::randn({rows, K}, opts());
    at::Tensor w = torch::randn({vocab, K}, opts()) * 0.02;
    PlantTiesAndNans(x, w, 200);
    x[3][K / 3] = std::numeric_limits<float>::infinity();   // +inf where w[c][K/3] > 0: the first such c
    x[rows - 1].copy_(w[vocab - 1] * 200);   // the last column
    const auto head = Fp8HeadArgmax::Prepare(w);
    ASSERT_NE(head, nullptr) << "a contiguous bf16 head with V, H multiples of 16 must be taken";
    const at::Tensor logits = at::linear(x, w);
    const at::Tensor want = logits.argmax(-1).to(at::kInt);
    const int64_t calls = Fp8HeadArgmaxCalls();
    const at::Tensor got = head->Argmax(x);
    ASSERT_TRUE(got.defined());
    EXPECT_EQ(Fp8HeadArgmaxCalls(), calls + 1);
    ExpectPlantedRows(got);
    EXPECT_EQ(got[3].item<int>(), want[3].item<int>()) << "the first column with an infinite logit";
    EXPECT_EQ(got[rows - 1].item<int>(), vocab - 1);
    // A row differs from cuBLAS's argmax only at a near-tie (another K
    // order), never because the exact argmax was not nominated.
    ExpectArgmaxWithinRounding(got, x, w, want, rows / 100);
    // The winner's logit, as a vocab-parallel rank sends it to its peers:
    // cuBLAS's logit at that column up to its other summation order (one
    // bf16 rounding step), the same infinities and NaNs.
    at::Tensor best;
    EXPECT_TRUE(head->Argmax(x, &best).equal(got)) << "asking for the logit changes no answer";
    ASSERT_TRUE(best.defined());
    ASSERT_EQ(best.scalar_type(), at::kFloat);
    const at::Tensor there = logits.gather(-1, got.to(at::kLong).unsqueeze(-1)).squeeze(-1).to(at::kFloat);
    const at::Tensor finite = best.isfinite().logical_and(there.isfinite());
    EXPECT_TRUE(at::allclose(best.masked_select(finite), there.masked_select(finite), 1.0 / 128, 1e-6));
    EXPECT_TRUE(best.isnan().equal(there.isnan()));
    EXPECT_TRUE(best.isinf().equal(there.isinf()));
    EXPECT_TRUE(best.masked_select(best.isinf()).equal(there.masked_select(best.isinf())));
    // Rows from a strided view (the aux/last hidden of a wider tensor).
    const at::Tensor wide = torch::randn({64, K + 8}, opts());
    const at::Tensor view = wide.narrow(1, 0, K);
    const at::Tensor got_view = head->Argmax(view);
    ASSERT_TRUE(got_view.defined()) << "a row stride that is a multiple of 8 is taken";
    ExpectArgmaxWithinRounding(got_view, view, w, at::linear(view, w).argmax(-1).to(at::kInt), 1);
  }
  // What it does not take: a head with NaN (the exact path keeps
  // at::argmax's NaN order), V or H not a multiple of 16, fp16; rows with
  // a stride that is not a multiple of 8.
  at::Tensor nan_head = torch::randn({1024, 64}, opts());
  nan_head[7][3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Fp8HeadArgmax::Prepare(nan_head), nullptr);
  EXPECT_EQ(Fp8HeadArgmax::Prepare(torch::randn({1000, 64}, opts())), nullptr);
  EXPECT_EQ(Fp8HeadArgmax::Prepare(torch::randn({1024, 72}, opts())), nullptr);
  EXPECT_EQ(Fp8HeadArgmax::Prepare(torch::randn({1024, 64}, opts().dtype(at::kHalf))), nullptr);
  const auto head = Fp8HeadArgmax::Prepare(torch::randn({1024, 64}, opts()));
  ASSERT_NE(head, nullptr);
  EXPECT_FALSE(head->Argmax(torch::randn({8, 67}, opts()).narrow(1, 0, 64)).defined());
}

TEST_P(SglKernelsGpuTest, LtGemmIsOneRoundingOfTheFp32Product) {
  torch::manual_seed(10);
  const int64_t K = 512;
  const at::Tensor w = torch::randn({1024, K}, opts()) * 0.05;
  const at::Tensor b = torch::randn({1024}, opts());
  for (int64_t rows : {300, 257, 64}) {
    const at::Tensor x = torch::randn({rows, K}, opts());
    const at::Tensor r = torch::randn({rows, 1024}, opts()) * 4;
    const at::Tensor r_copy = r.clone();
    const at::Tensor exact = at::linear(x.to(at::kFloat), w.to(at::kFloat));
    // fp32 sums in another order differ by at most K * 2^-24 * sum |x w|.
    const at::Tensor reorder = at::linear(x.to(at::kFloat).abs(), w.to(at::kFloat).abs()) * (K * std::ldexp(1.0, -24));
    const int64_t calls = LtGemmCalls();
    const at::Tensor y = Gemm(x, w, at::Tensor(), at::Tensor(), GemmPath::kCublasLt);
    const at::Tensor yb = Gemm(x, w, b, at::Tensor(), GemmPath::kCublasLt);
    const at::Tensor yr = Gemm(x, w, b, r, GemmPath::kCublasLt);
    // A 3-D input and a residual without bias (the o_proj / down_proj form).
    const at::Tensor y3 = Gemm(x.view({1, rows, K}), w, at::Tensor(), r.view({1, rows, 1024}), GemmPath::kCublasLt);
    EXPECT_EQ(LtGemmCalls(), calls + 4) << "cuBLASLt, not the fallback, must run";
    EXPECT_EQ(y3.sizes(), (std::vector<int64_t>{1, rows, 1024}));
    auto excess = [&](const at::Tensor& got, const at::Tensor& want) {
      return (got.to(at::kFloat) - want).abs().sub(TwoUlps(want) / 2 + reorder).max().item<float>();
    };
    EXPECT_LE(excess(y, exact), 0.f) << rows;
    EXPECT_LE(excess(yb, exact + b.to(at::kFloat)), 0.f) << rows;
    EXPECT_LE(excess(yr, exact + b.to(at::kFloat) + r.to(at::kFloat)), 0.f) << rows;
    EXPECT_LE(excess(y3.view({rows, 1024}), exact + r.to(at::kFloat)), 0.f) << rows;
    EXPECT_TRUE(r.equal(r_copy)) << "the residual is read, never written";
  }
  // What cuBLASLt does not take falls back to at::linear: fp32, a strided
  // x, a pointer aligned to less than 16 bytes.
  const at::Tensor x32 = torch::randn({8, K}, opts().dtype(at::kFloat));
  const int64_t calls = LtGemmCalls();
  EXPECT_TRUE(Gemm(x32, w.to(at::kFloat), at::Tensor(), at::Tensor(), GemmPath::kCublasLt)
                  .equal(at::linear(x32, w.to(at::kFloat))));
  const at::Tensor strided = torch::randn({8, 2 * K}, opts()).narrow(1, 0, K);
  EXPECT_TRUE(Gemm(strided, w, at::Tensor(), at::Tensor(), GemmPath::kCublasLt).equal(at::linear(strided, w)));
  const at::Tensor offset = torch::randn({8 * K + 1}, opts()).narrow(0, 1, 8 * K).view({8, K});  // 2-byte aligned
  EXPECT_TRUE(Gemm(offset, w, at::Tensor(), at::Tensor(), GemmPath::kCublasLt).equal(at::linear(offset, w)));
  EXPECT_EQ(LtGemmCalls(), calls);
}

class SglModelGpuTest : public ::testing::TestWithParam<std::string> {};

// The fixtures whose layers route tokens to experts.
bool IsMoeCase(const std::string& name) {
  return name.find("moe") != std::string::npos || name.find("deepseek") != std::string::npos ||
         name.find("gpt_oss") != std::string::npos;
}

TEST_P(SglModelGpuTest, UniformAndRaggedBatchesMatchHf) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  auto dir = ModelDir::Open(testing::LoadGoldenCase(GetParam()).model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::unique_ptr<CausalLM> models[3];  // hf fp32 (the truth), hf bf16, sgl bf16
  const std::pair<const char*, at::ScalarType> kinds[3] = {
      {"hf", at::kFloat}, {"hf", at::kBFloat16}, {"sgl", at::kBFloat16}};
  for (int i = 0; i < 3; ++i) {
    ModelOptions o;
    o.device = at::Device("cuda:0");
    o.dtype = kinds[i].second;
    ASSERT_TRUE(SetBackend(kinds[i].first, &o).ok());
    auto m = LoadCausalLM(**dir, o);
    ASSERT_TRUE(m.ok()) << m.status();
    models[i] = std::move(m).value();
  }
  CausalLM* ref = models[0].get();
  CausalLM* hf = models[1].get();
  CausalLM* sgl = models[2].get();
  // MoE in bf16: rounding flips the router's choice for near-tied tokens,
  // rare discrete events whose count fluctuates between two runs, so the
  // RMS bound is looser there (1.5x; dense models 1.1x).
  const bool moe = IsMoeCase(GetParam());
  const int64_t vocab = (*dir)->config().vocab_size;
  torch::manual_seed(7);
  for (const std::vector<int64_t>& lengths :
       {std::vector<int64_t>{256, 256, 256, 256}, std::vector<int64_t>{100, 512, 88}}) {
    std::vector<std::vector<int32_t>> samples;
    for (int64_t n : lengths) {
      at::Tensor ids = torch::randint(vocab, {n}, at::kInt);
      samples.emplace_back(ids.data_ptr<int32_t>(), ids.data_ptr<int32_t>() + n);
    }
    auto batch = PackSamples(samples, vocab, at::Device("cuda:0"));
    ASSERT_TRUE(batch.ok()) << batch.status();
    ForwardOptions fwd;
    fwd.aux_layer_ids = (*dir)->config().DefaultAuxLayerIds();
    const int64_t launches = FusedKernelLaunches(), fp8_calls = Fp8HeadArgmaxCalls();
    auto r = ref->Forward(*batch, fwd);
    auto h = hf->Forward(*batch, fwd);
    auto s = sgl->Forward(*batch, fwd);
    ASSERT_TRUE(r.ok() && h.ok() && s.ok());
    EXPECT_GT(FusedKernelLaunches(), launches);
    if (TestDeviceCapability() >= 89 && GetParam() == "tiny_code_llama") {
      EXPECT_EQ(Fp8HeadArgmaxCalls(), fp8_calls + 1) << "sgl's argmax through the FP8 candidate search";
    }
    const bool uniform = lengths.size() == 4;
    EXPECT_TRUE(CudnnAttentionUsable()) << "cuDNN's batched kernel failed on views of the fused QKV product";
    for (auto pick : {&ForwardOutput::aux_hidden, &ForwardOutput::last_hidden}) {
      const at::Tensor truth = ((*r).*pick).cpu().to(at::kDouble);
      const at::Tensor ht = ((*h).*pick).cpu().to(at::kDouble), st = ((*s).*pick).cpu().to(at::kDouble);
      const double g = RelInf(ht, truth), d = RelInf(st, ht);
      const double rms_hf = (ht - truth).pow(2).mean().sqrt().item<double>();
      const double rms_sgl = (st - truth).pow(2).mean().sqrt().item<double>();
      std::printf("[%s] %s %s: |sgl-hf| %.3g (g %.3g), RMS err sgl %.3g hf %.3g\n", GetParam().c_str(),
                  uniform ? "uniform" : "ragged", pick == &ForwardOutput::aux_hidden ? "aux" : "last", d, g, rms_sgl,
                  rms_hf);
      EXPECT_LE(d, 2 * g);
      EXPECT_LE(rms_sgl, (moe ? 1.5 : 1.1) * rms_hf);
    }
    // sgl's target argmax (FP8-nominated candidates rescored exactly, or
    // on Hopper fused into the lm_head GEMM) is the argmax of its own last
    // hidden state's logits; rows may differ only at near-ties (another K
    // order; Fp8HeadArgmaxIsTheExactArgmaxOfItsCandidates).
    const at::Tensor head = sgl->lm_head().to(s->last_hidden.device(), s->last_hidden.scalar_type());
    const at::Tensor want = at::linear(s->last_hidden, head).argmax(-1).to(at::kInt);
    const double agree = s->target_argmax.eq(want).to(at::kDouble).mean().item<double>();
    EXPECT_GE(agree, 0.99) << "sgl target argmax against the argmax of its logits";
  }
}

// The forward replayed from a CUDA graph is the eager forward, bit for bit:
// on a uniform batch (cuDNN attention) the very same computation; on a
// ragged one the eager forward of the padded batch the graph runs, cut to
// the batch's tokens (padding is a sample of its own and GEMM rows are
// independent). A budget runs eagerly at its first two sightings (the
// second timed: with graph_min_host_share 0 every budget passes), is
// captured at its third and replayed with new token ids after that; the
// lengths of the last ragged batch differ but share the budget. A model
// whose bar no forward can pass (share > 1) never captures, nor do
// forwards that ask for logits. MoE models are captured where the grouped
// GEMM runs their experts (bf16 on Hopper or Blackwell, LibTorch 2.8+);
// elsewhere the routing counts go to the host and they run eagerly.
TEST_P(SglModelGpuTest, CudaGraphReplaysAreTheEagerForward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  auto dir = ModelDir::Open(testing::LoadGoldenCase(GetParam()).model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::unique_ptr<CausalLM> models[3];  // graphs always, graphs never (bar > 1), eager
  for (int i = 0; i < 3; ++i) {
    ModelOptions o;
    o.device = at::Device("cuda:0");
    o.dtype = at::kBFloat16;
    ASSERT_TRUE(SetBackend("sgl", &o).ok());
    o.graph_min_host_share = i == 0 ? 0.0 : 1.01;
    o.cuda_graphs = i < 2;
    auto m = LoadCausalLM(**dir, o);
    ASSERT_TRUE(m.ok()) << m.status();
    models[i] = std::move(m).value();
  }
  CausalLM* graphed = models[0].get();
  CausalLM* never = models[1].get();
  CausalLM* eager = models[2].get();
  EXPECT_NE(graphed->Techniques().find("one fused attention call per batch"), std::string::npos)
      << graphed->Techniques();
  EXPECT_EQ(graphed->Techniques().find("custom kernels off"), std::string::npos) << graphed->Techniques();
  const int cc = TestDeviceCapability();
  const bool moe = IsMoeCase(GetParam());
  const bool captures_moe = compat::kHasGroupedMm && (cc / 10 == 9 || cc / 10 == 10);
  const bool captured = !moe || captures_moe;
  const int64_t vocab = (*dir)->config().vocab_size;
  const int64_t step = graphed->options().graph_token_step;
  ForwardOptions fwd;
  fwd.aux_layer_ids = (*dir)->config().DefaultAuxLayerIds();
  const at::Device cuda("cuda:0");
  torch::manual_seed(11);
  const int64_t captures = CudaGraphCaptures(), replays = CudaGraphReplays();
  const std::vector<int64_t> uniform{256, 256, 256, 256}, ragged{100, 512, 88};
  const std::vector<std::vector<int64_t>> rounds[2] = {{uniform, uniform, uniform, uniform},
                                                       {ragged, ragged, ragged, {200, 412, 88}}};
  for (int round = 0; round < 4; ++round) {
    for (const auto& per_kind : rounds) {
      const std::vector<int64_t>& lengths = per_kind[round];
      std::vector<int64_t> cu{0};
      for (int64_t n : lengths) cu.push_back(cu.back() + n);
      const int64_t T = cu.back();
      auto batch = MakePackedBatch(torch::randint(vocab, {T}, at::kLong), cu, vocab, cuda);
      ASSERT_TRUE(batch.ok()) << batch.status();
      // The padded batch as the graph runs it (empty samples and all).
      const GraphBatchPlan plan = PlanGraphBatch(cu, step);
      PackedBatch padded;
      padded.cu_seqlens = plan.cu_seqlens;
      padded.input_ids = at::zeros({plan.tokens}, batch->input_ids.options());
      padded.input_ids.narrow(0, 0, T).copy_(batch->input_ids);
      padded.position_ids = at::zeros({plan.tokens}, batch->position_ids.options());
      padded.position_ids.narrow(0, 0, T).copy_(batch->position_ids);
      auto g = graphed->Forward(*batch, fwd);
      ASSERT_TRUE(never->Forward(*batch, fwd).ok());
      // Until the capture the graphed model runs the batch eagerly, unpadded.
      auto e = eager->Forward(round < 2 ? *batch : padded, fwd);
      ASSERT_TRUE(g.ok() && e.ok()) << g.status() << " " << e.status();
      const std::string what = absl::StrCat(plan.key, ", round ", round);
      EXPECT_TRUE(g->aux_hidden.equal(e->aux_hidden.narrow(0, 0, T))) << what;
      EXPECT_TRUE(g->last_hidden.equal(e->last_hidden.narrow(0, 0, T))) << what;
      EXPECT_TRUE(g->target_argmax.equal(e->target_argmax.narrow(0, 0, T))) << what;
    }
  }
  EXPECT_NE(graphed->Techniques().find(captured ? "CUDA graphs per token budget" : "CUDA graphs off"),
            std::string::npos)
      << graphed->Techniques();
  if (moe) {
    EXPECT_NE(graphed->Techniques().find(captures_moe ? "experts by grouped GEMMs" : "experts by a loop"),
              std::string::npos)
        << graphed->Techniques();
  }
  // Captured in round 2, replayed in rounds 2 and 3.
  EXPECT_EQ(CudaGraphCaptures() - captures, captured ? 2 : 0);
  EXPECT_EQ(CudaGraphReplays() - replays, captured ? 4 : 0);
  ForwardOptions with_logits = fwd;
  with_logits.return_logits = true;
  auto batch = MakePackedBatch(torch::randint(vocab, {1024}, at::kLong), {0, 256, 512, 768, 1024}, vocab, cuda);
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(graphed->Forward(*batch, with_logits).ok());
  EXPECT_EQ(CudaGraphReplays() - replays, captured ? 4 : 0) << "a forward with logits runs eagerly";
}

// GroupedMoe on a GPU against the per-expert loop (SparseMoe), all experts
// and EP subsets (whose other-rank rows of the grouped product are never
// written). bf16 on Hopper runs LibTorch's grouped GEMM, which sums in its
// own order: its error against an fp32 evaluation of the same weights is
// within 1.1x the loop's (RMS), and no unwritten row leaks in (no NaN).
// fp16 takes the per-group loop: the loop's sum bit for bit.
TEST(GroupedMoeGpuTest, MatchesThePerExpertLoop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  torch::manual_seed(8);
  const at::Device cuda("cuda:0");
  const int64_t H = 256, I = 128, T = 700, total = 16;
  const MoeRouting routing{4, true};
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 16}, {4, 6}}) {
      MoeWeights w = testing::RandomExperts(total, first, count, H, I, dtype, 1.0 / 16, cuda, /*fuse=*/false);
      // The fp32 evaluation of the same (rounded) weights, before fusing.
      MoeWeights f32 = w;
      f32.router = w.router.to(at::kFloat);
      for (MlpWeights& m : f32.experts) {
        m.gate_proj = m.gate_proj.to(at::kFloat);
        m.up_proj = m.up_proj.to(at::kFloat);
        m.down_proj = m.down_proj.to(at::kFloat);
      }
      for (MlpWeights& m : w.experts) FuseGateUp(&m);
      const at::Tensor x = torch::randn({T, H}).to(cuda, dtype);
      const at::Tensor loop = SparseMoe(x, w, routing, /*fused_activation=*/true);
      MoeWeights stacked = w;
      StackExperts(&stacked);
      const at::Tensor grouped = GroupedMoe(x, stacked, routing, /*fused_activation=*/true);
      const std::string what = absl::StrCat(c10::toString(dtype), " experts [", first, ", ", first + count, ")");
      EXPECT_FALSE(grouped.isnan().any().item<bool>()) << what;
      if (dtype == at::kHalf) {
        EXPECT_TRUE(grouped.equal(loop)) << what;
        continue;
      }
      const at::Tensor truth = SparseMoe(x.to(at::kFloat), f32, routing).to(at::kDouble);
      const double rms_grouped = (grouped.to(at::kDouble) - truth).pow(2).mean().sqrt().item<double>();
      const double rms_loop = (loop.to(at::kDouble) - truth).pow(2).mean().sqrt().item<double>();
      std::printf("%s: RMS error against fp32, grouped %.3g, loop %.3g\n", what.c_str(), rms_grouped, rms_loop);
      EXPECT_LE(rms_grouped, 1.1 * rms_loop) << what;
    }
  }
}

// A vocabulary that is not a multiple of 16 (tiny-code-llama cut to 8191
// rows, as models with an added pad token have 32001): the FP8 candidate
// search does not take the lm_head, and the argmax comes from the next path
// (the Hopper GEMM's epilogue, or the logits in chunks). It is still the
// argmax of sgl's own logits, over every column, and agrees with hf fp32's
// as often as hf bf16's does, within a point.
TEST(SglOddVocabGpuTest, ArgmaxWithoutTheFp8SearchIsTheArgmaxOfItsLogits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  const std::string model_dir = testing::TrimmedVocabModel(
      testing::LoadGoldenCase("tiny_code_llama").model_dir, 1, testing::ScratchDir("odd_vocab"));
  auto dir = ModelDir::Open(model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  const int64_t vocab = (*dir)->config().vocab_size;
  ASSERT_EQ(vocab % 16, 15);
  std::unique_ptr<CausalLM> models[3];  // sgl bf16, hf bf16, hf fp32 (the truth)
  for (int i = 0; i < 3; ++i) {
    ModelOptions o;
    o.device = at::Device("cuda:0");
    o.dtype = i < 2 ? at::kBFloat16 : at::kFloat;
    ASSERT_TRUE(SetBackend(i == 0 ? "sgl" : "hf", &o).ok());
    auto m = LoadCausalLM(**dir, o);
    ASSERT_TRUE(m.ok()) << m.status();
    models[i] = std::move(m).value();
  }
  torch::manual_seed(5);
  // The last id is the last column's: the embedding's trimmed edge is read.
  at::Tensor ids = torch::randint(vocab, {600}, at::kLong);
  ids[0] = vocab - 1;
  auto batch = MakePackedBatch(ids, {0, 100, 450, 600}, vocab, at::Device("cuda:0"));
  ASSERT_TRUE(batch.ok()) << batch.status();
  ForwardOptions fwd;
  fwd.aux_layer_ids = (*dir)->config().DefaultAuxLayerIds();
  const int64_t fp8_calls = Fp8HeadArgmaxCalls();
  auto s = models[0]->Forward(*batch, fwd);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Fp8HeadArgmaxCalls(), fp8_calls) << "an lm_head of 8191 rows is not the FP8 search's";
  ForwardOptions with_logits = fwd;
  with_logits.return_logits = true;
  auto l = models[0]->Forward(*batch, with_logits);
  auto h = models[1]->Forward(*batch, with_logits);
  auto t = models[2]->Forward(*batch, fwd);
  ASSERT_TRUE(l.ok() && h.ok() && t.ok()) << l.status() << " " << h.status() << " " << t.status();
  ASSERT_EQ(l->logits.size(1), vocab);
  EXPECT_TRUE(l->target_argmax.equal(l->logits.argmax(-1).to(at::kInt))) << "with logits: their argmax";
  EXPECT_TRUE(s->last_hidden.equal(l->last_hidden));
  auto agreement = [](const at::Tensor& a, const at::Tensor& b) {
    return a.eq(b).to(at::kDouble).mean().item<double>();
  };
  const double own = agreement(s->target_argmax, l->target_argmax);
  const double sgl_truth = agreement(s->target_argmax, t->target_argmax);
  const double hf_truth = agreement(h->target_argmax, t->target_argmax);
  std::printf("odd vocab: argmax alone vs its logits' %.4f; vs hf fp32: sgl %.4f, hf bf16 %.4f\n", own, sgl_truth,
              hf_truth);
  // The argmax alone may take another K order than the logits' GEMM (the
  // Hopper epilogue): near-ties may flip, as in UniformAndRaggedBatchesMatchHf.
  EXPECT_GE(own, 0.99);
  EXPECT_GE(sgl_truth, hf_truth - 0.01);
  EXPECT_LT(s->target_argmax.max().item<int>(), vocab);
}

// A budget whose graph finds no memory stays eager; the others keep
// their graphs. The forward here is a small stand-in computation on the
// GPU, and the out-of-memory error is the caching allocator's own: the
// forward of the "big" budget asks it for 4 TiB once graphs are being made.
TEST(ForwardGraphsGpuTest, AnOutOfMemoryCaptureLeavesThatBudgetEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  const at::Device cuda("cuda:0");
  ForwardGraphs graphs(cuda, /*token_step=*/128, /*max_graphs=*/8, /*min_host_share=*/0.0);
  int calls = 0;
  bool hog = false;  // set once both budgets are past their deciding run
  const int64_t big_tokens = 256;
  const ForwardGraphs::RunFn run = [&](const PackedBatch& b, const PackedLayout&, const ForwardOptions&) {
    ++calls;
    if (hog && b.num_tokens() == big_tokens) {
      (void)at::empty({int64_t{1} << 42}, at::TensorOptions().dtype(at::kByte).device(cuda));
    }
    ForwardOutput out;
    out.last_hidden = (b.input_ids.to(at::kFloat) * 2 + b.position_ids.to(at::kFloat)).unsqueeze(1);
    out.target_argmax = (b.input_ids + 1).to(at::kInt);
    return out;
  };
  auto make = [&](int64_t n) {
    auto b = MakePackedBatch(torch::randint(1000, {n}, at::kLong), {0, n / 2, n}, 1000, cuda);
    EXPECT_TRUE(b.ok()) << b.status();
    return *b;
  };
  const PackedBatch big = make(big_tokens), small = make(128);
  const ForwardOptions fwd;
  const int64_t captures = CudaGraphCaptures(), replays = CudaGraphReplays();
  for (const PackedBatch* b : {&big, &small}) {
    EXPECT_FALSE(graphs.Run(*b, fwd, run).has_value()) << "first sighting: the caller runs it";
    EXPECT_TRUE(graphs.Run(*b, fwd, run).has_value()) << "second sighting: the timed eager run";
  }
  hog = true;
  calls = 0;
  EXPECT_FALSE(graphs.Run(big, fwd, run).has_value()) << "no memory for the graph: the caller runs it eagerly";
  EXPECT_EQ(calls, 1) << "the capture's warm-up ran and failed";
  calls = 0;
  EXPECT_FALSE(graphs.Run(big, fwd, run).has_value());
  EXPECT_EQ(calls, 0) << "the budget stays eager without another try";
  // The other budget still gets its graph, and the replay is the forward.
  hog = false;
  auto g = graphs.Run(small, fwd, run);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(CudaGraphCaptures() - captures, 1);
  EXPECT_EQ(CudaGraphReplays() - replays, 1);
  const ForwardOutput want = run(small, PackedLayout(), fwd);
  EXPECT_TRUE(g->last_hidden.equal(want.last_hidden));
  EXPECT_TRUE(g->target_argmax.equal(want.target_argmax));
  // The stream the capture ran beside is usable afterwards.
  EXPECT_EQ(at::ones({4}, at::TensorOptions().device(cuda)).sum().item<float>(), 4.f);
}

// Llama (the bundled model), Qwen3 (q/k norm: contiguous q, strided k/v),
// Qwen3-MoE (fused SiLU-mul per expert), DeepSeek V3 and V2-Lite (MLA,
// DeepSeekMoE into grouped experts), GPT-OSS (sinks and windows through
// flash, clamped experts with biases grouped).
INSTANTIATE_TEST_SUITE_P(Models, SglModelGpuTest,
                         ::testing::Values("tiny_code_llama", "rand_qwen3", "rand_qwen3_moe", "rand_deepseek_v3",
                                           "rand_deepseek_v2_lite", "rand_gpt_oss"));

INSTANTIATE_TEST_SUITE_P(Dtypes, SglKernelsGpuTest, ::testing::Values(at::kBFloat16, at::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

}  // namespace
}  // namespace e3
