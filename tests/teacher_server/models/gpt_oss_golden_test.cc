// GptOssForCausalLM's hf backend against transformers 5.17 (fp32, eager,
// on the CPU), on two random configs (tests/golden/make_gpt_oss_golden.py):
// rand_gpt_oss, a bf16 checkpoint as save_pretrained writes it, and
// rand_gpt_oss_mxfp4, the experts as MXFP4 blocks and scales with the
// reference run on transformers' own dequantization of them. Both have
// attention sinks, a sliding window of 8 under samples of 37, 9 and 24
// tokens (the second with layer_types that do not alternate), YaRN rope
// (factor 32, truncate false), q/k/v/o biases and top-2-of-4 clamped
// SwiGLU experts with biases.
//
// Tolerance: 1e-4 relative (max abs error over the tensor's max abs), the
// bound of the other golden tests (decoder_golden_test.cc). Measured on the
// CPU machine (LibTorch 1.13, fp32), hf and sgl alike: bf16
// case aux 1.7e-6, last 2.1e-6, logits 2.0e-6; MXFP4 case aux 1.9e-6, last
// 2.0e-6, logits 1.8e-6. The experts' clamp bites on ~12% of gate/up values
// in these configs (the fixtures' meta), so both sides of it are exercised.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "common/model/model_dir.h"
#include "teacher_server/layers/kv_cache.h"
#include "teacher_server/layers/mxfp4.h"
#include "teacher_server/models/causal_lm.h"
#include "tests/e2e/subprocess.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/golden_forward.h"

namespace e3 {
namespace {

using testing::GoldenCase;
using testing::GoldenModel;
using testing::LoadGoldenCase;
using testing::RelInf;

constexpr double kGptOssRelTol = 1e-4;

GoldenModel LoadModel(const GoldenCase& c, const std::string& backend = "hf") {
  ModelOptions options;
  EXPECT_TRUE(SetBackend(backend, &options).ok());
  return testing::LoadGoldenModel(c, options);
}

struct Param {
  std::string name;
  std::string backend;  // sgl on the CPU: fused q/k/v with biases, rope in place
};

class GptOssGoldenTest : public ::testing::TestWithParam<Param> {};

TEST_P(GptOssGoldenTest, MatchesTransformersFp32) {
  const GoldenCase c = LoadGoldenCase(GetParam().name);
  const GoldenModel m = LoadModel(c, GetParam().backend);
  ASSERT_NE(m.model, nullptr);
  EXPECT_EQ(m.model->config().architecture, Architecture::kGptOss);
  auto out = testing::GoldenForward(*m.model, c, /*return_logits=*/true);
  ASSERT_TRUE(out.ok()) << out.status();
  testing::ExpectMatchesGolden(*out, c, kGptOssRelTol, c.name + " " + GetParam().backend);
  std::printf("[%s] %s\n", c.name.c_str(), m.model->Techniques().c_str());
}

INSTANTIATE_TEST_SUITE_P(Cases, GptOssGoldenTest,
                         ::testing::Values(Param{"rand_gpt_oss", "hf"}, Param{"rand_gpt_oss_mxfp4", "hf"},
                                           Param{"rand_gpt_oss", "sgl"}, Param{"rand_gpt_oss_mxfp4", "sgl"}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.name + "_" + info.param.backend;
                         });

// Our dequantization of layer 0's MXFP4 experts against transformers'
// (convert_moe_packed_tensors, stored by the generator in its [E, in, out]
// layout): bit for bit, since every value is exact in fp32 and bf16.
TEST(GptOssMxfp4Test, DequantizesAsTransformersDoes) {
  const GoldenCase c = LoadGoldenCase("rand_gpt_oss_mxfp4");
  auto dir = ModelDir::Open(c.model_dir);
  ASSERT_TRUE(dir.ok()) << dir.status();
  for (const std::string proj : {"gate_up_proj", "down_proj"}) {
    const std::string prefix = "model.layers.0.mlp.experts." + proj;
    auto blocks = (*dir)->Get(prefix + "_blocks");
    auto scales = (*dir)->Get(prefix + "_scales");
    ASSERT_TRUE(blocks.ok() && scales.ok()) << prefix;
    EXPECT_EQ(blocks->dtype, DType::kU8);
    auto ours = DequantizeMxfp4(*ViewToTensor(*blocks, at::kByte), *ViewToTensor(*scales, at::kByte), at::kFloat,
                                prefix);
    ASSERT_TRUE(ours.ok()) << ours.status();
    const at::Tensor theirs = c.tensors.at("ref.layer0." + proj).to(at::kFloat).transpose(1, 2);
    ASSERT_EQ(ours->sizes(), theirs.sizes()) << proj;
    EXPECT_TRUE(ours->equal(theirs)) << proj << ": max diff " << (*ours - theirs).abs().max().item<float>();
    auto bf16 = DequantizeMxfp4(*ViewToTensor(*blocks, at::kByte), *ViewToTensor(*scales, at::kByte),
                                at::kBFloat16, prefix);
    ASSERT_TRUE(bf16.ok());
    EXPECT_TRUE(bf16->to(at::kFloat).equal(theirs)) << proj << ": bf16 is not exact";
  }
}

// The nibble order and the scale bias on hand-made bytes: byte 0x2F holds
// code 15 (-6) in its low nibble, element 0, and code 2 (1.0) in its high
// nibble, element 1; scale byte 128 is 2^1, byte 0 the subnormal 2^-127,
// byte 255 NaN.
TEST(GptOssMxfp4Test, NibbleOrderAndScales) {
  at::Tensor blocks = torch::zeros({3, 1, kMxfp4BlockBytes}, at::kByte);
  blocks.index_put_({torch::indexing::Slice(), 0, 0}, 0x2F);
  const at::Tensor scales = torch::tensor({128, 0, 255}, at::kByte).view({3, 1});
  auto out = DequantizeMxfp4(blocks, scales, at::kFloat, "test");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->sizes(), (std::vector<int64_t>{3, kMxfp4BlockSize}));
  EXPECT_EQ((*out)[0][0].item<float>(), -12.0f);
  EXPECT_EQ((*out)[0][1].item<float>(), 2.0f);
  EXPECT_EQ((*out)[0][2].item<float>(), 0.0f);
  EXPECT_EQ((*out)[1][0].item<float>(), -6.0f * std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan((*out)[2][1].item<float>()));
  EXPECT_FALSE(DequantizeMxfp4(blocks, scales.view({3}), at::kFloat, "model.layers.0.x").ok());
  auto bad = DequantizeMxfp4(blocks.to(at::kFloat), scales, at::kFloat, "model.layers.0.x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.layers.0.x"), std::string::npos) << bad.status();
}

// Packed samples must not see each other: a sample's outputs are the same
// packed behind another (both longer than the window, so the sliding
// layers' masks are at work too), and a sample's first 8 positions are
// those of its first 8 tokens alone.
TEST(GptOssForwardTest, SamplesDoNotSeeEachOther) {
  const GoldenModel m = LoadModel(LoadGoldenCase("rand_gpt_oss"));
  ASSERT_NE(m.model, nullptr);
  CausalLM* model = m.model.get();
  std::vector<int32_t> a(30), b(21);
  for (int i = 0; i < 30; ++i) a[i] = (i * 37 + 5) % 128;
  for (int i = 0; i < 21; ++i) b[i] = (i * 11 + 3) % 128;
  ForwardOptions fwd;
  fwd.aux_layer_ids = {0, 1, 2, 3};
  auto packed = model->Forward(*PackSamples({a, b}, 128, at::kCPU), fwd);
  auto alone_b = model->Forward(*PackSamples({b}, 128, at::kCPU), fwd);
  auto head_a = model->Forward(*PackSamples({std::vector<int32_t>(a.begin(), a.begin() + 8)}, 128, at::kCPU), fwd);
  ASSERT_TRUE(packed.ok() && alone_b.ok() && head_a.ok());
  EXPECT_TRUE(torch::allclose(packed->aux_hidden.narrow(0, 30, 21), alone_b->aux_hidden, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(packed->last_hidden.narrow(0, 30, 21), alone_b->last_hidden, 1e-5, 1e-6));
  EXPECT_TRUE(packed->target_argmax.narrow(0, 30, 21).equal(alone_b->target_argmax));
  EXPECT_TRUE(torch::allclose(packed->last_hidden.narrow(0, 0, 8), head_a->last_hidden, 1e-5, 1e-6));
}

// A window that truly drops keys: a copy of the model whose config widens
// the window to 64 gives the same first 8 positions (all inside either
// window) and different later ones.
TEST(GptOssForwardTest, TheWindowDropsKeys) {
  const GoldenCase c = LoadGoldenCase("rand_gpt_oss");
  const std::string wide_dir = testing::ScratchDir("gpt_oss_wide_window");
  nlohmann::json config = nlohmann::json::parse(testing::ReadFile(c.model_dir + "/config.json"));
  ASSERT_EQ(config.at("sliding_window").get<int>(), 8);
  config["sliding_window"] = 64;
  std::ofstream(wide_dir + "/config.json") << config.dump();
  ASSERT_EQ(::symlink((c.model_dir + "/model.safetensors").c_str(), (wide_dir + "/model.safetensors").c_str()), 0);
  std::vector<int32_t> a(20);
  for (int i = 0; i < 20; ++i) a[i] = (i * 29 + 7) % 128;
  std::vector<at::Tensor> last;
  for (const std::string& path : {c.model_dir, wide_dir}) {
    auto dir = ModelDir::Open(path);
    ASSERT_TRUE(dir.ok()) << dir.status();
    auto model = LoadCausalLM(**dir, ModelOptions{});
    ASSERT_TRUE(model.ok()) << model.status();
    auto out = (*model)->Forward(*PackSamples({a}, 128, at::kCPU), ForwardOptions{});
    ASSERT_TRUE(out.ok()) << out.status();
    last.push_back(out->last_hidden);
  }
  // Equal up to rounding: the two windows run the attention in different
  // shapes, and LibTorch's CPU kernels (BLIS on Debian, MKL in pip's
  // builds) round those differently. Same bound as against transformers.
  EXPECT_LT(RelInf(last[1].narrow(0, 0, 8), last[0].narrow(0, 0, 8)), kGptOssRelTol);
  EXPECT_FALSE(torch::allclose(last[0].narrow(0, 8, 12), last[1].narrow(0, 8, 12), 1e-3, 1e-3));
}

// A config that announces MXFP4 experts over a checkpoint without them is
// an error naming the directory and the tensor it lacks.
TEST(GptOssForwardTest, Mxfp4ConfigWithoutBlocksNamesTheMissingTensor) {
  const GoldenCase c = LoadGoldenCase("rand_gpt_oss");
  const std::string dir = testing::ScratchDir("gpt_oss_no_blocks");
  nlohmann::json config = nlohmann::json::parse(testing::ReadFile(c.model_dir + "/config.json"));
  config["quantization_config"] = {{"quant_method", "mxfp4"}};
  std::ofstream(dir + "/config.json") << config.dump();
  ASSERT_EQ(::symlink((c.model_dir + "/model.safetensors").c_str(), (dir + "/model.safetensors").c_str()), 0);
  auto opened = ModelDir::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto model = LoadCausalLM(**opened, ModelOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("model.layers.0.mlp.experts.gate_up_proj_blocks"), std::string::npos)
      << model.status();
}

// A forward of several tokens on a cached prefix longer than the window
// gives the hidden states of the whole sequence in one plain forward
// (generation_test.cc checks greedy decoding token by token).
TEST(GptOssForwardTest, ACachedPrefixMatchesTheWholeSequence) {
  const GoldenModel m = LoadModel(LoadGoldenCase("rand_gpt_oss"));
  ASSERT_NE(m.model, nullptr);
  CausalLM* model = m.model.get();
  const ModelConfig& cfg = model->config();
  std::vector<int32_t> ids(23);
  for (int i = 0; i < 23; ++i) ids[i] = (i * 53 + 9) % 128;
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 13), rest(ids.begin() + 13, ids.end());
  KvCache cache(cfg.num_hidden_layers, 1, 32, cfg.num_key_value_heads, cfg.head_dim, at::TensorOptions());
  ForwardOptions fwd;
  fwd.aux_layer_ids = {0, 1, 2};
  fwd.kv_cache = &cache;
  for (const auto& part : {prefix, rest}) {
    ASSERT_TRUE(cache.BeginAppend({0}, {0, static_cast<int64_t>(part.size())}).ok());
    auto batch = PackSamples({part}, 128, at::kCPU);
    ASSERT_TRUE(batch.ok());
    // Positions continue after the cached prefix.
    batch->position_ids = batch->position_ids + (part.size() == rest.size() ? 13 : 0);
    auto out = model->Forward(*batch, fwd);
    ASSERT_TRUE(out.ok()) << out.status();
    cache.CommitAppend();
    if (part.size() != rest.size()) continue;
    fwd.kv_cache = nullptr;
    auto whole = model->Forward(*PackSamples({ids}, 128, at::kCPU), fwd);
    ASSERT_TRUE(whole.ok()) << whole.status();
    // Up to rounding (the cached keys meet the new queries in other shapes).
    EXPECT_LT(RelInf(out->aux_hidden, whole->aux_hidden.narrow(0, 13, 10)), kGptOssRelTol);
    EXPECT_TRUE(out->target_argmax.equal(whole->target_argmax.narrow(0, 13, 10)));
  }
}

}  // namespace
}  // namespace e3
