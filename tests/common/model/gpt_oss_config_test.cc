// GptOssForCausalLM's config.json: the Hub's layout (transformers 4.55's
// rope_scaling, quantization_config for the MXFP4 experts) and the one
// transformers 5.17 writes (the golden fixtures).
#include <gtest/gtest.h>

#include <string>

#include "common/model/model_config.h"

namespace e3 {
namespace {

// gpt-oss-20b's config.json as published, its 24 layer types elided into
// Layers().
std::string HubConfig(const std::string& layer_types, const std::string& quant_method = "mxfp4") {
  return R"({"architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": )" + layer_types + R"(, "max_position_embeddings": 131072, "model_type": "gpt_oss",
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
      "model.embed_tokens", "lm_head"], "quant_method": ")" + quant_method + R"("},
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
      "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088})";
}

std::string Layers(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    s += std::string(i ? ", " : "") + (i % 2 == 0 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  return s + "]";
}

TEST(GptOssConfigTest, ReadsTheHubConfig) {
  auto c = ParseModelConfig(HubConfig(Layers(24)), "gpt-oss-20b/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kGptOss);
  EXPECT_EQ(c->moe.num_experts, 32);
  EXPECT_EQ(c->moe.top_k, 4);
  EXPECT_EQ(c->moe.intermediate_size, 2880);
  EXPECT_TRUE(c->IsMoeLayer(0) && c->IsMoeLayer(23));
  EXPECT_TRUE(c->qkv_bias && c->o_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 128);
  ASSERT_EQ(c->gpt_oss.sliding_layers.size(), 24u);
  EXPECT_TRUE(c->gpt_oss.sliding_layers[0]);
  EXPECT_FALSE(c->gpt_oss.sliding_layers[1]);
  EXPECT_TRUE(c->gpt_oss.mxfp4_experts);
  EXPECT_DOUBLE_EQ(c->gpt_oss.swiglu_limit, 7.0);
  EXPECT_DOUBLE_EQ(c->gpt_oss.swiglu_alpha, 1.702);
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c->rope.theta, 150000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(c->rope.truncate);
  EXPECT_FALSE(c->rope.attention_factor.has_value());  // 0.1 ln(32) + 1, computed from factor
}

TEST(GptOssConfigTest, ReadsTheFixturesTransformers5Wrote) {
  const std::string dir = std::string(E3_SOURCE_DIR) + "/tests/fixtures/golden/";
  auto plain = LoadModelConfig(dir + "rand_gpt_oss/config.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->gpt_oss.mxfp4_experts);
  EXPECT_EQ(plain->gpt_oss.sliding_layers, (std::vector<bool>{true, false, true, false}));
  auto mxfp4 = LoadModelConfig(dir + "rand_gpt_oss_mxfp4/config.json");
  ASSERT_TRUE(mxfp4.ok()) << mxfp4.status();
  EXPECT_TRUE(mxfp4->gpt_oss.mxfp4_experts);
  EXPECT_EQ(mxfp4->gpt_oss.sliding_layers, (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(mxfp4->sliding_window, 8);
  EXPECT_FALSE(mxfp4->rope.truncate);
}

TEST(GptOssConfigTest, DefaultLayerTypesAlternateFromSliding) {
  std::string text = HubConfig(Layers(24));
  const size_t at = text.find("\"layer_types\"");
  text.erase(at, text.find(']', at) + 2 - at);
  auto c = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gpt_oss.sliding_layers[0]);
  EXPECT_FALSE(c->gpt_oss.sliding_layers[1]);
  EXPECT_TRUE(c->gpt_oss.sliding_layers[22]);
}

TEST(GptOssConfigTest, ErrorsNameTheFieldAndWhatWasExpected) {
  auto short_list = ParseModelConfig(HubConfig(Layers(3)), "m/config.json");
  ASSERT_FALSE(short_list.ok());
  EXPECT_NE(short_list.status().message().find("m/config.json: field \"layer_types\": expected a list of 24"),
            std::string::npos)
      << short_list.status();
  auto bad_kind = ParseModelConfig(HubConfig(R"(["sliding_attention", "chunked_attention")" +
                                             Layers(22).replace(0, 1, ", ")),
                                   "m/config.json");
  ASSERT_FALSE(bad_kind.ok());
  EXPECT_NE(bad_kind.status().message().find("entry 1"), std::string::npos) << bad_kind.status();
  auto fp8 = ParseModelConfig(HubConfig(Layers(24), "fp8"), "m/config.json");
  ASSERT_FALSE(fp8.ok());
  EXPECT_NE(fp8.status().message().find("field \"quantization_config.quant_method\": \"fp8\" is unsupported"),
            std::string::npos)
      << fp8.status();
}

}  // namespace
}  // namespace e3
