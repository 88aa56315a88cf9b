#include "common/model/model_config.h"

#include <gtest/gtest.h>

#include <string>

namespace e3 {
namespace {

const std::string kBase = R"("architectures": ["LlamaForCausalLM"], "hidden_size": 64,
  "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4,
  "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
  "max_position_embeddings": 4096)";

absl::StatusOr<ModelConfig> ParseConfig(const std::string& extra) {
  return ParseModelConfig("{" + kBase + (extra.empty() ? "" : ", " + extra) + "}", "test/config.json");
}

TEST(ModelConfigTest, ReadsTheBundledModel) {
  auto c = LoadModelConfig(std::string(E3_SOURCE_DIR) + "/examples/tiny-code-llama/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->num_hidden_layers, 8);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->vocab_size, 8192);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope.type, RopeType::kDefault);  // transformers 5 rope_parameters
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->DefaultAuxLayerIds(), (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{4}));
}

TEST(ModelConfigTest, DefaultsAndDerivedFields) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  auto mha = ParseModelConfig(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10})",
                              "x");
  ASSERT_TRUE(mha.ok());
  EXPECT_EQ(mha->num_key_value_heads, 4);  // absent means MHA
}

TEST(ModelConfigTest, OldStyleRopeThetaAndScaling) {
  auto c = ParseConfig(R"("rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
  // The pre-4.4x spelling "type" and a null rope_scaling.
  auto linear = ParseConfig(R"("rope_scaling": {"type": "linear", "factor": 2.0})");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->rope.type, RopeType::kLinear);
  auto none = ParseConfig(R"("rope_theta": 1000.0, "rope_scaling": null)");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(none->rope.theta, 1000.0);
}

TEST(ModelConfigTest, NewStyleRopeParametersYarn) {
  auto c = ParseConfig(R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
      "original_max_position_embeddings": 1024, "beta_fast": 16, "mscale": 1.0, "mscale_all_dim": 0.5})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c->rope.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(c->rope.beta_slow, 1.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 1024);
  EXPECT_FALSE(c->rope.attention_factor.has_value());
  ASSERT_TRUE(c->rope.mscale_all_dim.has_value());
  // No factor: implied by the context ratio, as transformers does.
  auto implied = ParseConfig(R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0,
      "original_max_position_embeddings": 1024})");
  ASSERT_TRUE(implied.ok());
  EXPECT_DOUBLE_EQ(implied->rope.factor, 4.0);
}

TEST(ModelConfigTest, ErrorsNameTheFileAndField) {
  struct Case {
    std::string json;
    std::string fragment;
  };
  std::vector<Case> cases = {
      {R"({"architectures": ["GPT2LMHeadModel"], "hidden_size": 8})", "unknown architecture \"GPT2LMHeadModel\""},
      {R"({"hidden_size": 8})", "\"architectures\""},
      {"{" + kBase + R"(, "hidden_size": "64"})", "field \"hidden_size\": expected an integer"},
      {R"({"architectures": ["LlamaForCausalLM"], "intermediate_size": 1, "num_hidden_layers": 1,
           "num_attention_heads": 1, "vocab_size": 1})",
       "field \"hidden_size\": required integer is missing"},
      {"{" + kBase + R"(, "num_key_value_heads": 3})", "num_key_value_heads"},
      {"{" + kBase + R"(, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})",
       "rope_parameters.rope_type\": unsupported rope type \"dynamic\""},
      {"{" + kBase + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})",
       "rope_scaling.low_freq_factor\": required number is missing"},
      {"{" + kBase + R"(, "rope_parameters": "yarn"})",
       "field \"rope_parameters\": expected an object (rope_type, rope_theta, ...) or null, got string"},
      {"{" + kBase + R"(, "rope_parameters": [1, 2]})", "field \"rope_parameters\": expected an object"},
      {"{" + kBase + R"(, "hidden_act": "gelu"})", "hidden_act"},
      {"{" + kBase + R"(, "tie_word_embeddings": "yes"})", "tie_word_embeddings"},
      // Sizes are bounded: a config also comes from a teacher's GetInfo.
      {"{" + kBase + R"(, "hidden_size": 2097152})",
       "field \"hidden_size\": expected an integer in [1, 1048576], got 2097152"},
      {"{" + kBase + R"(, "vocab_size": 2147483648})", "field \"vocab_size\": expected an integer in [1, 2147483647]"},
      {"{" + kBase + R"(, "max_position_embeddings": 0})",
       "field \"max_position_embeddings\": expected an integer in [1, 2147483647], got 0"},
      {"not json", "not a JSON object"},
  };
  for (const auto& c : cases) {
    auto got = ParseModelConfig(c.json, "dir/config.json");
    ASSERT_FALSE(got.ok()) << c.json;
    EXPECT_NE(got.status().message().find("dir/config.json"), std::string::npos) << got.status();
    EXPECT_NE(got.status().message().find(c.fragment), std::string::npos) << got.status();
  }
  EXPECT_EQ(LoadModelConfig("/nonexistent/config.json").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace e3
