// The `sgl` backend against the `hf` reference on the same weights and
// packed batches, on the CPU. There the custom kernels and the varlen flash
// call fall back to the reference op sequence, so what runs is the sgl
// control flow: fused QKV and gate-up weights, residual adds done after
// the o_proj and down_proj GEMMs (cuBLASLt's epilogue on a GPU; here
// at::linear's fallback, then the norms only normalise), rope in place on
// views of the fused product. The same
// products in a larger GEMM, so the aux states and the final hidden state
// agree to fp32 rounding (bound 1e-5 relative to each tensor's max;
// measured 0 with BLIS, which computes every output column the same way
// however many there are) and the target argmax agrees at every position.
// DeepSeek (MLA, DeepSeekMoE's routing into the grouped experts, FP8
// weights) and GPT-OSS (sinks, sliding windows, clamped SwiGLU experts
// with biases through the grouped path, MXFP4 weights) are held to the
// same bound. The layer-level tests check each piece against its
// reference. The kernels themselves are tested on a GPU
// (sgl_kernels_gpu_test, moe_archs_gpu_test).
#include <gtest/gtest.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/model/model_dir.h"
#include "common/torch/gemm.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/layers/clamped_swiglu.h"
#include "teacher_server/layers/deepseek_moe.h"
#include "teacher_server/layers/fp8_head_argmax.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/mlp.h"
#include "teacher_server/layers/moe.h"
#include "teacher_server/layers/rms_norm.h"
#include "teacher_server/layers/rotary.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/models/forward_graphs.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/random_experts.h"

namespace e3 {
namespace {

using testing::LoadGoldenCase;
using testing::RelInf;

TEST(SglLayersTest, FusedQkvAndGateUpReplaceTheSeparateWeightsAndMatchThem) {
  torch::manual_seed(0);
  const int64_t T = 9, H = 48, heads = 6, kv = 2, D = 8, I = 80;
  AttentionShape shape{heads, kv, D, D};
  AttentionWeights aw;
  aw.q_proj = torch::randn({heads * D, H}) * 0.1;
  aw.k_proj = torch::randn({kv * D, H}) * 0.1;
  aw.v_proj = torch::randn({kv * D, H}) * 0.1;
  aw.o_proj = torch::randn({H, heads * D}) * 0.1;
  aw.q_bias = torch::randn({heads * D});  // Qwen2-style qkv bias
  aw.k_bias = torch::randn({kv * D});
  aw.v_bias = torch::randn({kv * D});
  MlpWeights mw;
  mw.gate_proj = torch::randn({I, H}) * 0.1;
  mw.up_proj = torch::randn({I, H}) * 0.1;
  mw.down_proj = torch::randn({H, I}) * 0.1;
  const at::Tensor x = torch::randn({T, H});
  const at::Tensor pos = torch::cat({torch::arange(5), torch::arange(4)}).to(at::kFloat);
  const at::Tensor inv = 1.0 / torch::pow(10000.0, torch::arange(0, D, 2).to(at::kFloat) / D);
  const at::Tensor ang = torch::cat({pos.unsqueeze(1) * inv, pos.unsqueeze(1) * inv}, -1);
  const PackedLayout cu = MakePackedLayout({0, 5, 9}, at::kCPU, AttentionKernel::kEager);
  EXPECT_EQ(cu.max_seqlen, 5);
  EXPECT_FALSE(cu.uniform);
  EXPECT_TRUE(MakePackedLayout({0, 4, 8, 12}, at::kCPU, AttentionKernel::kFlashVarlen).uniform);
  EXPECT_FALSE(MakePackedLayout({0, 4, 8, 12}, at::kCPU, AttentionKernel::kFlashVarlen).cu_seqlens_device.defined());
  const AttentionOptions eager{AttentionKernel::kEager, /*rope_in_place=*/false};
  const at::Tensor a0 = SelfAttention(x, aw, shape, ang.cos(), ang.sin(), cu, eager);
  const at::Tensor m0 = SwiGluMlp(x, mw);
  FuseQkv(&aw);
  FuseGateUp(&mw);
  EXPECT_FALSE(aw.q_proj.defined());
  EXPECT_FALSE(mw.gate_proj.defined());
  EXPECT_EQ(aw.qkv_proj.sizes(), (at::IntArrayRef{(heads + 2 * kv) * D, H}));
  EXPECT_EQ(aw.qkv_bias.sizes(), (at::IntArrayRef{(heads + 2 * kv) * D}));
  EXPECT_EQ(mw.gate_up_proj.sizes(), (at::IntArrayRef{2 * I, H}));
  const at::Tensor a1 = SelfAttention(x, aw, shape, ang.cos(), ang.sin(), cu, eager);
  const at::Tensor m1 = SwiGluMlp(x, mw);
  EXPECT_LE(RelInf(a1, a0), 1e-6);
  EXPECT_LE(RelInf(m1, m0), 1e-6);
  // The sgl attention: rope in place on views of the fused product, and
  // the varlen kernel choice (the per-sample SDPA loop on the CPU).
  const at::Tensor a2 = SelfAttention(x, aw, shape, ang.cos(), ang.sin(), cu,
                                      AttentionOptions{AttentionKernel::kFlashVarlen, /*rope_in_place=*/true});
  EXPECT_LE(RelInf(a2, a0), 1e-5);
  EXPECT_TRUE(SwiGluMlp(x, mw, /*fused_activation=*/true).equal(m1));
}

TEST(SglLayersTest, RopeInPlaceRotatesAStridedViewLikeTheReference) {
  torch::manual_seed(1);
  const int64_t T = 7, heads = 3, D = 16;
  for (int64_t rotary_dim : {D, D / 2}) {  // full and partial rotary
    // q as a view into a wider fused product, as the sgl attention has it.
    at::Tensor fused = torch::randn({T, heads * D + 5});
    at::Tensor q = fused.narrow(1, 0, heads * D).view({T, heads, D});
    const at::Tensor angles = torch::randn({T, rotary_dim});
    const at::Tensor expected_rot = ApplyRotary(q.narrow(-1, 0, rotary_dim).clone(), angles.cos(), angles.sin());
    const at::Tensor expected_pass = q.narrow(-1, rotary_dim, D - rotary_dim).clone();
    const at::Tensor tail = fused.narrow(1, heads * D, 5).clone();
    RopeInPlace(q, angles.cos(), angles.sin(), /*fused=*/true);
    EXPECT_TRUE(q.narrow(-1, 0, rotary_dim).equal(expected_rot)) << "rotary_dim " << rotary_dim;
    EXPECT_TRUE(q.narrow(-1, rotary_dim, D - rotary_dim).equal(expected_pass));
    EXPECT_TRUE(fused.narrow(1, heads * D, 5).equal(tail)) << "wrote outside the view";
  }
}

TEST(SglLayersTest, AddRmsNormAddsThenNormalisesAndLeavesEarlierStatesAlone) {
  torch::manual_seed(2);
  const at::Tensor w = torch::randn({32});
  at::Tensor h = torch::randn({5, 32});
  const at::Tensor before = h;  // e.g. a captured aux state
  const at::Tensor before_copy = h.clone();
  const at::Tensor delta = torch::randn({5, 32});
  const at::Tensor y = AddRmsNorm(&h, delta, w, 1e-5, /*fused=*/true);
  EXPECT_TRUE(h.equal(before_copy + delta));
  EXPECT_TRUE(y.equal(RmsNorm(before_copy + delta, w, 1e-5)));
  EXPECT_TRUE(before.equal(before_copy));
  // No delta: only the norm, h untouched.
  at::Tensor h2 = before_copy.clone();
  EXPECT_TRUE(AddRmsNorm(&h2, at::Tensor(), w, 1e-5, true).equal(RmsNorm(before_copy, w, 1e-5)));
  EXPECT_TRUE(h2.equal(before_copy));
}

TEST(SglLayersTest, SiluMulSplitsGateThenUp) {
  const at::Tensor gate_up = torch::randn({4, 2 * 24});
  const at::Tensor expected = at::silu(gate_up.narrow(1, 0, 24)) * gate_up.narrow(1, 24, 24);
  EXPECT_TRUE(SiluMul(gate_up, /*fused=*/true).equal(expected));
  EXPECT_TRUE(SiluMul(gate_up, /*fused=*/false).equal(expected));
}

TEST(SglLayersTest, SetBackendKnowsHfAndSgl) {
  ModelOptions o;
  ASSERT_TRUE(SetBackend("sgl", &o).ok());
  EXPECT_TRUE(o.fuse_projections);
  EXPECT_TRUE(o.fused_kernels);
  EXPECT_EQ(o.attention, AttentionKernel::kFlashVarlen);
  EXPECT_EQ(o.gemm, GemmPath::kCublasLtTuned);
  EXPECT_TRUE(o.residual_in_gemm);
  EXPECT_TRUE(o.argmax_in_gemm);
  EXPECT_TRUE(o.argmax_fp8);
  EXPECT_TRUE(o.cuda_graphs);
  EXPECT_TRUE(o.tp_overlap);
  EXPECT_TRUE(o.grouped_experts);
  ASSERT_TRUE(SetBackend("hf", &o).ok());
  EXPECT_FALSE(o.fuse_projections);
  EXPECT_FALSE(o.fused_kernels);
  EXPECT_EQ(o.attention, AttentionKernel::kSdpa);
  EXPECT_EQ(o.gemm, GemmPath::kAten);
  EXPECT_FALSE(o.residual_in_gemm);
  EXPECT_FALSE(o.argmax_in_gemm);
  EXPECT_FALSE(o.argmax_fp8);
  EXPECT_FALSE(o.cuda_graphs);
  EXPECT_FALSE(o.tp_overlap);
  EXPECT_FALSE(o.grouped_experts);
  const absl::Status bad = SetBackend("vllm", &o);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.message()).find("expected hf or sgl"), std::string::npos) << bad;
}

// The grouped MoE is the per-expert loop's sum: the same pairs, the same
// per-expert products (on the CPU the groups run as one GEMM each), the
// same roundings and order of the adds, so equal bit for bit in bf16 and
// fp32; also under EP, where a rank holds experts [first, first + count)
// and tokens routed elsewhere add nothing (their rows of the grouped
// product hold NaN here, so a pair that slipped through would show).
// The startup line's account of the forward: each sgl technique, or why
// it is off here. On the CPU the kernels, the fused attention, cuBLASLt and
// graphs are off; the fusion and the experts' path are as configured.
TEST(SglLayersTest, TechniquesSayWhatRunsAndWhatIsOffHere) {
  auto dir = ModelDir::Open(LoadGoldenCase("rand_qwen3_moe").model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto load = [&](const std::string& backend) {
    ModelOptions o;
    EXPECT_TRUE(SetBackend(backend, &o).ok());
    auto m = LoadCausalLM(**dir, o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? (*m)->Techniques() : std::string();
  };
  const std::string sgl = load("sgl"), hf = load("hf");
  for (const char* part : {"qkv and gate-up fused", "custom kernels off (need CUDA", "fused attention off",
                           "ATen GEMMs", "target argmax in the lm_head GEMM", "CUDA graphs off (not a CUDA device)",
                           "experts by a loop in 5 of 5 MoE layers"}) {
    EXPECT_NE(sgl.find(part), std::string::npos) << "sgl: " << sgl << "\nlacks: " << part;
  }
  for (const char* part : {"separate projections", "reference element-wise ops", "SDPA per sample", "ATen GEMMs",
                           "target argmax from logits", "experts by a loop in 5 of 5 MoE layers"}) {
    EXPECT_NE(hf.find(part), std::string::npos) << "hf: " << hf << "\nlacks: " << part;
  }
  EXPECT_EQ(hf.find("CUDA graphs"), std::string::npos) << "hf does not ask for graphs: " << hf;
}

TEST(SglLayersTest, GroupedMoeIsThePerExpertLoopsSum) {
  torch::manual_seed(3);
  const int64_t H = 32, I = 24, T = 37;
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 8}, {2, 3}, {5, 3}}) {
      MoeWeights w = testing::RandomExperts(8, first, count, H, I, dtype, 1.0 / 8);
      const at::Tensor x = torch::randn({T, H}).to(dtype);
      for (const MoeRouting routing : {MoeRouting{2, true}, MoeRouting{3, false}}) {
        const at::Tensor want = SparseMoe(x, w, routing);
        MoeWeights stacked = w;
        ASSERT_TRUE(ExpertsStackable(stacked));
        StackExperts(&stacked);
        EXPECT_EQ(stacked.stacked_gate_up.sizes(), (std::vector<int64_t>{count, 2 * I, H}));
        EXPECT_EQ(stacked.stacked_down.sizes(), (std::vector<int64_t>{count, H, I}));
        EXPECT_TRUE(stacked.experts[1].gate_up_proj.equal(w.experts[1].gate_up_proj));
        EXPECT_TRUE(stacked.experts[1].gate_up_proj.is_alias_of(stacked.stacked_gate_up)) << "views of the stack";
        EXPECT_TRUE(stacked.experts[2].down_proj.is_alias_of(stacked.stacked_down));
        const at::Tensor got = GroupedMoe(x, stacked, routing);
        EXPECT_TRUE(got.equal(want)) << c10::toString(dtype) << " experts [" << first << ", " << first + count
                                     << "), top " << routing.top_k << ": max diff "
                                     << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
        EXPECT_TRUE(RoutedExperts(x, stacked, routing).equal(got)) << "stacked experts take the grouped path";
        EXPECT_TRUE(RoutedExperts(x, w, routing).equal(want));
      }
    }
  }
  MoeWeights unfused = testing::RandomExperts(4, 0, 4, H, I, at::kFloat, 1.0 / 8);
  unfused.experts[0].down_bias = torch::zeros({H});
  EXPECT_FALSE(ExpertsStackable(unfused)) << "biases are not stacked";
  EXPECT_FALSE(ExpertsStackable(MoeWeights())) << "no experts on this rank";
}

// GPT-OSS's experts through the grouped path: each pair's gate_up row plus
// its expert's bias, the clamped activation, the down row plus its bias,
// then the router's weights, as the per-expert loop (ClampedSwiGluMlp) does,
// under EP and on a TP rank whose slice does not add the down bias. In
// bf16 equal bit for bit here; in fp32 within 1e-6 relative: ATen's CPU
// element-wise kernels run a vector body and a scalar tail (sigmoid by
// Sleef or by std::exp, an ulp apart), so the activation's last bit
// depends on where an element falls in its tensor, whose length differs
// between one expert's rows and all pairs' (measured: one case of 36 an
// ulp apart, 9.5e-7 absolute). The inputs are scaled so that the clamp
// bites on about a fifth of the gate/up values.
TEST(SglLayersTest, GroupedMoeRunsClampedSwiGluExpertsWithBiasesAsTheLoop) {
  torch::manual_seed(5);
  const int64_t H = 32, I = 24, T = 41, total = 8;
  MoeRouting routing;
  routing.top_k = 2;
  routing.topk_then_softmax = true;
  routing.clamped_swiglu = ClampedSwiGlu{1.702, 7.0};
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 8}, {2, 3}, {5, 3}}) {
      for (const bool down_bias : {true, false}) {
        MoeWeights w = testing::RandomExperts(total, first, count, H, I, dtype, 1.0 / 4);
        w.router_bias = torch::randn({total}).to(dtype);
        for (MlpWeights& m : w.experts) {
          m.gate_up_bias = torch::randn({2 * I}).to(dtype);
          if (down_bias) m.down_bias = torch::randn({H}).to(dtype);
        }
        const at::Tensor x = (torch::randn({T, H}) * 4).to(dtype);
        const at::Tensor pre = at::linear(x, w.experts[0].gate_up_proj) + w.experts[0].gate_up_bias;
        EXPECT_GT(pre.abs().gt(7.0).to(at::kFloat).mean().item<float>(), 0.1) << "the clamp bites";
        const at::Tensor want = SparseMoe(x, w, routing);
        MoeWeights stacked = w;
        ASSERT_TRUE(ExpertsStackable(stacked));
        StackExperts(&stacked);
        EXPECT_EQ(stacked.stacked_gate_up_bias.sizes(), (std::vector<int64_t>{count, 2 * I}));
        EXPECT_EQ(stacked.stacked_down_bias.defined(), down_bias);
        EXPECT_TRUE(stacked.experts[1].gate_up_bias.is_alias_of(stacked.stacked_gate_up_bias));
        EXPECT_TRUE(stacked.experts[1].gate_up_bias.equal(w.experts[1].gate_up_bias));
        const at::Tensor got = GroupedMoe(x, stacked, routing);
        const std::string what = absl::StrCat(c10::toString(dtype), " experts [", first, ", ", first + count,
                                              "), down bias ", down_bias);
        if (dtype == at::kBFloat16) {
          EXPECT_TRUE(got.equal(want)) << what << ": max diff "
                                       << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
        } else {
          EXPECT_LE(RelInf(got, want), 1e-6) << what;
        }
        EXPECT_TRUE(RoutedExperts(x, stacked, routing).equal(got));
        if (dtype == at::kFloat) {
          // The fused [gate; up] product against the separate ones the hf
          // loader keeps: the same dot products.
          MoeWeights separate = w;
          for (MlpWeights& m : separate.experts) {
            m.gate_proj = m.gate_up_proj.narrow(0, 0, I);
            m.up_proj = m.gate_up_proj.narrow(0, I, I);
            m.gate_bias = m.gate_up_bias.narrow(0, 0, I);
            m.up_bias = m.gate_up_bias.narrow(0, I, I);
            m.gate_up_proj = m.gate_up_bias = at::Tensor();
          }
          EXPECT_LE(RelInf(SparseMoe(x, separate, routing), want), 1e-6);
        }
      }
    }
  }
  MoeWeights mixed = testing::RandomExperts(4, 0, 4, H, I, at::kFloat, 1.0 / 8);
  mixed.experts[2].gate_up_bias = torch::zeros({2 * I});
  EXPECT_FALSE(ExpertsStackable(mixed)) << "a bias on some experts only";
}

// DeepSeekMoE's routing (sigmoid scores with the correction bias, 2 of 4
// groups, renormalised, scaled by 2.5; fp32 weights) feeding the grouped
// experts: GroupedExpertsSum is WeightedExpertsSum bit for bit (each fp32
// product rounded to x's dtype, added in expert-id order), and DeepseekMoe
// with stacked experts and a shared expert is its loop form.
TEST(SglLayersTest, GroupedExpertsSumTakesDeepseekRoutingAsTheLoop) {
  torch::manual_seed(6);
  const int64_t H = 32, I = 16, T = 53, total = 8;
  DeepseekRouting r;
  r.scoring = DeepseekConfig::Scoring::kSigmoid;
  r.group_limited = true;
  r.n_group = 4;
  r.topk_group = 2;
  r.top_k = 3;
  r.normalize = true;
  r.routed_scaling_factor = 2.5;
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 8}, {2, 3}, {6, 2}}) {
      DeepseekMoeWeights w;
      w.routed = testing::RandomExperts(total, first, count, H, I, dtype, 1.0 / 8);
      w.score_bias = torch::randn({total}) * 0.1;
      w.shared.gate_proj = (torch::randn({2 * I, H}) / 8).to(dtype);
      w.shared.up_proj = (torch::randn({2 * I, H}) / 8).to(dtype);
      w.shared.down_proj = (torch::randn({H, 2 * I}) / 8).to(dtype);
      const at::Tensor x = torch::randn({T, H}).to(dtype);
      auto [ids, weights] = DeepseekRoute(x, w.routed.router, w.score_bias, r);
      EXPECT_EQ(weights.scalar_type(), at::kFloat);
      const at::Tensor want = WeightedExpertsSum(x, w.routed, weights, ids);
      DeepseekMoeWeights stacked = w;
      ASSERT_TRUE(ExpertsStackable(stacked.routed));
      StackExperts(&stacked.routed);
      const std::string what = absl::StrCat(c10::toString(dtype), " experts [", first, ", ", first + count, ")");
      const at::Tensor got = GroupedExpertsSum(x, stacked.routed, weights, ids);
      EXPECT_TRUE(got.equal(want)) << what << ": max diff "
                                   << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
      EXPECT_TRUE(RoutedExpertsSum(x, stacked.routed, weights, ids).equal(want)) << what;
      EXPECT_TRUE(RoutedExpertsSum(x, w.routed, weights, ids).equal(want)) << what;
      const at::Tensor whole = DeepseekMoe(x, w, r);
      EXPECT_TRUE(DeepseekMoe(x, stacked, r, /*fused_activation=*/true).equal(whole)) << what;
      FuseGateUp(&stacked.shared);
      EXPECT_LE(RelInf(DeepseekMoe(x, stacked, r, true).to(at::kFloat), whole.to(at::kFloat)),
                dtype == at::kFloat ? 1e-6 : 1e-2)
          << what << ": the shared expert's gate and up fused";
    }
  }
}

// What DeepSeek's and GPT-OSS's startup lines say on the CPU under each
// backend: the fusion as configured, the kernels, fused attention, graphs
// and grouped GEMMs off with their reasons.
TEST(SglLayersTest, DeepseekAndGptOssTechniquesSayWhatRunsHere) {
  auto techniques = [](const std::string& name, const std::string& backend) {
    auto dir = ModelDir::Open(LoadGoldenCase(name).model_dir);
    EXPECT_TRUE(dir.ok()) << dir.status();
    ModelOptions o;
    EXPECT_TRUE(SetBackend(backend, &o).ok());
    auto m = LoadCausalLM(**dir, o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? (*m)->Techniques() : std::string();
  };
  const std::vector<std::pair<std::string, std::vector<const char*>>> cases = {
      {techniques("rand_deepseek_v3", "sgl"),
       {"gate-up fused", "custom kernels off (need CUDA", "fused attention off", "ATen GEMMs",
        "target argmax in the lm_head GEMM", "CUDA graphs off (not a CUDA device)",
        "experts by a loop in 3 of 3 MoE layers"}},
      {techniques("rand_deepseek_v3", "hf"),
       {"separate projections", "reference element-wise ops", "SDPA per sample", "ATen GEMMs",
        "target argmax from logits", "experts by a loop in 3 of 3 MoE layers"}},
      {techniques("rand_gpt_oss", "sgl"),
       {"qkv and expert gate-up fused", "custom kernels off (need CUDA",
        "eager sink attention per sample (sliding window 8 on 2 of 4 layers)", "target argmax in the lm_head GEMM",
        "CUDA graphs off (not a CUDA device)", "experts by a loop (clamped SwiGLU with biases) in 4 of 4"}},
      {techniques("rand_gpt_oss", "hf"),
       {"separate projections", "reference element-wise ops", "eager sink attention per sample",
        "target argmax from logits", "experts by a loop (clamped SwiGLU with biases) in 4 of 4"}},
  };
  for (const auto& [line, parts] : cases) {
    for (const char* part : parts) EXPECT_NE(line.find(part), std::string::npos) << line << "\nlacks: " << part;
  }
  EXPECT_EQ(cases[1].first.find("CUDA graphs"), std::string::npos) << "hf does not ask for graphs";
}

TEST(SglLayersTest, GemmOnCpuIsLinearPlusTheResidualOnBothPaths) {
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({2, 5, 16});
  const at::Tensor w = torch::randn({24, 16});
  const at::Tensor b = torch::randn({24});
  const at::Tensor r = torch::randn({2, 5, 24});
  const at::Tensor r_copy = r.clone();
  const int64_t lt_calls = LtGemmCalls();
  for (GemmPath path : {GemmPath::kAten, GemmPath::kCublasLt, GemmPath::kCublasLtTuned}) {
    EXPECT_TRUE(Gemm(x, w, at::Tensor(), at::Tensor(), path).equal(at::linear(x, w)));
    EXPECT_TRUE(Gemm(x, w, b, at::Tensor(), path).equal(at::linear(x, w, b)));
    // The residual is added as hf adds it (h + delta) and is not written.
    EXPECT_TRUE(Gemm(x, w, b, r, path).equal(r + at::linear(x, w, b)));
    EXPECT_TRUE(r.equal(r_copy));
  }
  EXPECT_EQ(LtGemmCalls(), lt_calls) << "cuBLASLt is for CUDA tensors only";
}

// On the CPU RowArgmax is its fallback (at::argmax); this pins the
// semantics the GPU kernel must reproduce (sgl_kernels_gpu_test checks it
// against at::argmax on the same cases): ties to the first index, the
// first NaN wins, an all -inf row gives 0, int32 output.
TEST(SglLayersTest, RowArgmaxFallbackPinsTiesAndNans) {
  at::Tensor logits = torch::randn({6, 40});
  logits[1].fill_(0.5);                                   // all tied: index 0
  logits[2][7] = 9;
  logits[2][30] = 9;                                       // tie: the first
  logits[3][11] = std::numeric_limits<float>::quiet_NaN();  // NaN wins
  logits[3][25] = std::numeric_limits<float>::quiet_NaN();
  logits[4].fill_(-std::numeric_limits<float>::infinity());
  const at::Tensor got = RowArgmax(logits, /*fused=*/true);
  EXPECT_EQ(got.scalar_type(), at::kInt);
  EXPECT_TRUE(got.equal(logits.argmax(-1).to(at::kInt)));
  EXPECT_EQ(got[1].item<int>(), 0);
  EXPECT_EQ(got[2].item<int>(), 7);
  EXPECT_EQ(got[3].item<int>(), 11);
}

// The argmax fused into the lm_head GEMM is a Hopper kernel: on the CPU
// (any dtype) it declines, and the model computes the logits and takes
// RowArgmax (SglBackendTest runs that path with argmax_in_gemm on).
TEST(SglLayersTest, LinearArgmaxDeclinesOffTheGpu) {
  const at::Tensor x = torch::randn({4, 16});
  const at::Tensor w = torch::randn({32, 16});
  EXPECT_FALSE(LinearArgmax(x, w).defined());
  EXPECT_FALSE(LinearArgmax(x.to(at::kBFloat16), w.to(at::kBFloat16)).defined());
}

// The FP8 candidate search needs FP8 tensor cores: off the GPU (any dtype)
// Prepare declines, and the model keeps the exact path.
TEST(SglLayersTest, Fp8HeadArgmaxDeclinesOffTheGpu) {
  EXPECT_EQ(Fp8HeadArgmax::Prepare(torch::randn({32, 16}).to(at::kBFloat16)), nullptr);
  EXPECT_EQ(Fp8HeadArgmax::Prepare(torch::randn({32, 16})), nullptr);
}

// The lm_head's chunks: about 1 GiB of logits by default; the FP8 search
// asks for 2 GiB, which holds an 8x1024 budget's bf16 scores at Llama-3's
// 128256-column vocab in one pass (fp8_head_argmax.cc). At least 256 rows,
// whole multiples where asked.
TEST(SglLayersTest, LmHeadChunksHoldTheirByteBudgetInWholeTiles) {
  const int64_t llama3_row = 2 * 128256;
  EXPECT_EQ(LmHeadChunkRows(llama3_row, 256), 4096);
  EXPECT_EQ(LmHeadChunkRows(llama3_row, 256, int64_t{2} << 30), 8192);
  EXPECT_EQ(LmHeadChunkRows(llama3_row), 4185);  // 2^30 / 256512, no tile rounding
  EXPECT_EQ(LmHeadChunkRows(int64_t{1} << 31, 256), 256) << "rows wider than the budget: the floor";
  EXPECT_EQ(LmHeadChunkRows(0, 8), int64_t{1} << 30) << "a zero row width counts as one byte";
}

// How batches map onto CUDA graphs' fixed shapes: uniform batches exactly,
// ragged ones padded to the token step with the padding as one extra
// sample, slots in eights and the longest-sample bound in 128s, so that
// near batches share one graph and no real token attends to padding.
TEST(SglLayersTest, GraphBatchPlanPadsRaggedBatchesIntoSharedBudgets) {
  const GraphBatchPlan uniform = PlanGraphBatch({0, 256, 512, 768, 1024}, 128);
  EXPECT_TRUE(uniform.uniform);
  EXPECT_EQ(uniform.tokens, 1024);
  EXPECT_EQ(uniform.max_seqlen, 256);
  EXPECT_EQ(uniform.cu_seqlens, (std::vector<int64_t>{0, 256, 512, 768, 1024}));
  EXPECT_EQ(uniform.key, "uniform 4x256");
  EXPECT_NE(PlanGraphBatch({0, 512, 1024}, 128).key, uniform.key);

  const GraphBatchPlan ragged = PlanGraphBatch({0, 100, 612, 700}, 128);
  EXPECT_FALSE(ragged.uniform);
  EXPECT_EQ(ragged.tokens, 768);
  EXPECT_EQ(ragged.max_seqlen, 512);
  EXPECT_EQ(ragged.cu_seqlens, (std::vector<int64_t>{0, 100, 612, 700, 768, 768, 768, 768, 768}));
  // Same budget: 700 tokens, longest 412 (bound 512), 3 samples.
  EXPECT_EQ(PlanGraphBatch({0, 200, 612, 700}, 128).key, ragged.key);
  // Another bound (300 -> 384), another token budget, more slots.
  EXPECT_NE(PlanGraphBatch({0, 300, 600, 700}, 128).key, ragged.key);
  EXPECT_NE(PlanGraphBatch({0, 100, 612, 800}, 128).key, ragged.key);
  std::vector<int64_t> nine_samples{0};
  for (int i = 0; i < 8; ++i) nine_samples.push_back(nine_samples.back() + 70 + i);
  nine_samples.push_back(700);
  const GraphBatchPlan many = PlanGraphBatch(nine_samples, 128);
  EXPECT_EQ(many.cu_seqlens.size(), 17u);  // 9 samples + padding: 16 slots
  EXPECT_EQ(many.cu_seqlens[9], 700);
  EXPECT_EQ(many.cu_seqlens[10], 768);

  // A batch already on the step keeps an empty padding sample.
  const GraphBatchPlan exact = PlanGraphBatch({0, 100, 256}, 128);
  EXPECT_EQ(exact.tokens, 256);
  EXPECT_EQ(exact.cu_seqlens, (std::vector<int64_t>{0, 100, 256, 256, 256, 256, 256, 256, 256}));
  // The padding sample can be the longest; the bound never passes the budget.
  const GraphBatchPlan small = PlanGraphBatch({0, 10, 30}, 128);
  EXPECT_EQ(small.tokens, 128);
  EXPECT_EQ(small.max_seqlen, 128);
  EXPECT_EQ(PlanGraphBatch({0, 10, 30}, 1).tokens, 30);
}

// Off the GPU no forward is captured: the graphs decline every batch, and
// an sgl model on the CPU (cuda_graphs on by SetBackend) runs eagerly.
TEST(SglLayersTest, ForwardGraphsDeclineOffTheGpu) {
  ModelOptions options;
  ASSERT_TRUE(SetBackend("sgl", &options).ok());
  EXPECT_TRUE(options.cuda_graphs);
  ForwardGraphs graphs(at::kCPU, 128, 8, /*min_host_share=*/0);
  auto batch = MakePackedBatch(torch::arange(6), {0, 2, 6}, 16, at::kCPU);
  ASSERT_TRUE(batch.ok());
  int runs = 0;
  auto run = [&](const PackedBatch&, const PackedLayout&, const ForwardOptions&) {
    ++runs;
    return ForwardOutput();
  };
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(graphs.Run(*batch, ForwardOptions(), run).has_value());
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(CudaGraphCaptures(), 0);
}

class SglBackendTest : public ::testing::TestWithParam<std::string> {};

// A micro-batch split is a sample boundary inside the batch (the TP leader
// sends it to every rank); one process ignores a valid one.
TEST(SglLayersTest, AMicroBatchSplitOutsideTheBatchIsRefused) {
  const auto c = LoadGoldenCase("rand_qwen2");  // 3 samples: 200, 13 and 90 tokens
  auto dir = ModelDir::Open(c.model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  ModelOptions options;
  ASSERT_TRUE(SetBackend("sgl", &options).ok());
  auto model = LoadCausalLM(**dir, options);
  ASSERT_TRUE(model.ok()) << model.status();
  auto batch = MakePackedBatch(c.tensors.at("input_ids").to(at::kLong), c.cu_seqlens, (*dir)->config().vocab_size,
                               options.device);
  ASSERT_TRUE(batch.ok());
  ForwardOptions fwd;
  fwd.micro_batch_split = 3;
  const auto refused = (*model)->Forward(*batch, fwd);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("micro_batch_split 3"), std::string::npos)
      << refused.status();
  fwd.micro_batch_split = 1;
  const auto whole = (*model)->Forward(*batch, fwd);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->last_hidden.size(0), batch->num_tokens());
}

TEST_P(SglBackendTest, MatchesTheReference) {
  const auto c = LoadGoldenCase(GetParam());
  auto dir = ModelDir::Open(c.model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  ForwardOutput out[2];
  for (int fused = 0; fused < 2; ++fused) {
    ModelOptions options;
    ASSERT_TRUE(SetBackend(fused == 1 ? "sgl" : "hf", &options).ok());
    auto model = LoadCausalLM(**dir, options);
    ASSERT_TRUE(model.ok()) << model.status();
    auto batch = MakePackedBatch(c.tensors.at("input_ids").to(at::kLong), c.cu_seqlens,
                                 (*dir)->config().vocab_size, options.device);
    ASSERT_TRUE(batch.ok());
    ForwardOptions fwd;
    fwd.aux_layer_ids = c.aux_layer_ids;
    fwd.return_argmax = true;
    auto o = (*model)->Forward(*batch, fwd);
    ASSERT_TRUE(o.ok()) << o.status();
    out[fused] = *o;
  }
  const double aux = RelInf(out[1].aux_hidden, out[0].aux_hidden);
  const double last = RelInf(out[1].last_hidden, out[0].last_hidden);
  std::printf("[%s] sgl vs hf, fp32: aux %.3g, last %.3g\n", c.name.c_str(), aux, last);
  EXPECT_LE(aux, 1e-5);
  EXPECT_LE(last, 1e-5);
  EXPECT_TRUE(out[1].target_argmax.equal(out[0].target_argmax));
}

INSTANTIATE_TEST_SUITE_P(Cases, SglBackendTest,
                         ::testing::Values("tiny_code_llama", "rand_llama3_gqa", "rand_yarn_mqa",
                                           "rand_linear_headdim", "rand_default_mha", "rand_qwen2", "rand_qwen3",
                                           "rand_qwen3_moe", "rand_deepseek_v3", "rand_deepseek_v2_lite",
                                           "rand_deepseek_v3_fp8", "rand_deepseek_v2_glg", "rand_gpt_oss",
                                           "rand_gpt_oss_mxfp4"));

}  // namespace
}  // namespace e3
