// A GptOssForCausalLM model directory grafted onto a dense Llama one, for
// end-to-end tests that need a GPT-OSS teacher whose hidden states carry
// the trained model's structure: embeddings, norms and attention weights
// are copied (with zero q/k/v/o biases and zero sinks), every expert's
// gate_up_proj interleaves the dense MLP's gate and up rows (gate in even
// columns, up in odd ones, in transformers' [E, H, 2I] layout) and its
// down_proj is the dense down_proj ([E, I, H]), with zero biases; the
// router is random. GPT-OSS's experts apply the clamped SwiGLU, not SiLU,
// so this is not the dense model's function, but a near relative of it
// that runs GPT-OSS's real attention (sinks, sliding windows) and routing.
#ifndef E3_TESTS_E2E_GRAFTED_GPT_OSS_MODEL_H_
#define E3_TESTS_E2E_GRAFTED_GPT_OSS_MODEL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/model/model_dir.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"
#include "tests/e2e/upcycled_moe_model.h"

namespace e3::testing {

// A bf16 tensor of zeros.
inline TensorToWrite Bf16Zeros(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {name, DType::kBF16, shape, std::vector<uint8_t>(static_cast<size_t>(n) * 2, 0)};
}

// The bf16 element (r, c) of a row-major [rows, cols] view.
inline uint16_t Bf16At(const TensorView& v, int64_t r, int64_t c) {
  uint16_t x = 0;
  std::memcpy(&x, v.data + 2 * (r * v.shape[1] + c), 2);
  return x;
}

// Writes under `out_dir` the grafted model of `model_dir` (a bf16 Llama)
// with `experts` experts, `top_k` per token, a sliding window of `window`
// on even layers, and a router drawn from `seed`. Returns its path.
inline std::string GraftedGptOssModel(const std::string& model_dir, int experts, int top_k, int window, uint32_t seed,
                                      const std::string& out_dir) {
  const std::string dir = JoinPath(out_dir, "grafted_gpt_oss");
  EXPECT_TRUE(MakeDirs(dir).ok());
  auto dense = ModelDir::Open(model_dir);
  EXPECT_TRUE(dense.ok()) << dense.status();
  if (!dense.ok()) return dir;
  const ModelConfig& c = (*dense)->config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = experts;

  nlohmann::json config = nlohmann::json::parse(ReadFile(JoinPath(model_dir, "config.json")));
  config["architectures"] = {"GptOssForCausalLM"};
  config["model_type"] = "gpt_oss";
  config["attention_bias"] = true;
  config["num_local_experts"] = experts;
  config["num_experts_per_tok"] = top_k;
  config["sliding_window"] = window;
  config["swiglu_limit"] = 7.0;
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  }
  config["layer_types"] = types;
  for (const char* llama_only : {"mlp_bias", "pretraining_tp"}) config.erase(llama_only);
  std::ofstream(JoinPath(dir, "config.json")) << config.dump(2) << "\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"}) {
    if (PathExists(JoinPath(model_dir, f))) std::ofstream(JoinPath(dir, f)) << ReadFile(JoinPath(model_dir, f));
  }

  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(H)));
  std::vector<TensorToWrite> tensors;
  std::map<std::string, TensorView> mlp;  // model.layers.N.mlp.{gate,up,down}_proj.weight
  for (const std::string& name : (*dense)->TensorNames()) {
    auto view = (*dense)->Get(name);
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) continue;
    if (name.find(".mlp.") != std::string::npos) {
      EXPECT_EQ(view->dtype, DType::kBF16) << name;
      mlp[name] = *view;
      continue;
    }
    tensors.push_back({name, view->dtype, view->shape, std::vector<uint8_t>(view->data, view->data + view->nbytes)});
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      if (absl::EndsWith(name, absl::StrCat(".self_attn.", proj, ".weight"))) {
        tensors.push_back(Bf16Zeros(absl::StrCat(name.substr(0, name.size() - 6), "bias"), {view->shape[0]}));
      }
    }
    if (absl::EndsWith(name, ".self_attn.q_proj.weight")) {
      const std::string p = name.substr(0, name.size() - std::string("q_proj.weight").size());
      tensors.push_back(Bf16Zeros(p + "sinks", {c.num_attention_heads}));
    }
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".mlp.");
    const TensorView& gate = mlp[p + "gate_proj.weight"];
    const TensorView& up = mlp[p + "up_proj.weight"];
    const TensorView& down = mlp[p + "down_proj.weight"];
    TensorToWrite gate_up = Bf16Zeros(p + "experts.gate_up_proj", {E, H, 2 * I});
    TensorToWrite down_t = Bf16Zeros(p + "experts.down_proj", {E, I, H});
    auto* gu = reinterpret_cast<uint16_t*>(gate_up.data.data());
    auto* dn = reinterpret_cast<uint16_t*>(down_t.data.data());
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t j = 0; j < I; ++j) {
          gu[(e * H + h) * 2 * I + 2 * j] = Bf16At(gate, j, h);
          gu[(e * H + h) * 2 * I + 2 * j + 1] = Bf16At(up, j, h);
          dn[(e * I + j) * H + h] = Bf16At(down, h, j);
        }
      }
    }
    tensors.push_back(std::move(gate_up));
    tensors.push_back(std::move(down_t));
    tensors.push_back(Bf16Zeros(p + "experts.gate_up_proj_bias", {E, 2 * I}));
    tensors.push_back(Bf16Zeros(p + "experts.down_proj_bias", {E, H}));
    TensorToWrite router = Bf16Zeros(p + "router.weight", {E, H});
    for (int64_t k = 0; k < E * H; ++k) {
      const uint16_t b = ToBf16Bits(normal(rng));
      std::memcpy(router.data.data() + 2 * k, &b, 2);
    }
    tensors.push_back(std::move(router));
    tensors.push_back(Bf16Zeros(p + "router.bias", {E}));
  }
  const absl::Status st = WriteSafetensors(JoinPath(dir, "model.safetensors"), tensors, {{"format", "pt"}});
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

}  // namespace e3::testing

#endif  // E3_TESTS_E2E_GRAFTED_GPT_OSS_MODEL_H_
