// A Mixtral model directory made from a dense Llama one, for tests that
// need a mixture-of-experts teacher whose outputs mean something: every
// expert is a copy of the dense layer's MLP and the router is random. Mixtral
// renormalises the top-k routing weights to sum to one, so each token's
// weighted sum of identical experts is the dense MLP's output (to float
// rounding), whichever experts the router picks: the upcycled model computes
// the trained model's function while its tokens take the real dispatch,
// expert-parallel split and combine paths. A draft trained against it must
// train like one trained against the dense model.
#ifndef E3_TESTS_E2E_UPCYCLED_MOE_MODEL_H_
#define E3_TESTS_E2E_UPCYCLED_MOE_MODEL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/model/model_dir.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"

namespace e3::testing {

// bf16 bits of `x`, rounded to nearest even (finite inputs only).
inline uint16_t ToBf16Bits(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Writes under `out_dir` a MixtralForCausalLM with `experts` copies of each
// layer's MLP of the Llama model in `model_dir` (weights in bf16, as the
// bundled model's are), `top_k` experts per token and a router drawn from
// `seed`; the tokenizer, chat template and generation config are copied.
// Returns its path.
inline std::string UpcycledMoeModel(const std::string& model_dir, int experts, int top_k, uint32_t seed,
                                    const std::string& out_dir) {
  const std::string dir = JoinPath(out_dir, "upcycled_moe");
  EXPECT_TRUE(MakeDirs(dir).ok());
  auto dense = ModelDir::Open(model_dir);
  EXPECT_TRUE(dense.ok()) << dense.status();
  if (!dense.ok()) return dir;

  nlohmann::json config = nlohmann::json::parse(ReadFile(JoinPath(model_dir, "config.json")));
  EXPECT_EQ(config.at("model_type"), "llama") << model_dir;
  config["architectures"] = {"MixtralForCausalLM"};
  config["model_type"] = "mixtral";
  config["num_local_experts"] = experts;
  config["num_experts_per_tok"] = top_k;
  config["router_jitter_noise"] = 0.0;
  config["output_router_logits"] = false;
  config["sliding_window"] = nullptr;
  for (const char* llama_only : {"mlp_bias", "pretraining_tp"}) config.erase(llama_only);
  std::ofstream(JoinPath(dir, "config.json")) << config.dump(2) << "\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"}) {
    if (PathExists(JoinPath(model_dir, f))) std::ofstream(JoinPath(dir, f)) << ReadFile(JoinPath(model_dir, f));
  }

  const int64_t hidden = config.at("hidden_size").get<int64_t>();
  // Router rows of about unit norm: the routing logits then spread over
  // O(1), so tokens pick different experts and no two logits tie.
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(hidden)));
  const std::pair<const char*, const char*> kExpertNames[] = {{"gate_proj", "w1"}, {"down_proj", "w2"}, {"up_proj", "w3"}};

  std::vector<TensorToWrite> tensors;
  for (const std::string& name : (*dense)->TensorNames()) {
    auto view = (*dense)->Get(name);
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) continue;
    const size_t mlp = name.find(".mlp.");
    if (mlp == std::string::npos) {
      tensors.push_back({name, view->dtype, view->shape, std::vector<uint8_t>(view->data, view->data + view->nbytes)});
      continue;
    }
    const std::string layer = name.substr(0, mlp);  // model.layers.N
    for (const auto& [dense_name, mixtral_name] : kExpertNames) {
      if (!absl::EndsWith(name, absl::StrCat(".mlp.", dense_name, ".weight"))) continue;
      for (int e = 0; e < experts; ++e) {
        tensors.push_back({absl::StrCat(layer, ".block_sparse_moe.experts.", e, ".", mixtral_name, ".weight"),
                           view->dtype, view->shape, std::vector<uint8_t>(view->data, view->data + view->nbytes)});
      }
    }
    if (absl::EndsWith(name, ".mlp.gate_proj.weight")) {
      EXPECT_EQ(view->dtype, DType::kBF16) << name;
      TensorToWrite router{layer + ".block_sparse_moe.gate.weight", DType::kBF16, {experts, hidden}, {}};
      router.data.resize(static_cast<size_t>(experts * hidden) * 2);
      for (int64_t i = 0; i < experts * hidden; ++i) {
        const uint16_t b = ToBf16Bits(normal(rng));
        std::memcpy(router.data.data() + 2 * i, &b, 2);
      }
      tensors.push_back(std::move(router));
    }
  }
  const absl::Status st = WriteSafetensors(JoinPath(dir, "model.safetensors"), tensors, {{"format", "pt"}});
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

}  // namespace e3::testing

#endif  // E3_TESTS_E2E_UPCYCLED_MOE_MODEL_H_
