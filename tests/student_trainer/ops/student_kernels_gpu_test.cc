// The fast path's CUDA kernels against the ATen statements of the same
// math, on the same GPU and inputs (ops::SetStudentKernelsEnabled(false)
// runs the ATen path), forward and backward, then the whole fast step
// against the reference step in bf16.
//
// Tolerances: both paths compute in fp32 and store bf16, but round at
// different points (the kernels once per output, ATen after each op), so
// outputs differ by a few bf16 ulps: relative bound 2e-2 of each tensor's
// max |value| (bf16's ulp is 2^-8 = 3.9e-3 relative). fp32 outputs (row
// losses, norm weight gradients, the attention merge's log-sum-exp) differ
// by summation order only: 1e-3. Indices (argmax) are exact where the
// top-2 logits are apart by more than the rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "common/torch/gemm.h"
#include "common/torch/torch_compat.h"
#include "common/torch/torch_core.h"
#include "student_trainer/ops/draft_head_loss.h"
#include "student_trainer/ops/kernel_switch.h"
#include "student_trainer/ops/linear.h"
#include "student_trainer/ops/rms_norm.h"
#include "student_trainer/ops/rope_qkv.h"
#include "student_trainer/ops/silu_mul.h"
#include "student_trainer/ops/step_rows.h"
#include "student_trainer/ops/ttt_attention.h"
#include "student_trainer/step/step_plan.h"
#include "student_trainer/step/ttt_step.h"
#include "tests/rel_inf.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

using testing::RelInf;

class StudentKernelsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
    torch::manual_seed(5);
  }
  void TearDown() override { ops::SetStudentKernelsEnabled(true); }

  // Runs f with the kernels, then with the ATen path; checks the kernels ran.
  template <typename F>
  auto BothWays(F&& f) {
    ops::SetStudentKernelsEnabled(true);
    const int64_t before = ops::StudentKernelLaunches();
    auto fast = f();
    EXPECT_GT(ops::StudentKernelLaunches(), before) << "no kernel ran";
    ops::SetStudentKernelsEnabled(false);
    auto aten = f();
    ops::SetStudentKernelsEnabled(true);
    return std::make_pair(fast, aten);
  }

  at::TensorOptions bf16 = torch::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
};

TEST_F(StudentKernelsGpuTest, RmsNormForwardAndBackward) {
  for (int64_t cols : {256, 2048, 4096}) {
    SCOPED_TRACE(cols);
    // x is a column block of a wider tensor: rows are strided.
    const at::Tensor wide = torch::randn({333, cols + 64}, bf16) * 3;
    const at::Tensor x = wide.narrow(1, 64, cols);
    const at::Tensor w = (torch::rand({cols}, bf16) + 0.5);
    const at::Tensor dy = torch::randn({333, cols}, bf16);
    // The gradient of a residual path that also read x, summed into dx.
    const at::Tensor dres = torch::randn({333, cols}, bf16);
    auto [k, a] = BothWays([&] {
      ops::RmsNormResult r = ops::RmsNormForward(x, w, 1e-5);
      auto [dx, dw] = ops::RmsNormBackward(dy, x, r.rstd, w);
      auto [dx_res, dw_res] = ops::RmsNormBackward(dy, x, r.rstd, w, dres);
      return std::vector<at::Tensor>{r.y, r.rstd, dx, dw, dx_res, dw_res};
    });
    EXPECT_LE(RelInf(k[0], a[0]), 2e-2);
    EXPECT_LE(RelInf(k[1], a[1]), 1e-5);
    EXPECT_LE(RelInf(k[2], a[2]), 2e-2);
    EXPECT_LE(RelInf(k[3], a[3]), 1e-3);
    EXPECT_LE(RelInf(k[4], a[4]), 2e-2);
    EXPECT_TRUE(at::equal(k[5], k[3]));  // the residual leaves dw alone
    // The sum against the norm's dx plus the residual's gradient, in fp32.
    EXPECT_LE(RelInf(k[4], k[2].to(at::kFloat) + dres.to(at::kFloat)), 2e-2);
  }
}

TEST_F(StudentKernelsGpuTest, SiluMulForwardAndBackward) {
  const at::Tensor gate_up = torch::randn({517, 2 * 1408}, bf16) * 4;
  const at::Tensor dout = torch::randn({517, 1408}, bf16);
  auto [k, a] = BothWays([&] {
    return std::vector<at::Tensor>{ops::SiluMulForward(gate_up),
                                   ops::SiluMulBackward(dout, gate_up)};
  });
  EXPECT_LE(RelInf(k[0], a[0]), 2e-2);
  EXPECT_LE(RelInf(k[1], a[1]), 2e-2);
}

TEST_F(StudentKernelsGpuTest, RopeQkvForwardAndBackward) {
  for (double partial : {1.0, 0.5}) {
    SCOPED_TRACE(partial);
    const int64_t tokens = 301, q_heads = 8, kv_heads = 2, head_dim = 128;
    const int64_t rotary = static_cast<int64_t>(head_dim * partial);
    const at::Tensor pos =
        torch::arange(tokens, torch::TensorOptions().device(at::kCUDA)).to(at::kFloat);
    const at::Tensor inv =
        1.0 / at::pow(10000.0, torch::arange(0, rotary, 2, pos.options()) / rotary);
    const at::Tensor ang = at::cat({at::outer(pos, inv), at::outer(pos, inv)}, 1);
    const at::Tensor cos = ang.cos().to(at::kBFloat16), sin = ang.sin().to(at::kBFloat16);
    const at::Tensor qkv = torch::randn({tokens, (q_heads + 2 * kv_heads) * head_dim}, bf16);
    const auto f32 = torch::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    const at::Tensor dq = torch::randn({tokens, q_heads, head_dim}, f32);
    const at::Tensor dk = torch::randn({tokens, kv_heads, head_dim}, f32);
    const at::Tensor dv = torch::randn({tokens, kv_heads, head_dim}, f32);
    auto [k, a] = BothWays([&] {
      return std::vector<at::Tensor>{
          ops::RopeQkvForward(qkv, q_heads, kv_heads, head_dim, cos, sin),
          ops::RopeQkvBackward(dq, dk, dv, cos, sin, at::kBFloat16)};
    });
    EXPECT_LE(RelInf(k[0], a[0]), 2e-2);
    EXPECT_LE(RelInf(k[1], a[1]), 2e-2);
  }
}

// Vocabs: a small one, the draft vocab users train (32000) and a large one.
class SoftCrossEntropyVocabTest : public StudentKernelsGpuTest, public ::testing::WithParamInterface<int64_t> {};

TEST_P(SoftCrossEntropyVocabTest, RowsAndGradient) {
  const int64_t vocab = GetParam(), rows = vocab > 4000 ? 96 : 700, targets = vocab > 4000 ? 40 : 300;
  const auto f32 = torch::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  ops::TargetDistribution target;
  target.logits = torch::randn({targets, vocab}, f32) * 3;
  target.lse = at::logsumexp(target.logits, -1);
  target.top = target.logits.argmax(-1);
  const at::Tensor z = torch::randn({rows, vocab}, bf16) * 4;
  const at::Tensor target_rows = torch::randint(0, targets, {rows}, f32.dtype(at::kLong));
  const at::Tensor weight = (torch::rand({rows}, f32) > 0.3).to(at::kFloat);
  const at::Tensor scale = torch::full({rows}, 0.125, f32);
  auto [k, a] = BothWays([&] {
    at::Tensor logits = z.clone();
    ops::SoftCrossEntropyResult r = ops::SoftCrossEntropyInPlace(logits, target, target_rows, weight, scale);
    return std::vector<at::Tensor>{r.loss, r.argmax, logits};
  });
  EXPECT_LE(RelInf(k[0], a[0]), 1e-3);
  EXPECT_LE(RelInf(k[2], a[2]), 2e-2);
  // argmax: at::argmax over the same bf16 logits.
  EXPECT_TRUE(k[1].equal(a[1]));
  EXPECT_TRUE(k[1].equal(z.argmax(-1)));
}
INSTANTIATE_TEST_SUITE_P(Vocab, SoftCrossEntropyVocabTest, ::testing::Values(4000, 32000, 64000));

// Interleaved runs (the head's chunks of range steps: step j's row i reads
// target row i + j + 1, and each step has one row fewer than the one
// before; a chunk past a step's last row gives it an empty run) visit rows
// in another order only: every output equals the plain order's bit for
// bit, with and without the acceptance terms. Runs that do not cover the
// rows are refused.
TEST_F(StudentKernelsGpuTest, SoftCrossEntropyInterleavedRunsChangeNothing) {
  const int64_t steps = 8, first_rows = 7, vocab = 32000, targets = first_rows + steps;
  const auto f32 = torch::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  ops::TargetDistribution target;
  target.logits = torch::randn({targets, vocab}, f32) * 3;
  target.lse = at::logsumexp(target.logits, -1);
  target.top = target.logits.argmax(-1);
  target.log_mass = -torch::rand({targets}, f32);
  std::vector<int64_t> runs;
  std::vector<at::Tensor> run_targets;
  for (int64_t j = 0; j < steps; ++j) {
    runs.push_back(first_rows - j);  // 7 rows down to none
    run_targets.push_back(torch::arange(j + 1, j + 1 + runs.back(), f32.dtype(at::kLong)));
  }
  const at::Tensor target_rows = at::cat(run_targets);
  const int64_t rows = target_rows.size(0);
  const at::Tensor z = torch::randn({rows, vocab}, bf16) * 4;
  const at::Tensor weight = (torch::rand({rows}, f32) > 0.2).to(at::kFloat);
  const at::Tensor scale = torch::full({rows}, 0.125, f32);
  ops::AcceptanceRows terms;
  terms.grad_scale = torch::full({rows}, -0.5, f32);
  for (bool lk : {false, true}) {
    SCOPED_TRACE(lk ? "with the acceptance terms" : "soft CE");
    std::vector<std::vector<at::Tensor>> outs;
    for (bool interleaved : {false, true}) {
      at::Tensor logits = z.clone();
      ops::SoftCrossEntropyResult r = ops::SoftCrossEntropyInPlace(
          logits, target, target_rows, weight, scale, lk ? &terms : nullptr,
          interleaved ? runs : std::vector<int64_t>{});
      outs.push_back({r.loss, r.argmax, logits, lk ? r.alpha : r.loss});
    }
    for (size_t k = 0; k < outs[0].size(); ++k) EXPECT_TRUE(outs[0][k].equal(outs[1][k])) << "output " << k;
  }
  at::Tensor logits = z.clone();
  runs.back() += 1;
  EXPECT_THROW(ops::SoftCrossEntropyInPlace(logits, target, target_rows, weight, scale, nullptr, runs),
               c10::Error);
}

// The target distribution's log-sum-exp and argmax in one pass against
// ATen's: fp32 sums in another order (1e-6 relative), the same indices.
TEST_F(StudentKernelsGpuTest, TargetRowStatsMatchLogSumExpAndArgmax) {
  const auto f32 = torch::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  for (int64_t vocab : {4000, 32000}) {
    const at::Tensor logits = torch::randn({300, vocab}, f32) * 5;
    auto [k, a] = BothWays([&] {
      const ops::TargetDistribution t = ops::TargetFromLogits(logits);
      return std::vector<at::Tensor>{t.lse, t.top};
    });
    EXPECT_LE(RelInf(k[0], a[0]), 1e-6) << "vocab " << vocab;
    EXPECT_TRUE(k[1].equal(a[1])) << "vocab " << vocab;
    EXPECT_LE(RelInf(k[0], at::logsumexp(logits.to(at::kDouble), -1)), 1e-6);
  }
}

// The LK losses' terms: alpha = sum min(P, q) (fp32 sums: 1e-3) and the
// gradient with both coefficients set, in the plain and the log form, and
// alpha alone with the logits left as they are.
TEST_F(StudentKernelsGpuTest, SoftCrossEntropyAcceptanceTerms) {
  const int64_t rows = 600, vocab = 4000, targets = 300;
  const auto f32 = torch::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  ops::TargetDistribution target;
  target.logits = torch::randn({targets, vocab}, f32) * 3;
  target.lse = at::logsumexp(target.logits, -1);
  target.top = target.logits.argmax(-1);
  target.log_mass = -torch::rand({targets}, f32) * 2;  // masses in (e^-2, 1]
  const at::Tensor z = torch::randn({rows, vocab}, bf16) * 3;
  const at::Tensor target_rows = torch::randint(0, targets, {rows}, f32.dtype(at::kLong));
  const at::Tensor weight = (torch::rand({rows}, f32) > 0.3).to(at::kFloat);
  const at::Tensor scale = torch::full({rows}, 0.125, f32);
  for (bool log_form : {false, true}) {
    SCOPED_TRACE(log_form ? "log form" : "plain");
    ops::AcceptanceRows terms;
    terms.grad_scale = torch::full({rows}, -0.5, f32);
    terms.log_form = log_form;
    auto [k, a] = BothWays([&] {
      at::Tensor logits = z.clone();
      ops::SoftCrossEntropyResult r =
          ops::SoftCrossEntropyInPlace(logits, target, target_rows, weight, scale, &terms);
      return std::vector<at::Tensor>{r.loss, r.alpha, logits};
    });
    EXPECT_LE(RelInf(k[0], a[0]), 1e-3);
    EXPECT_LE(RelInf(k[1], a[1]), 1e-3);
    EXPECT_LE(RelInf(k[2], a[2]), 2e-2);
    EXPECT_EQ(k[1].masked_select(weight == 0).abs().max().item<float>(), 0.f);
  }
  ops::AcceptanceRows only_alpha;
  only_alpha.write_grad = false;
  auto [k, a] = BothWays([&] {
    at::Tensor logits = z.clone();
    ops::SoftCrossEntropyResult r =
        ops::SoftCrossEntropyInPlace(logits, target, target_rows, weight, scale, &only_alpha);
    return std::vector<at::Tensor>{r.alpha, logits};
  });
  EXPECT_LE(RelInf(k[0], a[0]), 1e-3);
  EXPECT_TRUE(k[1].equal(z)) << "alpha alone must leave the logits";
  EXPECT_TRUE(a[1].equal(z));
}

#ifdef E3_HAS_CUDA
// y += x * g with g on the device (the lm_head gradient's scale by the
// loss's output gradient): the fp32 sum rounded once to bf16, against the
// same in fp64 within half a bf16 ulp (plus the fp32 product's own error);
// lengths no multiple of 8 or misaligned are refused, for ATen to take.
TEST_F(StudentKernelsGpuTest, AddScaledByDeviceScalarRoundsOnce) {
  namespace sk = kernels;
  const int64_t n = 8 * 1031;
  const at::Tensor x = torch::randn({n}, bf16), y0 = torch::randn({n}, bf16);
  const at::Tensor g = torch::full({1}, 0.37, bf16.dtype(at::kFloat));
  at::Tensor y = y0.clone();
  void* stream = ops::StudentKernelStream(y);
  ASSERT_TRUE(sk::AddScaledByDeviceScalar(sk::Dtype::kBFloat16, y.data_ptr(), x.data_ptr(), n,
                                          g.data_ptr<float>(), stream));
  const at::Tensor exact = y0.to(at::kDouble) + x.to(at::kDouble) * 0.37f;
  const at::Tensor err = (y.to(at::kDouble) - exact).abs();
  const at::Tensor half_ulp = exact.abs() * std::ldexp(1.0, -8) + 1e-30;
  EXPECT_LE((err - half_ulp * 1.001).max().item<double>(), 1e-6);
  EXPECT_FALSE(sk::AddScaledByDeviceScalar(sk::Dtype::kBFloat16, y.data_ptr(), x.data_ptr(), n - 3,
                                           g.data_ptr<float>(), stream));
  EXPECT_FALSE(sk::AddScaledByDeviceScalar(sk::Dtype::kBFloat16, y.data_ptr(),
                                           static_cast<const at::BFloat16*>(x.data_ptr()) + 1, n - 8,
                                           g.data_ptr<float>(), stream));
}

// The fused optimizer's kernels (gradient norm, then clipped AdamW with
// weight decay and the bf16 working copy) against their formulas in fp64,
// over a length that is no multiple of their packs (8 and 4 elements), so
// the tail runs too: fp32 arithmetic, 1e-6 of each tensor's largest value.
TEST_F(StudentKernelsGpuTest, AdamWKernelsMatchTheirFormulaOverATail) {
  namespace sk = kernels;
  const int64_t n = 4099;
  const auto f32 = torch::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor grad = torch::randn({n}, bf16);
  at::Tensor master = torch::randn({n}, f32) * 0.1, m = torch::randn({n}, f32) * 0.01,
             v = torch::rand({n}, f32) * 1e-4, work = at::empty({n}, bf16);
  const at::Tensor master0 = master.clone(), m0 = m.clone(), v0 = v.clone();
  void* stream = ops::StudentKernelStream(grad);

  at::Tensor partial = at::empty({sk::AdamWNormBlocks(n)}, f32);
  ASSERT_TRUE(sk::GradSquaredNormPartials(sk::Dtype::kBFloat16, false, grad.data_ptr(), n,
                                          partial.data_ptr<float>(), stream));
  const at::Tensor norm = partial.sum().sqrt().reshape({1});
  const double norm_ref = grad.to(at::kDouble).norm().item<double>();
  EXPECT_NEAR(norm.item<double>(), norm_ref, 1e-6 * norm_ref);

  const double lr = 1e-2, step = 3, beta1 = 0.9, beta2 = 0.95, decay = 0.05, max_norm = 0.5;
  const at::Tensor lr_dev = torch::full({1}, lr, f32), step_dev = torch::full({1}, step, f32);
  sk::AdamWScalars s{lr_dev.data_ptr<float>(), step_dev.data_ptr<float>(), norm.data_ptr<float>()};
  s.max_norm = static_cast<float>(max_norm);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.weight_decay = static_cast<float>(decay);
  ASSERT_TRUE(sk::AdamWStep(sk::Dtype::kBFloat16, false, grad.data_ptr(), master.data_ptr<float>(),
                            m.data_ptr<float>(), v.data_ptr<float>(), work.data_ptr(), n, s, stream));

  const at::Tensor g = grad.to(at::kDouble) * std::min(1.0, max_norm / (norm_ref + 1e-6));
  const at::Tensor m_ref = beta1 * m0.to(at::kDouble) + (1 - beta1) * g;
  const at::Tensor v_ref = beta2 * v0.to(at::kDouble) + (1 - beta2) * g * g;
  const double bias1 = 1 - std::pow(beta1, step), bias2 = 1 - std::pow(beta2, step);
  const at::Tensor p_ref = master0.to(at::kDouble) * (1 - lr * decay) -
                           (lr / bias1) * m_ref / (v_ref.sqrt() / std::sqrt(bias2) + 1e-8);
  EXPECT_LE(RelInf(m, m_ref), 1e-6);
  EXPECT_LE(RelInf(v, v_ref), 1e-6);
  EXPECT_LE(RelInf(master, p_ref), 1e-6);
  EXPECT_GT(RelInf(master, master0), 1e-3) << "the step moved the weights";
  EXPECT_TRUE(work.equal(master.to(at::kBFloat16)));
}
#endif

// A draft large enough for every kernel (hidden 256; head_dim 64 by
// default, 128 with two query heads).
Eagle3Draft GpuDraft(at::ScalarType dtype, int64_t kv_heads, bool keep_full_target_head = false,
                     int64_t head_dim = 64) {
  Eagle3DraftConfig c = testing::TinyConfig();
  c.hidden_size = c.target_hidden_size = 256;
  c.intermediate_size = 704;
  c.num_heads = 256 / head_dim;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = 1024;
  c.draft_vocab_size = 512;
  Eagle3DraftOptions o;
  o.config = c;
  o.dtype = dtype;
  o.device = at::Device(at::kCUDA, 0);
  o.target_head_dtype = at::kFloat;
  o.seed = 3;
  o.keep_full_target_head = keep_full_target_head;
  auto frozen = testing::TinyFrozen(c, 11);
  frozen.embed_tokens = frozen.embed_tokens * 0.3;
  // As a bf16 checkpoint's head arrives: bf16 values in fp32.
  frozen.target_lm_head = frozen.target_lm_head.to(at::kBFloat16).to(at::kFloat);
  auto d = CreateEagle3Draft(o, frozen);
  EXPECT_TRUE(d.ok()) << d.status();
  return *d;
}

// One step from zeroed gradients: its output (metrics resolved) and the
// gradient it leaves.
std::pair<TttOutput, at::Tensor> StepAndGradient(Eagle3Draft& draft, const TeacherBatch& batch,
                                                 const TttOptions& options) {
  draft->flat().ZeroGrad();
  auto out = RunTtt(*draft, batch, options);
  EXPECT_TRUE(out.ok()) << out.status();
  out->loss.backward();
  ResolveTttMetrics(&*out);
  return std::make_pair(*out, draft->flat().grad().clone());
}

TeacherBatch GpuBatch(const Eagle3DraftConfig& c) {
  TeacherBatch b = testing::RandomBatch(c, {300, 17, 211, 1, 95}, /*seed=*/8);
  b.aux_hidden = b.aux_hidden * 0.5;
  return b;
}

// The whole fast step with its kernels against the same step in ATen on
// the same GPU (the attention's diagonal merge included). The merge gives
// each row head_dim / 16 lanes in the forward and head_dim / 8 in the
// backward: head_dim 128 packs 4 and 2 rows in a warp; TTT 7's six
// diagonal keys take the key gradient kernel two passes. The head_dim 32
// case (16 and 8 rows a warp) runs 623 tokens, so the grid's last warp
// holds rows past the end, which read the last row and write nothing.
TEST_F(StudentKernelsGpuTest, FastStepKernelsMatchItsAtenStatement) {
  struct Case {
    int64_t kv_heads, head_dim, ttt_length;
    bool one_sample = false;
  };
  // TTT 12: eleven diagonal keys, more than one pass of the key kernel can
  // hold. One sample, every position trained: the head's chunks interleave
  // the steps' rows (runs of unequal length).
  for (const Case& c : {Case{2, 64, 7}, Case{4, 64, 7}, Case{1, 128, 7}, Case{2, 64, 12},
                        Case{1, 32, 7}, Case{2, 64, 7, true}}) {
    SCOPED_TRACE(::testing::Message() << "kv_heads " << c.kv_heads << ", head_dim " << c.head_dim
                                      << ", TTT " << c.ttt_length << (c.one_sample ? ", one sample" : ""));
    Eagle3Draft draft = GpuDraft(at::kBFloat16, c.kv_heads, false, c.head_dim);
    TeacherBatch batch = GpuBatch(draft->config());
    if (c.head_dim == 32 || c.one_sample) {
      const std::vector<int64_t> lengths =
          c.one_sample ? std::vector<int64_t>{700} : std::vector<int64_t>{300, 17, 211, 1, 94};
      batch = testing::RandomBatch(draft->config(), lengths, /*seed=*/8);
      batch.aux_hidden = batch.aux_hidden * 0.5;
    }
    TttOptions options;
    options.kernels = TttKernels::kFast;
    options.length = c.ttt_length;
    auto [k, a] = BothWays([&] {
      draft->flat().ZeroGrad();
      auto out = RunTtt(*draft, batch, options);
      EXPECT_TRUE(out.ok()) << out.status();
      out->loss.backward();
      return std::make_pair(*out, draft->flat().grad().clone());
    });
    EXPECT_NEAR(k.first.loss_value, a.first.loss_value, 1e-2 * std::abs(a.first.loss_value));
    for (size_t j = 0; j < k.first.acc.size(); ++j)
      EXPECT_NEAR(k.first.acc[j], a.first.acc[j], 0.03) << j;
    EXPECT_LE(RelInf(k.second, a.second), 5e-2);
  }
}

// The head writes its gradient rows in place: into a range of a larger
// tensor's rows, the same values as into a new tensor, the rows around it
// untouched.
TEST_F(StudentKernelsGpuTest, RmsNormBackwardIntoARangeOfRows) {
  const at::Tensor x = torch::randn({300, 1024}, bf16) * 3;
  const at::Tensor w = torch::rand({1024}, bf16) + 0.5;
  const at::Tensor dy = torch::randn({300, 1024}, bf16);
  const ops::RmsNormResult r = ops::RmsNormForward(x, w, 1e-5);
  auto [dx, dw] = ops::RmsNormBackward(dy, x, r.rstd, w);
  at::Tensor big = torch::full({400, 1024}, 7.0, bf16);
  const at::Tensor dw_into = ops::RmsNormBackwardInto(dy, x, r.rstd, w, big.narrow(0, 60, 300));
  EXPECT_TRUE(at::equal(big.narrow(0, 60, 300), dx));
  EXPECT_TRUE(at::equal(dw_into, dw));
  EXPECT_EQ(big.narrow(0, 0, 60).ne(7).sum().item<int64_t>(), 0);
  EXPECT_EQ(big.narrow(0, 360, 40).ne(7).sum().item<int64_t>(), 0);
}

// The loss's output gradient is read on the device by the kernel that
// scales the head's hidden-state gradients: a loss scaled by a power of
// two scales the step's gradient by it (up to the attention backward's
// atomic summation order).
TEST_F(StudentKernelsGpuTest, AScaledLossScalesTheStepsGradient) {
  Eagle3Draft draft = GpuDraft(at::kBFloat16, 2, false, 64);
  const TeacherBatch batch = GpuBatch(draft->config());
  TttOptions options;
  options.kernels = TttKernels::kFast;
  auto grad_of = [&](double scale) {
    draft->flat().ZeroGrad();
    auto out = RunTtt(*draft, batch, options);
    EXPECT_TRUE(out.ok()) << out.status();
    (out->loss * scale).backward();
    return draft->flat().grad().clone();
  };
  const at::Tensor g1 = grad_of(1.0), g4 = grad_of(0.25);
  EXPECT_LE(RelInf(g4, 0.25 * g1), 2e-2);
  EXPECT_GT(RelInf(g4, g1), 0.5);
}

// The TTT steps' gradient sum of the q/k/v embedding half: the fp32
// scatter-add kernel against index_add_, distinct rows within each add,
// repeated across the two; fp32 sums in another order.
TEST_F(StudentKernelsGpuTest, StepRowsScatterAddMatchesIndexAdd) {
  const auto on = torch::TensorOptions().device(at::kCUDA);
  const at::Tensor dy = at::randn({500, 256}, on).to(at::kBFloat16);
  const at::Tensor rows = at::randperm(700, on.dtype(at::kLong)).narrow(0, 0, 500);
  auto [k, a] = BothWays([&] {
    ops::StepRowsGradient g(700, 256, on.dtype(at::kBFloat16));
    g.Add(rows, dy);
    g.Add(rows.flip(0), dy);
    return g.Take(at::kFloat);
  });
  EXPECT_LE(RelInf(k, a), 1e-5);
}

// The embedding half's weight-space gradients: the kernel pass against its
// ATen statement (both from the same fp32 G), the projection a column
// block of a wider bf16 matrix with a row count that leaves the last row
// block partial and a width that leaves the last column tile partial.
// Then both against the token-space route in fp64 (dy = dP @ W, the norm's
// backward): bf16 gradients within the bound above.
TEST_F(StudentKernelsGpuTest, NormedProjectionGradsMatchTheTokenSpaceRoute) {
  const int64_t rows = 300, in = 264, out = 200;
  const at::Tensor x = at::randn({rows, in}, bf16);
  const at::Tensor norm_weight = (1 + 0.2 * at::randn({in}, bf16.dtype(at::kFloat))).to(at::kBFloat16);
  const at::Tensor wide = (0.05 * at::randn({out, 2 * in}, bf16.dtype(at::kFloat))).to(at::kBFloat16);
  const at::Tensor step_rows = at::randperm(rows, bf16.dtype(at::kLong));
  const at::Tensor dp = at::randn({rows, out}, bf16);
  const at::Tensor anchor = at::zeros({1}, bf16).requires_grad_(true);
  auto [k, a] = BothWays([&] {
    at::Tensor grad_wide = at::full({out, 2 * in}, 0.125, bf16);
    at::Tensor norm_grad = at::zeros({in}, bf16);
    const ops::ProjectedForSteps p = ops::ProjectNormedForSteps(x, norm_weight, norm_grad, wide.narrow(1, 0, in),
                                                                grad_wide.narrow(1, 0, in), anchor, 1e-6);
    (ops::GatherStepRows(p, step_rows) * dp.index_select(0, step_rows)).sum().backward();
    return std::make_pair(grad_wide, norm_grad);
  });
  EXPECT_LE(RelInf(k.first, a.first), 2e-2);
  EXPECT_LE(RelInf(k.second, a.second), 2e-2);
  EXPECT_TRUE(k.first.narrow(1, in, in).eq(0.125).all().item<bool>()) << "the other columns were written";
  // The token-space route in fp64 from the same rounded rows.
  const at::Tensor xd = x.to(at::kDouble), w = wide.narrow(1, 0, in).to(at::kDouble);
  const at::Tensor xhat = (xd * at::rsqrt(xd.pow(2).mean(-1, true) + 1e-6)).to(at::kBFloat16).to(at::kDouble);
  const at::Tensor dy = at::mm(dp.to(at::kDouble), w);
  EXPECT_LE(RelInf(k.second, (dy * xhat).sum(0)), 2e-2);
  EXPECT_LE(RelInf(k.first.narrow(1, 0, in) - 0.125, at::mm(dp.to(at::kDouble).t(), xhat * norm_weight.to(at::kDouble))),
            2e-2);
}

// The step's residual GEMMs run cuBLASLt with the residual as the
// epilogue's C (no copy of it first), also for a weight that is a column
// block of a wider matrix (the q/k/v hidden half) and a residual that is a
// range of rows of a larger tensor (the gathered embedding half): the sum
// against at::addmm's, within a bf16 rounding of the output's scale (cuBLASLt
// rounds the sum once, addmm may round the product first).
TEST_F(StudentKernelsGpuTest, ResidualLinearReadsTheResidualInPlace) {
  const int64_t rows = 1000, in = 256, out = 384;
  const at::Tensor x = at::randn({rows, in}, bf16);
  const at::Tensor wide = (0.05 * at::randn({out, 2 * in}, bf16.dtype(at::kFloat))).to(at::kBFloat16);
  const at::Tensor table = at::randn({rows + 7, out}, bf16);
  const at::Tensor anchor = at::zeros({1}, bf16).requires_grad_(true);
  at::Tensor grad_wide = at::zeros_like(wide);
  for (const at::Tensor& w : {wide.narrow(1, in, in), wide.narrow(1, 0, in).contiguous()}) {
    const at::Tensor residual = table.narrow(0, 3, rows);
    const int64_t lt_before = LtGemmCalls();
    const at::Tensor y = ops::LinearAccumulate(x, w, grad_wide.narrow(1, in, in), anchor, residual);
    EXPECT_EQ(LtGemmCalls(), lt_before + 1) << "the GEMM did not run in cuBLASLt";
    const at::Tensor want = at::addmm(residual.to(at::kFloat), x.to(at::kFloat), w.to(at::kFloat).t());
    EXPECT_LE(RelInf(y, want), 1e-2);
    EXPECT_TRUE(table.narrow(0, 3, rows).equal(residual)) << "the residual was written";
  }
}

// A target head that bf16 holds exactly (a bf16 checkpoint's, kept in
// fp32) and bf16 hidden states: the target logits are their exact fp32
// product (the 16-bit GEMM with an fp32 result, or TF32 without it), so
// only the fp32 summation order separates them from fp64.
TEST_F(StudentKernelsGpuTest, TargetLogitsOfBf16ValuesAreTheirFp32Product) {
  Eagle3Draft draft = GpuDraft(at::kBFloat16, 2);
  const at::Tensor head = draft->target_head;
  ASSERT_TRUE(head.to(at::kBFloat16).to(at::kFloat).equal(head)) << "the fixture's head is not bf16 values";
  const at::Tensor hidden = at::randn({300, head.size(1)}, head.options()).to(at::kBFloat16);
  const at::Tensor logits = draft->TargetLogits(hidden);
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  const at::Tensor exact = at::mm(hidden.to(at::kDouble), head.to(at::kDouble).t());
  EXPECT_LE(RelInf(logits, exact), 1e-5);
}

// One long sequence runs the causal block in cuDNN over rows padded to a
// multiple of 512 (4100 -> 4608): the same step with varlen flash
// attention instead gives the same loss, accuracies and gradients, within
// the bf16 kernels' bounds above.
TEST_F(StudentKernelsGpuTest, LongSequenceCudnnAttentionMatchesFlash) {
  if (!compat::kHasFlashVarlen) GTEST_SKIP() << "needs LibTorch 2.5+ with CUDA";
  Eagle3Draft draft = GpuDraft(at::kBFloat16, 2);
  TeacherBatch batch = testing::RandomBatch(draft->config(), {4100}, /*seed=*/9);
  batch.aux_hidden = batch.aux_hidden * 0.5;
  TttOptions options;
  options.kernels = TttKernels::kFast;
  auto run = [&](bool cudnn) {
    ops::SetTttCudnnAttention(cudnn);
    return StepAndGradient(draft, batch, options);
  };
  const int64_t before = ops::TttCudnnAttentionCalls();
  auto [c, f] = std::make_pair(run(true), run(false));
  ops::SetTttCudnnAttention(true);
  // Seven steps, a forward and a backward each.
  EXPECT_EQ(ops::TttCudnnAttentionCalls() - before, 14) << "cuDNN did not run (or failed and switched off)";
  EXPECT_NEAR(c.first.loss_value, f.first.loss_value, 1e-2 * std::abs(f.first.loss_value));
  for (size_t j = 0; j < c.first.acc.size(); ++j) EXPECT_NEAR(c.first.acc[j], f.first.acc[j], 0.03) << j;
  EXPECT_LE(RelInf(c.second, f.second), 5e-2);
}

// Fast (kernels, flash attention) against the reference op sequence, both
// in bf16 on the GPU: the bf16 golden test's bounds.
// The plan's inputs come down through the pinned staging buffer: mixed
// integer types, a field already on the host, a second batch larger
// than the first (the buffer grows) and one smaller (it is reused).
TEST_F(StudentKernelsGpuTest, PlanInputsDownloadFromTheDevice) {
  Eagle3Draft draft = GpuDraft(at::kBFloat16, 2);
  for (int64_t tokens : {300, 5000, 40}) {
    TeacherBatch b;
    b.input_ids = torch::randint(draft->config().vocab_size, {tokens}, bf16.dtype(at::kInt));
    b.target_argmax = torch::randint(draft->config().vocab_size, {tokens}, bf16.dtype(at::kLong));
    b.loss_mask = torch::rand({tokens}, bf16.dtype(at::kFloat)) < 0.5;
    b.cu_seqlens = torch::tensor(std::vector<int64_t>{0, tokens / 3, tokens});  // host
    TttPlanInputsDownload download(b);
    auto in = download.Finish(*draft);
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_TRUE(in->batch.ids.equal(b.input_ids.cpu().to(at::kLong))) << tokens;
    EXPECT_TRUE(in->batch.top.equal(b.target_argmax.cpu())) << tokens;
    EXPECT_TRUE(in->batch.mask.equal(b.loss_mask.cpu())) << tokens;
    EXPECT_EQ(in->cu, (std::vector<int64_t>{0, tokens / 3, tokens}));
  }
  TeacherBatch bad;
  bad.input_ids = torch::full({8}, draft->config().vocab_size, bf16.dtype(at::kLong));
  bad.target_argmax = torch::zeros({8}, bf16.dtype(at::kLong));
  bad.loss_mask = torch::ones({8}, bf16.dtype(at::kBool));
  bad.cu_seqlens = torch::tensor(std::vector<int64_t>{0, 8}).cuda();
  TttPlanInputsDownload download(bad);
  auto in = download.Finish(*draft);
  ASSERT_FALSE(in.ok());
  EXPECT_NE(std::string(in.status().message()).find("input_ids"), std::string::npos) << in.status();
}

TEST_F(StudentKernelsGpuTest, FastStepMatchesTheReferenceStepInBf16) {
  Eagle3Draft ref = GpuDraft(at::kBFloat16, 2), fast = GpuDraft(at::kBFloat16, 2);
  const TeacherBatch batch = GpuBatch(ref->config());
  TttOptions options;
  auto a = RunTtt(*ref, batch, options);
  ASSERT_TRUE(a.ok()) << a.status();
  a->loss.backward();
  options.kernels = TttKernels::kFast;
  fast->flat().ZeroGrad();
  auto b = RunTtt(*fast, batch, options);
  ASSERT_TRUE(b.ok()) << b.status();
  b->loss.backward();
  EXPECT_NEAR(b->loss_value, a->loss_value, 2e-2 * std::abs(a->loss_value));
  for (size_t j = 0; j < a->acc.size(); ++j) {
    EXPECT_NEAR(b->ploss[j], a->ploss[j], 2e-2 * std::abs(a->ploss[j]) + 1e-6) << j;
    EXPECT_NEAR(b->acc[j], a->acc[j], 0.05) << j;
  }
  const auto pa = ref->ExportedParameters(), pb = fast->ExportedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_LE(RelInf(pb[i].second.grad(), pa[i].second.grad()), 2e-1) << pa[i].first;
  }
}

// The LK losses: the fast step's fused terms against the reference op
// sequence's autograd, both in bf16 on the GPU (the bounds above).
TEST_F(StudentKernelsGpuTest, LkLossesFastStepMatchesTheReference) {
  for (TttLoss loss : {TttLoss::kLkAlpha, TttLoss::kLkLambda}) {
    SCOPED_TRACE(loss == TttLoss::kLkAlpha ? "lk_alpha" : "lk_lambda");
    Eagle3Draft ref = GpuDraft(at::kBFloat16, 2, true), fast = GpuDraft(at::kBFloat16, 2, true);
    const TeacherBatch batch = GpuBatch(ref->config());
    TttOptions options;
    options.loss = loss;
    auto a = RunTtt(*ref, batch, options);
    ASSERT_TRUE(a.ok()) << a.status();
    a->loss.backward();
    options.kernels = TttKernels::kFast;
    fast->flat().ZeroGrad();
    auto b = RunTtt(*fast, batch, options);
    ASSERT_TRUE(b.ok()) << b.status();
    b->loss.backward();
    EXPECT_NEAR(b->loss_value, a->loss_value, 2e-2 * std::abs(a->loss_value));
    ASSERT_EQ(b->acceptance_rate.size(), 7u);
    ASSERT_EQ(a->acceptance_rate.size(), 7u);
    for (size_t j = 0; j < 7; ++j) EXPECT_NEAR(b->acceptance_rate[j], a->acceptance_rate[j], 1e-2) << j;
    const auto pa = ref->ExportedParameters(), pb = fast->ExportedParameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_LE(RelInf(pb[i].second.grad(), pa[i].second.grad()), 2e-1) << pa[i].first;
    }
  }
}

// Chat data on the GPU: with each sample's first 60% a prompt, the fast
// step that leaves untrained rows out of the midlayer at TTT steps >= 1
// gives the step over every row's loss, accuracies and gradients (the same
// arithmetic on fewer rows; bf16 GEMMs of other shapes round differently).
TEST_F(StudentKernelsGpuTest, SkippingUntrainedRowsKeepsTheStep) {
  Eagle3Draft draft = GpuDraft(at::kBFloat16, 2);
  TeacherBatch batch = GpuBatch(draft->config());
  std::vector<int64_t> lengths = {300, 17, 211, 1, 95};
  at::Tensor mask = batch.loss_mask.to(at::kCPU).clone();
  int64_t at_row = 0;
  for (int64_t n : lengths) {
    mask.narrow(0, at_row, (n * 6) / 10).zero_();
    at_row += n;
  }
  batch.loss_mask = mask.to(batch.loss_mask.device());
  auto run = [&](bool skip) {
    TttOptions options;
    options.kernels = TttKernels::kFast;
    options.skip_untrained_rows = skip;
    return StepAndGradient(draft, batch, options);
  };
  auto [skip, all] = std::make_pair(run(true), run(false));
  EXPECT_LT(skip.first.midlayer_rows, all.first.midlayer_rows);
  EXPECT_NEAR(skip.first.loss_value, all.first.loss_value, 1e-2 * std::abs(all.first.loss_value));
  for (size_t j = 0; j < all.first.acc.size(); ++j) EXPECT_NEAR(skip.first.acc[j], all.first.acc[j], 0.03) << j;
  EXPECT_LE(RelInf(skip.second, all.second), 5e-2);
}

}  // namespace
}  // namespace e3
