// Export -> reload of the EAGLE-3 draft: exact tensor names, shapes and
// dtypes, the config.json fields SGLang and vLLM read, a lossless fp32
// round trip, and clear errors for mismatched files.
#include "student_trainer/draft/draft_export.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include "common/base/file_util.h"
#include "common/data/vocab_map.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/model/target_identity.h"
#include "common/torch/tensor_convert.h"
#include "nlohmann/json.hpp"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

using testing::MakeTinyDraft;
using testing::TinyConfig;

class DraftExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = JoinPath(::testing::TempDir(), "e3_draft_export_test_" + std::to_string(::getpid()) + "_" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    (void)RemoveAll(dir_);
  }
  void TearDown() override { (void)RemoveAll(dir_); }

  static nlohmann::json ReadJson(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return nlohmann::json::parse(ss.str());
  }

  std::string dir_;
};

Eagle3DraftConfig Llama3RopeConfig() {
  Eagle3DraftConfig c = TinyConfig();
  c.rope.type = RopeType::kLlama3;
  c.rope.theta = 500000.0;
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position_embeddings = 64;
  return c;
}

TEST_F(DraftExportTest, WritesExactlyTheDesignNamesShapesAndDtypes) {
  Eagle3Draft draft = MakeTinyDraft();
  ASSERT_TRUE(ExportDraft(*draft, dir_).ok());
  auto file = SafetensorsFile::Open(JoinPath(dir_, "model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"midlayer.self_attn.q_proj.weight", {32, 64}},
      {"midlayer.self_attn.k_proj.weight", {16, 64}},
      {"midlayer.self_attn.v_proj.weight", {16, 64}},
      {"midlayer.self_attn.o_proj.weight", {32, 32}},
      {"midlayer.mlp.gate_proj.weight", {64, 32}},
      {"midlayer.mlp.up_proj.weight", {64, 32}},
      {"midlayer.mlp.down_proj.weight", {32, 64}},
      {"midlayer.input_layernorm.weight", {32}},
      {"midlayer.hidden_norm.weight", {32}},
      {"midlayer.post_attention_layernorm.weight", {32}},
      {"fc.weight", {32, 96}},
      {"norm.weight", {32}},
      {"lm_head.weight", {20, 32}},
      {"d2t", {20}},
      {"t2d", {50}},
  };
  std::vector<std::string> names = (*file)->Names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), expected.size());
  for (const auto& [name, shape] : expected) {
    SCOPED_TRACE(name);
    auto view = (*file)->Get(name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->shape, shape);
    const DType want = name == "d2t" ? DType::kI64 : name == "t2d" ? DType::kBool : DType::kBF16;
    EXPECT_EQ(view->dtype, want);
  }
  EXPECT_FALSE((*file)->Contains("embed_tokens.weight"));
  EXPECT_FALSE((*file)->Contains("embed_tokens"));
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  // The map reads back with the common loader (what evaluation uses).
  auto map = LoadVocabMap(JoinPath(dir_, "model.safetensors"));
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->d2t, testing::EvenIdsVocab(50, 20).d2t);
  EXPECT_EQ(map->t2d, testing::EvenIdsVocab(50, 20).t2d);
}

TEST_F(DraftExportTest, ConfigJsonHasTheFieldsServingEnginesRead) {
  Eagle3Draft draft = MakeTinyDraft(at::kFloat, 7, Llama3RopeConfig());
  ASSERT_TRUE(ExportDraft(*draft, dir_).ok());
  nlohmann::json j = ReadJson(JoinPath(dir_, "config.json"));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"LlamaForCausalLMEagle3"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["num_hidden_layers"], 1);
  EXPECT_EQ(j["hidden_size"], 32);
  EXPECT_EQ(j["intermediate_size"], 64);
  EXPECT_EQ(j["num_attention_heads"], 4);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["rms_norm_eps"], 1e-6);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["vocab_size"], 50);
  EXPECT_EQ(j["draft_vocab_size"], 20);
  EXPECT_EQ(j["target_hidden_size"], 32);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["max_position_embeddings"], 256);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(j["rope_scaling"]["low_freq_factor"], 1.0);
  EXPECT_EQ(j["rope_scaling"]["high_freq_factor"], 4.0);
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 64);
  EXPECT_EQ(j["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
            nlohmann::json::array({1, 5, 8}));

  // The default rope writes rope_scaling: null.
  Eagle3Draft plain = MakeTinyDraft();
  ASSERT_TRUE(ExportDraft(*plain, JoinPath(dir_, "plain"), {at::kHalf}).ok());
  nlohmann::json p = ReadJson(JoinPath(JoinPath(dir_, "plain"), "config.json"));
  EXPECT_TRUE(p["rope_scaling"].is_null());
  EXPECT_EQ(p["rope_theta"], 10000.0);
  EXPECT_EQ(p["torch_dtype"], "float16");
}

TEST_F(DraftExportTest, ReadDraftConfigRoundTrips) {
  Eagle3Draft draft = MakeTinyDraft(at::kFloat, 7, Llama3RopeConfig());
  ASSERT_TRUE(ExportDraft(*draft, dir_).ok());
  auto c = ReadDraftConfig(JoinPath(dir_, "config.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  const Eagle3DraftConfig want = Llama3RopeConfig();
  EXPECT_EQ(c->hidden_size, want.hidden_size);
  EXPECT_EQ(c->target_hidden_size, want.target_hidden_size);
  EXPECT_EQ(c->intermediate_size, want.intermediate_size);
  EXPECT_EQ(c->num_heads, want.num_heads);
  EXPECT_EQ(c->num_kv_heads, want.num_kv_heads);
  EXPECT_EQ(c->head_dim, want.head_dim);
  EXPECT_EQ(c->vocab_size, want.vocab_size);
  EXPECT_EQ(c->draft_vocab_size, want.draft_vocab_size);
  EXPECT_EQ(c->max_position_embeddings, want.max_position_embeddings);
  EXPECT_EQ(c->aux_layer_ids, want.aux_layer_ids);
  EXPECT_EQ(c->num_aux, 3);
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 64);
}

TEST_F(DraftExportTest, Fp32ExportReloadsBitExactAndBf16ReloadsRounded) {
  Eagle3Draft source = MakeTinyDraft(at::kFloat, /*seed=*/1);
  ASSERT_TRUE(ExportDraft(*source, JoinPath(dir_, "fp32"), {at::kFloat}).ok());
  ASSERT_TRUE(ExportDraft(*source, JoinPath(dir_, "bf16")).ok());

  Eagle3Draft fp32 = MakeTinyDraft(at::kFloat, /*seed=*/2);
  absl::Status s = LoadDraftExport(*fp32, JoinPath(dir_, "fp32"));
  ASSERT_TRUE(s.ok()) << s;
  Eagle3Draft bf16 = MakeTinyDraft(at::kFloat, /*seed=*/2);
  s = LoadDraftExport(*bf16, JoinPath(dir_, "bf16"));
  ASSERT_TRUE(s.ok()) << s;
  auto want = source->ExportedParameters();
  auto got32 = fp32->ExportedParameters();
  auto got16 = bf16->ExportedParameters();
  ASSERT_EQ(want.size(), 13u);
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].first);
    EXPECT_EQ(got32[i].first, want[i].first);
    EXPECT_TRUE(got32[i].second.equal(want[i].second));
    EXPECT_TRUE(got16[i].second.equal(want[i].second.to(at::kBFloat16).to(at::kFloat)));
    EXPECT_TRUE(got32[i].second.requires_grad());  // still a trainable parameter
  }
}

// EAGLE-3.1 writes fc_norm.<k>.weight and the two config keys the serving
// engines read; an EAGLE-3 export carries neither key, and each variant
// refuses the other's export, naming the fields.
TEST_F(DraftExportTest, Eagle31ExportsItsNormsAndKeysAndRefusesEagle3) {
  Eagle3DraftConfig c31 = TinyConfig();
  c31.fc_norm = c31.norm_output = true;
  Eagle3Draft source = MakeTinyDraft(at::kFloat, /*seed=*/1, c31);
  {
    torch::NoGradGuard no_grad;
    for (auto& norm : source->fc_norms) norm->weight.normal_(1.0, 0.1);
  }
  const std::string d31 = JoinPath(dir_, "eagle31"), d3 = JoinPath(dir_, "eagle3");
  ASSERT_TRUE(ExportDraft(*source, d31, {at::kFloat}).ok());
  ASSERT_TRUE(ExportDraft(*MakeTinyDraft(at::kFloat, 1), d3, {at::kFloat}).ok());

  const nlohmann::json j31 = ReadJson(JoinPath(d31, "config.json")), j3 = ReadJson(JoinPath(d3, "config.json"));
  EXPECT_EQ(j31.at("fc_norm"), true);
  EXPECT_EQ(j31.at("norm_output"), true);
  EXPECT_FALSE(j3.contains("fc_norm"));
  EXPECT_FALSE(j3.contains("norm_output"));
  auto file = SafetensorsFile::Open(JoinPath(d31, "model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  for (int k = 0; k < 3; ++k) {
    auto view = (*file)->Get("fc_norm." + std::to_string(k) + ".weight");
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->shape, (std::vector<int64_t>{c31.target_hidden_size}));
  }
  auto read = ReadDraftConfig(JoinPath(d31, "config.json"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->fc_norm);
  EXPECT_TRUE(read->norm_output);

  Eagle3Draft reloaded = MakeTinyDraft(at::kFloat, /*seed=*/2, c31);
  absl::Status s = LoadDraftExport(*reloaded, d31);
  ASSERT_TRUE(s.ok()) << s;
  const auto want = source->ExportedParameters(), got = reloaded->ExportedParameters();
  ASSERT_EQ(want.size(), 16u);
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].first);
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(got[i].second.equal(want[i].second));
  }

  Eagle3Draft eagle3 = MakeTinyDraft(at::kFloat, /*seed=*/2);
  for (const auto& [draft, dir] : {std::pair<Eagle3DraftImpl*, std::string>{eagle3.get(), d31},
                                   {reloaded.get(), d3}}) {
    s = LoadDraftExport(*draft, dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(std::string(s.message()).find("fc_norm"), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find("draft.algorithm"), std::string::npos) << s;
  }
}

TEST_F(DraftExportTest, LoadErrorsNameTheFileAndTheField) {
  Eagle3Draft draft = MakeTinyDraft();
  ASSERT_TRUE(ExportDraft(*draft, dir_, {at::kFloat}).ok());

  // A draft with another draft vocab size: the config mismatch is named.
  Eagle3DraftConfig other = TinyConfig();
  other.draft_vocab_size = 10;
  Eagle3DraftOptions options;
  options.config = other;
  auto frozen = testing::TinyFrozen(other, 11);
  frozen.vocab = testing::EvenIdsVocab(50, 10);
  auto small = CreateEagle3Draft(options, frozen);
  ASSERT_TRUE(small.ok()) << small.status();
  absl::Status s = LoadDraftExport(**small, dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("draft_vocab_size"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("config.json"), std::string::npos) << s;

  // Same shapes, another vocab map: the target head rows would be wrong.
  Eagle3DraftOptions same;
  same.config = TinyConfig();
  auto shifted = testing::TinyFrozen(same.config, 11);
  shifted.vocab.d2t[0] = 1;  // draft id 0 -> target id 1
  shifted.vocab.t2d[0] = 0;
  shifted.vocab.t2d[1] = 1;
  auto remapped = CreateEagle3Draft(same, shifted);
  ASSERT_TRUE(remapped.ok()) << remapped.status();
  s = LoadDraftExport(**remapped, dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("d2t"), std::string::npos) << s;

  // A weights file without one tensor: NotFound naming file and tensor.
  std::vector<TensorToWrite> partial;
  for (const auto& [name, p] : draft->ExportedParameters()) {
    if (name == "midlayer.self_attn.q_proj.weight") continue;
    partial.push_back(*TensorToWritable(name, p));
  }
  ASSERT_TRUE(WriteSafetensors(JoinPath(dir_, "model.safetensors"), partial).ok());
  s = LoadDraftExport(*draft, dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(std::string(s.message()).find("q_proj"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("model.safetensors"), std::string::npos) << s;

  // A tensor of the wrong shape.
  std::vector<TensorToWrite> wrong;
  for (const auto& [name, p] : draft->ExportedParameters()) {
    wrong.push_back(*TensorToWritable(name, name == "fc.weight" ? p.narrow(1, 0, 64) : p));
  }
  ASSERT_TRUE(WriteSafetensors(JoinPath(dir_, "model.safetensors"), wrong).ok());
  s = LoadDraftExport(*draft, dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("fc.weight"), std::string::npos) << s;

  // Not an EAGLE-3 config.
  std::ofstream(JoinPath(dir_, "config.json"))
      << R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1})";
  s = LoadDraftExport(*draft, dir_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("architectures"), std::string::npos) << s;
}

// The layers each engine captures for a draft, as its loader reads the
// draft's config.json, given as "output of decoder layer i" of a target of
// `layers` layers:
//   vLLM (vllm/v1/worker/gpu_model_runner.py, _get_eagle3_aux_layers_from_config;
//   vllm/model_executor/models/llama.py, the layer loop) reads only the
//   top-level key and captures id j as the state entering layer j, the
//   output of layer j - 1; without the key it takes (2, L // 2, L - 3);
//   SGLang (python/sglang/srt/models/llama.py, set_eagle3_layers_to_capture
//   and the layer loop) reads only eagle_config's list, adds 1, and
//   captures at the input of that layer: the output of layer i.
std::vector<int32_t> VllmCaptures(const nlohmann::json& config, int32_t layers) {
  std::vector<int32_t> ids = {2, layers / 2, layers - 3};
  if (config.contains("eagle_aux_hidden_state_layer_ids")) {
    ids = config["eagle_aux_hidden_state_layer_ids"].get<std::vector<int32_t>>();
  }
  std::vector<int32_t> outputs;
  for (int32_t j = 0; j < layers; ++j) {  // the loop over decoder layers
    for (int32_t id : ids) {
      if (id == j) outputs.push_back(j - 1);  // the residual stream entering layer j
    }
  }
  return outputs;
}

std::vector<int32_t> SglangCaptures(const nlohmann::json& config, int32_t layers) {
  std::vector<int32_t> to_capture = {2, layers / 2, layers - 3};  // its default, without +1
  if (config.contains("eagle_config") && config["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
    to_capture.clear();
    for (int32_t id : config["eagle_config"]["eagle_aux_hidden_state_layer_ids"].get<std::vector<int32_t>>()) {
      to_capture.push_back(id + 1);
    }
  }
  std::vector<int32_t> outputs;
  for (int32_t i = 0; i < layers; ++i) {
    for (int32_t id : to_capture) {
      if (id == i) outputs.push_back(i - 1);  // hidden_states + residual before layer i
    }
  }
  return outputs;
}

// A draft trained on custom layers is served on those layers by both
// engines. With the nested key alone vLLM falls back to its default and
// serves other states, with only a warning.
TEST_F(DraftExportTest, EachEngineCapturesTheLayersTheDraftWasTrainedOn) {
  constexpr int32_t kLayers = 12;
  Eagle3DraftConfig c = TinyConfig();
  c.aux_layer_ids = {0, 3, 7};
  Eagle3Draft draft = MakeTinyDraft(at::kFloat, 7, c);
  ASSERT_TRUE(ExportDraft(*draft, dir_).ok());
  const nlohmann::json j = ReadJson(JoinPath(dir_, "config.json"));
  EXPECT_EQ(j["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({1, 4, 8}));
  EXPECT_EQ(j["eagle_config"]["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({0, 3, 7}));
  EXPECT_EQ(j["eagle_config"]["use_aux_hidden_state"], true);
  EXPECT_EQ(VllmCaptures(j, kLayers), c.aux_layer_ids);
  EXPECT_EQ(SglangCaptures(j, kLayers), c.aux_layer_ids);

  nlohmann::json nested_only = j;
  nested_only.erase("eagle_aux_hidden_state_layer_ids");
  EXPECT_NE(VllmCaptures(nested_only, kLayers), c.aux_layer_ids) << "vLLM ignores eagle_config";
  // The last layer's output is what SGLang can never capture: refused upstream.
  EXPECT_EQ(SglangCaptures(nlohmann::json{{"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {kLayers - 1}}}}},
                           kLayers),
            std::vector<int32_t>{});
  EXPECT_FALSE(CheckAuxLayerIds({kLayers - 1}, kLayers).ok());
  EXPECT_TRUE(CheckAuxLayerIds({0, kLayers - 2}, kLayers).ok());

  // The two lists disagreeing (a hand edit) is an error, not a guess.
  nlohmann::json edited = j;
  edited["eagle_aux_hidden_state_layer_ids"] = {0, 3, 7};
  std::ofstream(JoinPath(dir_, "config.json")) << edited.dump();
  auto read = ReadDraftConfig(JoinPath(dir_, "config.json"));
  ASSERT_FALSE(read.ok());
  EXPECT_NE(std::string(read.status().message()).find("SGLang and vLLM would serve different layers"),
            std::string::npos)
      << read.status();
}

// The export names its target; a resume against another target is
// refused, a warm start only warned about; other aux layers are refused.
TEST_F(DraftExportTest, TheExportRecordsItsTargetAndAuxLayers) {
  Eagle3DraftConfig c = TinyConfig();
  c.target.name_or_path = "org/target-a";
  c.target.architecture = "LlamaForCausalLM";
  c.target.num_hidden_layers = 12;
  c.target.config_sha256 = Sha256Hex("{\"a\": 1}");
  Eagle3Draft draft = MakeTinyDraft(at::kFloat, 7, c);
  ASSERT_TRUE(ExportDraft(*draft, dir_, {at::kFloat}).ok());
  const nlohmann::json j = ReadJson(JoinPath(dir_, "config.json"));
  EXPECT_EQ(j["e3_target"]["name_or_path"], "org/target-a");
  EXPECT_EQ(j["e3_target"]["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["e3_target"]["num_hidden_layers"], 12);
  EXPECT_EQ(j["e3_target"]["config_sha256"].get<std::string>().size(), 64u);
  auto read = ReadDraftConfig(JoinPath(dir_, "config.json"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->target.config_sha256, c.target.config_sha256);

  Eagle3DraftConfig other_target = c;
  other_target.target.name_or_path = "org/target-b";
  other_target.target.config_sha256 = Sha256Hex("{\"b\": 2}");
  Eagle3Draft b = MakeTinyDraft(at::kFloat, 8, other_target);
  const absl::Status refused = LoadDraftExport(*b, dir_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(std::string(refused.message()).find("was trained for org/target-a"), std::string::npos) << refused;
  EXPECT_NE(std::string(refused.message()).find("draft.init_from"), std::string::npos) << refused;
  EXPECT_TRUE(LoadDraftExport(*b, dir_, OtherTarget::kWarn).ok());

  Eagle3DraftConfig other_layers = c;
  other_layers.aux_layer_ids = {2, 4, 5};
  Eagle3Draft l = MakeTinyDraft(at::kFloat, 8, other_layers);
  const absl::Status layers = LoadDraftExport(*l, dir_);
  EXPECT_EQ(layers.code(), absl::StatusCode::kFailedPrecondition) << layers;
  EXPECT_NE(std::string(layers.message()).find("trained on aux layers [1, 5, 8], but this draft reads [2, 4, 5]"),
            std::string::npos)
      << layers;
}

}  // namespace
}  // namespace e3
