// Greedy generation with the KV cache against generation without one: the
// same tokens as re-running the whole prefix through a plain forward and
// taking its last argmax, on small real models of several architectures
// (GQA and llama3 rope, Qwen3's q/k norms, MQA with yarn, Mixtral's
// experts, GPT-OSS's sinks and windows, DeepSeek's latent attention), with prompts of different lengths decoded together, prefill
// split over several forwards and a last group smaller than the others.
// Also: a cached forward of several tokens at once (the per-sample path)
// gives the hidden states a plain forward of the whole sequence gives, and
// the cache refuses what would not fit.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/model/model_dir.h"
#include "common/torch/torch_core.h"
#include "teacher_server/layers/kv_cache.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/runtime/generation.h"
#include "tests/teacher_server/golden_fixture.h"

namespace e3 {
namespace {

std::unique_ptr<CausalLM> LoadFixture(const std::string& name) {
  auto dir = ModelDir::Open(testing::SourcePath("tests/fixtures/golden/" + name));
  EXPECT_TRUE(dir.ok()) << dir.status();
  auto model = LoadCausalLM(**dir, ModelOptions{});
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

// Greedy decoding the slow way: the whole sequence through a plain
// forward at every step.
std::vector<int32_t> GreedyByRecompute(CausalLM& model, std::vector<int32_t> ids, int64_t max_new,
                                       const std::set<int32_t>& stop) {
  std::vector<int32_t> out;
  for (int64_t step = 0; step < max_new; ++step) {
    auto batch = PackSamples({ids}, model.config().vocab_size, at::kCPU);
    EXPECT_TRUE(batch.ok()) << batch.status();
    auto fwd = model.Forward(*batch, ForwardOptions{});
    EXPECT_TRUE(fwd.ok()) << fwd.status();
    const int32_t next = fwd->target_argmax[-1].item<int32_t>();
    out.push_back(next);
    ids.push_back(next);
    if (stop.count(next)) break;
  }
  return out;
}

std::vector<std::vector<int32_t>> Prompts(int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int64_t> lengths = {5, 1, 12, 7, 3};
  int32_t x = 11;
  for (int64_t n : lengths) {
    std::vector<int32_t> p;
    for (int64_t i = 0; i < n; ++i) p.push_back((x = (x * 37 + 5) % static_cast<int32_t>(vocab)));
    prompts.push_back(p);
  }
  return prompts;
}

class GenerationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerationTest, KvCacheGreedyEqualsRecomputingThePrefix) {
  auto model = LoadFixture(GetParam());
  const auto prompts = Prompts(model->config().vocab_size);
  // A stop id the recompute path will meet in some sequence: its third
  // token of the first prompt.
  const std::vector<int32_t> probe = GreedyByRecompute(*model, prompts[0], 3, {});
  GenerationOptions g;
  g.max_new_tokens = 9;
  g.stop_ids = {probe.back()};
  g.max_sequences = 2;   // groups of 2, 2, 1
  g.prefill_tokens = 6;  // prefill over several forwards
  std::vector<std::pair<int64_t, int64_t>> progress;
  int64_t reported_tokens = 0;
  g.on_progress = [&](int64_t done, int64_t total, int64_t tokens) {
    progress.emplace_back(done, total);
    reported_tokens = tokens;
  };
  auto got = GenerateContinuations(*model, prompts, g);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), prompts.size());
  const std::set<int32_t> stop(g.stop_ids.begin(), g.stop_ids.end());
  for (size_t s = 0; s < prompts.size(); ++s) {
    EXPECT_EQ((*got)[s], GreedyByRecompute(*model, prompts[s], g.max_new_tokens, stop)) << "prompt " << s;
  }
  EXPECT_LE((*got)[0].size(), 3u);  // stopped at the stop id, which it keeps
  EXPECT_EQ((*got)[0].back(), probe.back());
  EXPECT_EQ(progress, (std::vector<std::pair<int64_t, int64_t>>{{2, 5}, {4, 5}, {5, 5}}));
  int64_t generated = 0;
  for (const auto& c : *got) generated += static_cast<int64_t>(c.size());
  EXPECT_EQ(reported_tokens, generated);
}

// Prompts are grouped by length under the KV cache's byte cap: lengths
// {5, 1, 12, 7, 3} sorted are 1, 3, 5, 7, 12; with room for 22 cached
// positions per group (each sequence sized for the group's longest prompt
// plus 4 new tokens) the groups are {1, 3}, {5, 7} and {12}, and every
// prompt still gets its own greedy continuation, in its own place.
TEST(GenerationGroupsTest, KvCacheBytesCapTheGroupsOfSimilarLength) {
  auto model = LoadFixture("rand_llama3_gqa");
  const ModelConfig& c = model->config();
  const auto prompts = Prompts(c.vocab_size);
  const int64_t row_bytes = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim *
                            static_cast<int64_t>(c10::elementSize(model->options().dtype));
  GenerationOptions g;
  g.max_new_tokens = 4;
  g.max_sequences = 8;
  g.kv_cache_bytes = 22 * row_bytes;
  std::vector<std::pair<int64_t, int64_t>> progress;
  g.on_progress = [&](int64_t done, int64_t total, int64_t) { progress.emplace_back(done, total); };
  auto got = GenerateContinuations(*model, prompts, g);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(progress, (std::vector<std::pair<int64_t, int64_t>>{{2, 5}, {4, 5}, {5, 5}}));
  for (size_t s = 0; s < prompts.size(); ++s) {
    EXPECT_EQ((*got)[s], GreedyByRecompute(*model, prompts[s], g.max_new_tokens, {})) << "prompt " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GenerationTest,
                         ::testing::Values("rand_default_mha", "rand_llama3_gqa", "rand_qwen3", "rand_yarn_mqa",
                                           "rand_mixtral",
                                           // sinks and a window of 8 under prompts of up to 12 tokens
                                           // plus 9 new ones: the cached keys leave the window
                                           "rand_gpt_oss", "rand_gpt_oss_mxfp4",
                                           // multi-head latent attention: expanded keys cached,
                                           // values padded to their head dim (V3, V2-Lite, FP8)
                                           "rand_deepseek_v3", "rand_deepseek_v2_lite", "rand_deepseek_v3_fp8"));

TEST(KvCacheTest, SeveralTokensOnACachedPrefixMatchTheWholeSequence) {
  auto model = LoadFixture("rand_llama3_gqa");
  const ModelConfig& c = model->config();
  const std::vector<int32_t> a = {4, 9, 33, 2, 71}, b = {8, 15}, more = {19, 5, 60};
  KvCache cache(c.num_hidden_layers, 2, 16, c.num_key_value_heads, c.head_dim, torch::TensorOptions());
  auto forward = [&](const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& toks) {
    auto batch = PackSamples(toks, c.vocab_size, at::kCPU);
    EXPECT_TRUE(batch.ok());
    std::vector<int64_t> pos;
    for (size_t s = 0; s < seqs.size(); ++s)
      for (size_t i = 0; i < toks[s].size(); ++i) pos.push_back(cache.lengths()[seqs[s]] + static_cast<int64_t>(i));
    batch->position_ids = torch::tensor(pos, torch::kLong);
    EXPECT_TRUE(cache.BeginAppend(seqs, batch->cu_seqlens).ok());
    ForwardOptions fwd;
    fwd.kv_cache = &cache;
    auto out = model->Forward(*batch, fwd);
    cache.CommitAppend();
    EXPECT_TRUE(out.ok()) << out.status();
    return out->last_hidden;
  };
  forward({0, 1}, {a, b});                           // prefill both from empty
  const at::Tensor cached = forward({0}, {more});    // three tokens onto sequence 0 only
  std::vector<int32_t> whole = a;
  whole.insert(whole.end(), more.begin(), more.end());
  auto batch = PackSamples({whole}, c.vocab_size, at::kCPU);
  auto plain = model->Forward(*batch, ForwardOptions{});
  ASSERT_TRUE(plain.ok());
  EXPECT_LE(testing::RelInf(cached, plain->last_hidden.narrow(0, 5, 3)), 1e-5);
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{8, 2}));

  // What does not fit, or names a sequence twice, is refused before any forward.
  EXPECT_EQ(cache.BeginAppend({0}, {0, 9}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(cache.BeginAppend({1, 1}, {0, 1, 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.BeginAppend({2}, {0, 1}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace e3
