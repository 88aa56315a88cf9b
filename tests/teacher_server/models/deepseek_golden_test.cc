// The hf backend's DeepSeek family against HF transformers 5.17 (fp32,
// eager attention) on three random-weight models (tests/golden/
// make_deepseek_golden.py): a V3-like one (q_lora, sigmoid routing with
// e_score_correction_bias over 4 groups of which 2 are kept, a shared
// expert, a dense first layer, YaRN with mscale_all_dim, interleaved rope;
// bf16 weights with the bias in fp32), a V2-Lite-like one (plain q_proj,
// softmax greedy routing, two shared experts, YaRN with mscale 0.707; fp32
// weights), and a V3 whose projections are float8_e4m3fn with block scales
// (16 x 32 blocks, several per weight, partial ones at the edges), checked
// against HF run on exactly the dequantized weights; and a V2 with q_lora
// and V2's own routing (softmax scores, group_limited_greedy over 4
// groups keeping 2, routed scaling 16, no renormalisation; bf16).
//
// Tolerance: 1e-4 relative (max abs error over the tensor's max abs), the
// Llama goldens' bound. Measured on the CPU machine (LibTorch 1.13,
// fp32), worst over both attention kernels, aux / last / logits:
// rand_deepseek_v3 5.2e-7 / 7.4e-7 / 8.2e-7, rand_deepseek_v2_lite
// 5.5e-7 / 6.1e-7 / 7.2e-7, rand_deepseek_v3_fp8 4.6e-7 / 7.4e-7 / 7.5e-7.
// The cases are sensitive where it matters: routing without
// e_score_correction_bias moves the V3 outputs by 0.2-0.5 relative, and
// V3's rope on rotate_half's layout instead of the interleaved one by
// 0.2-0.7; rand_deepseek_v2_glg (1.2e-6 / 1.5e-6 / 1.8e-6) routed by
// plain greedy top-k instead moves by 0.73-0.82.
#include <gtest/gtest.h>

#include <string>

#include "common/model/model_dir.h"
#include "teacher_server/layers/deepseek_moe.h"
#include "teacher_server/layers/mla_attention.h"
#include "teacher_server/models/causal_lm.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/golden_forward.h"

namespace e3 {
namespace {

using testing::GoldenCase;
using testing::GoldenModel;
using testing::KernelCase;
using testing::LoadGoldenCase;

constexpr double kDeepseekRelTol = 1e-4;

class DeepseekGoldenTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(DeepseekGoldenTest, MatchesTransformersFp32) {
  const GoldenCase c = LoadGoldenCase(GetParam().name);
  const GoldenModel m = testing::LoadGoldenModel(c, testing::ReferenceOptions(GetParam().kernel));
  ASSERT_NE(m.model, nullptr);
  const ModelConfig& config = m.dir->config();
  // The config arithmetic against what transformers computed.
  EXPECT_NEAR(config.deepseek.softmax_scale, c.meta.at("hf_softmax_scale").get<double>(), 1e-12);
  const auto mlp_types = c.meta.at("hf_mlp_types").get<std::vector<std::string>>();
  ASSERT_EQ(static_cast<int64_t>(mlp_types.size()), config.num_hidden_layers);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const bool hf_moe = mlp_types[i].find("Mo") != std::string::npos;
    EXPECT_EQ(config.IsMoeLayer(i), hf_moe) << "layer " << i << ": " << mlp_types[i];
  }
  EXPECT_EQ(config.quantization.fp8_block, !c.meta.at("fp8_block").is_null());

  auto out = testing::GoldenForward(*m.model, c, /*return_logits=*/true);
  ASSERT_TRUE(out.ok()) << out.status();
  testing::ExpectMatchesGolden(*out, c, kDeepseekRelTol, c.name);

  // The argmax alone (no logits), as the server asks for it.
  auto alone = testing::GoldenForward(*m.model, c, /*return_logits=*/false);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_TRUE(alone->target_argmax.equal(out->target_argmax));
}

INSTANTIATE_TEST_SUITE_P(Cases, DeepseekGoldenTest,
                         ::testing::ValuesIn(testing::EagerAndSdpa(
                             {"rand_deepseek_v3", "rand_deepseek_v2_lite", "rand_deepseek_v3_fp8",
                              "rand_deepseek_v2_glg"})),
                         testing::KernelCaseName);

TEST(DeepseekForwardTest, SamplesDoNotSeeEachOtherAndBadAuxIdsAreRefused) {
  const GoldenModel m = testing::LoadGoldenModel(LoadGoldenCase("rand_deepseek_v3"), ModelOptions{});
  ASSERT_NE(m.model, nullptr);
  const std::vector<int32_t> a = {5, 9, 17, 3, 200, 44, 1};
  testing::ExpectPackedLikeAlone(*m.model, a, {8, 8, 8, 100}, {0, 3}, 256);

  ForwardOptions fwd;
  fwd.aux_layer_ids = {4};
  auto bad = m.model->Forward(*PackSamples({a}, 256, at::kCPU), fwd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("aux layer id 4"), std::string::npos) << bad.status();
  EXPECT_NE(m.model->Techniques().find("experts by a loop"), std::string::npos) << m.model->Techniques();
}

// --backend=sgl (fused gate-up, grouped experts, the add+norm and SiLU-mul
// steps, varlen attention) stays within the goldens' bound (here on the
// CPU, where the kernels fall back to their reference ops and the varlen
// request to SDPA with v padded and cut).
TEST(DeepseekForwardTest, SglBackendKeepsTheReferenceNumerics) {
  const GoldenCase c = LoadGoldenCase("rand_deepseek_v3_fp8");
  ModelOptions options;
  ASSERT_TRUE(SetBackend("sgl", &options).ok());
  const GoldenModel m = testing::LoadGoldenModel(c, options);
  ASSERT_NE(m.model, nullptr);
  std::printf("techniques: %s\n", m.model->Techniques().c_str());
  EXPECT_NE(m.model->Techniques().find("FP8 block-scaled weights dequantized at load"), std::string::npos);
  auto out = testing::GoldenForward(*m.model, c, /*return_logits=*/false);
  ASSERT_TRUE(out.ok()) << out.status();
  testing::ExpectMatchesGolden(*out, c, kDeepseekRelTol, c.name + " sgl");
}

// The official DeepSeek-V3 config.json (transformers 4.x layout: rope_scaling
// with "type", the FP8 quantization_config, num_key_value_heads 128).
constexpr char kDeepseekV3Config[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
  "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
  "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
  "routed_scaling_factor": 2.5, "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
  "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
  "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000, "hidden_act": "silu",
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1})";

TEST(DeepseekConfigTest, ReadsTheOfficialV3Config) {
  auto c = ParseModelConfig(kDeepseekV3Config, "v3/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kDeepseekV3);
  EXPECT_EQ(c->num_key_value_heads, 128);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->rotary_dim(), 64);
  EXPECT_EQ(c->deepseek.q_lora_rank, 1536);
  EXPECT_TRUE(c->deepseek.rope_interleave);
  EXPECT_EQ(c->deepseek.scoring, DeepseekConfig::Scoring::kSigmoid);
  EXPECT_TRUE(c->deepseek.group_limited);
  EXPECT_EQ(c->moe.num_experts, 256);
  EXPECT_EQ(c->moe.intermediate_size, 2048);
  EXPECT_FALSE(c->IsMoeLayer(2));
  EXPECT_TRUE(c->IsMoeLayer(3));
  EXPECT_TRUE(c->quantization.fp8_block);
  EXPECT_EQ(c->quantization.block_rows, 128);
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_EQ(c->rope.factor, 40.0);
  // 192^-0.5 * (0.1 * ln 40 + 1)^2
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->deepseek.softmax_scale, m * m / std::sqrt(192.0), 1e-15);
  EXPECT_EQ(c->DefaultAuxLayerIds(), (std::vector<int32_t>{1, 29, 57}));
}

TEST(DeepseekConfigTest, ErrorsNameTheField) {
  auto with = [](const std::string& key, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(kDeepseekV3Config);
    j[key] = nlohmann::json::parse(value);
    return ParseModelConfig(j.dump(), "m/config.json");
  };
  auto expect_error = [](const absl::StatusOr<ModelConfig>& c, const std::string& field) {
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_NE(c.status().message().find("m/config.json"), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status();
  };
  expect_error(with("n_group", "3"), "\"n_group\"");              // 256 experts do not split in 3
  expect_error(with("topk_group", "9"), "\"topk_group\"");        // more groups than there are
  expect_error(with("num_experts_per_tok", "200"), "num_experts_per_tok");  // more than 4 groups of 32 hold
  expect_error(with("qk_rope_head_dim", "63"), "qk_rope_head_dim");
  expect_error(with("kv_lora_rank", "null"), "kv_lora_rank");
  expect_error(with("quantization_config", R"({"quant_method": "awq"})"), "quantization_config.quant_method");
  expect_error(with("quantization_config", R"({"quant_method": "fp8", "weight_block_size": [128]})"),
               "quantization_config.weight_block_size");
  nlohmann::json v2 = nlohmann::json::parse(kDeepseekV3Config);
  v2["architectures"] = {"DeepseekV2ForCausalLM"};
  v2["topk_method"] = "noaux_tc";
  expect_error(ParseModelConfig(v2.dump(), "m/config.json"), "topk_method");
  v2["topk_method"] = "group_limited_greedy";
  v2["q_lora_rank"] = nullptr;
  auto ok = ParseModelConfig(v2.dump(), "m/config.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->deepseek.q_lora_rank, 0);
  EXPECT_EQ(ok->deepseek.scoring, DeepseekConfig::Scoring::kSoftmax);
  EXPECT_TRUE(ok->deepseek.group_limited);
}

// V2's group_limited_greedy (not in the goldens: transformers' V2-Lite
// config uses greedy): groups ranked by their best softmax score.
TEST(DeepseekRouteTest, GroupLimitedGreedyKeepsTheBestGroups) {
  // One token, H = 1: the logits are the router's column. 4 experts in 2
  // groups {0,1} {2,3}; one group kept, top-2 inside it.
  const at::Tensor x = torch::ones({1, 1});
  const at::Tensor router = torch::tensor({{3.0f}, {0.0f}, {2.9f}, {2.8f}});  // [E, H]
  DeepseekRouting r;
  r.scoring = DeepseekConfig::Scoring::kSoftmax;
  r.group_limited = true;
  r.n_group = 2;
  r.topk_group = 1;
  r.top_k = 2;
  r.routed_scaling_factor = 2.0;
  auto [ids, weights] = DeepseekRoute(x, router, at::Tensor(), r);
  // Group {0,1}'s best (3.0) beats {2,3}'s (2.9): experts 0 and 1, not 2,
  // the second best overall.
  EXPECT_TRUE(std::get<0>(ids.sort(-1)).equal(torch::tensor({{0, 1}}, at::kLong))) << ids;
  const at::Tensor probs = at::softmax(router.t(), -1);
  EXPECT_NEAR(weights.sum().item<double>(), 2.0 * (probs[0][0].item<double>() + probs[0][1].item<double>()), 1e-6);
  // Greedy takes 0 and 2.
  r.group_limited = false;
  auto greedy = DeepseekRoute(x, router, at::Tensor(), r);
  EXPECT_TRUE(std::get<0>(greedy.first.sort(-1)).equal(torch::tensor({{0, 2}}, at::kLong))) << greedy.first;
}

// V3's router: the bias steers the choice but not the weights; groups
// ranked by their best two biased scores, losers masked to -inf.
TEST(DeepseekRouteTest, V3BiasChoosesUnbiasedScoresWeigh) {
  const at::Tensor logits = torch::tensor({{2.0f, 1.0f, 0.5f, 0.4f}});
  const at::Tensor x = torch::ones({1, 1});
  const at::Tensor router = logits.t().contiguous();  // [E=4, H=1]
  DeepseekRouting r;
  r.n_group = 2;
  r.topk_group = 1;
  r.top_k = 1;
  r.normalize = true;
  r.routed_scaling_factor = 2.5;
  // Sigmoid scores ~[0.88, 0.73, 0.62, 0.60]; a bias of +0.7 on expert 2
  // makes group {2,3} sum to 1.92 > 1.61 and expert 2 the choice.
  const at::Tensor bias = torch::tensor({0.f, 0.f, 0.7f, 0.f});
  auto [ids, weights] = DeepseekRoute(x, router, bias, r);
  EXPECT_EQ(ids.item<int64_t>(), 2);
  EXPECT_NEAR(weights.item<double>(), 2.5, 1e-6);  // renormalised over one expert, then scaled
  r.normalize = false;
  auto unnormed = DeepseekRoute(x, router, bias, r);
  EXPECT_NEAR(unnormed.second.item<double>(), 2.5 / (1.0 + std::exp(-0.5)), 1e-6);  // sigmoid(0.5), unbiased
  auto no_bias = DeepseekRoute(x, router, torch::zeros({4}), r);
  EXPECT_EQ(no_bias.first.item<int64_t>(), 0);
}

// The three rope layouts rotate the same pairs by the same angles: V3's
// interleaved form equals V2's complex form with the output de-interleaved.
TEST(MlaRopeTest, InterleavedLayoutsAgree) {
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({5, 2, 8});
  const at::Tensor angles = torch::arange(5, at::kFloat).unsqueeze(1) * torch::tensor({1.0f, 0.5f, 0.1f, 0.01f});
  const at::Tensor cos = torch::cat({angles.cos(), angles.cos()}, -1), sin = torch::cat({angles.sin(), angles.sin()}, -1);
  const at::Tensor v3 = ApplyMlaRope(x, cos, sin, MlaRope::kInterleaved);
  const at::Tensor v2 = ApplyMlaRope(x, cos, sin, MlaRope::kComplexPairs);
  const at::Tensor v2_halves = torch::cat({v2.slice(-1, 0, 8, 2), v2.slice(-1, 1, 8, 2)}, -1);
  EXPECT_TRUE(torch::allclose(v3, v2_halves, 1e-6, 1e-6));
  // rotate_half on the de-interleaved input is the same rotation.
  const at::Tensor halves_in = torch::cat({x.slice(-1, 0, 8, 2), x.slice(-1, 1, 8, 2)}, -1);
  EXPECT_TRUE(torch::allclose(v3, ApplyMlaRope(halves_in, cos, sin, MlaRope::kHalves), 1e-6, 1e-6));
  // Position 0 is the identity.
  EXPECT_TRUE(torch::allclose(v3[0], halves_in[0]));
}

}  // namespace
}  // namespace e3
