#include "student_trainer/draft/draft_export.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/model/draft_aux_layers.h"
#include "common/model/model_config.h"
#include "common/torch/tensor_convert.h"
#include "nlohmann/json.hpp"

namespace e3 {

using nlohmann::json;

absl::StatusOr<std::string> TorchDtypeName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return std::string("bfloat16");
    case at::kHalf:
      return std::string("float16");
    case at::kFloat:
      return std::string("float32");
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "draft export: weights must be bf16, fp16 or fp32, got ", c10::toString(dtype)));
  }
}

// rope_scaling in the layout transformers 4.x writes and SGLang/vLLM read;
// null for the default rope.
json RopeScalingJson(const RopeConfig& rope) {
  json s = json::object();
  switch (rope.type) {
    case RopeType::kDefault:
      return json(nullptr);
    case RopeType::kLinear:
      s["rope_type"] = "linear";
      s["factor"] = rope.factor;
      break;
    case RopeType::kLlama3:
      s["rope_type"] = "llama3";
      s["factor"] = rope.factor;
      s["low_freq_factor"] = rope.low_freq_factor;
      s["high_freq_factor"] = rope.high_freq_factor;
      s["original_max_position_embeddings"] = rope.original_max_position_embeddings;
      break;
    case RopeType::kYarn:
      s["rope_type"] = "yarn";
      s["factor"] = rope.factor;
      s["original_max_position_embeddings"] = rope.original_max_position_embeddings;
      s["beta_fast"] = rope.beta_fast;
      s["beta_slow"] = rope.beta_slow;
      if (rope.attention_factor.has_value()) s["attention_factor"] = *rope.attention_factor;
      if (rope.mscale.has_value()) s["mscale"] = *rope.mscale;
      if (rope.mscale_all_dim.has_value()) s["mscale_all_dim"] = *rope.mscale_all_dim;
      if (!rope.truncate) s["truncate"] = false;
      break;
  }
  return s;
}

absl::Status CheckSameTarget(const TargetIdentity& file, const TargetIdentity& mine, const std::string& path,
                             OtherTarget other_target) {
  if (file.empty() || mine.empty() || file.config_sha256 == mine.config_sha256) return absl::OkStatus();
  const std::string what = absl::StrCat(path, " was trained for ", file.name_or_path, " (config.json sha256 ",
                                        file.config_sha256.substr(0, 12), "...), but the teacher serves ",
                                        mine.name_or_path, " (", mine.config_sha256.substr(0, 12), "...)");
  if (other_target == OtherTarget::kRefuse) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "; to start a draft for this target from it, use draft.init_from (--init_from)"));
  }
  std::fprintf(stderr, "student: warning: %s\n", what.c_str());
  return absl::OkStatus();
}

namespace {

constexpr char kArchitecture[] = "LlamaForCausalLMEagle3";

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

absl::Status Mismatch(const std::string& source, const std::string& field, int64_t file_value,
                      int64_t draft_value) {
  return absl::FailedPreconditionError(absl::StrCat(
      source, ": field \"", field, "\" is ", file_value, ", but the draft has ", draft_value));
}

// Every name, shape, dtype and the vocab map, before anything is copied: a
// file that fails leaves the draft as it was.
absl::Status CheckDraftWeights(const Eagle3DraftImpl& draft, const SafetensorsFile& file) {
  for (const auto& [name, param] : draft.ExportedParameters()) {
    E3_ASSIGN_OR_RETURN(TensorView view, file.Get(name));
    if (view.shape != param.sizes().vec()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": tensor \"", name, "\": expected shape ",
                       Shape(param.sizes().vec()), ", got ", Shape(view.shape)));
    }
    if (view.dtype != DType::kF32 && view.dtype != DType::kBF16 && view.dtype != DType::kF16 &&
        view.dtype != DType::kF64) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor \"", name,
                                                     "\": expected a float dtype, got ",
                                                     std::string(DTypeName(view.dtype))));
    }
  }
  // The vocab map decides which target head rows the draft holds, so a
  // file trained with another map cannot be resumed into this draft.
  const std::pair<const char*, const at::Tensor*> maps[] = {{"d2t", &draft.d2t},
                                                            {"t2d", &draft.t2d}};
  for (const auto& [name, mine] : maps) {
    if (!file.Contains(name)) continue;
    E3_ASSIGN_OR_RETURN(TensorView view, file.Get(name));
    E3_ASSIGN_OR_RETURN(at::ScalarType type, ToScalarType(view.dtype));
    if (view.shape != mine->sizes().vec() || type != mine->scalar_type()) {
      return absl::FailedPreconditionError(
          absl::StrCat(file.path(), ": tensor \"", name, "\": expected ",
                       c10::toString(mine->scalar_type()), " ", Shape(mine->sizes().vec()),
                       ", got ", std::string(DTypeName(view.dtype)), " ", Shape(view.shape)));
    }
    E3_ASSIGN_OR_RETURN(at::Tensor value, ViewToTensor(view, type, at::kCPU));
    if (!value.equal(mine->to(at::kCPU))) {
      return absl::FailedPreconditionError(absl::StrCat(
          file.path(), ": tensor \"", name,
          "\": its draft vocab differs from the one the teacher serves (the head's rows were chosen "
          "with another map); serve this draft's vocab from the teacher: draft.init_from (teacher "
          "--init_from) for a warm start, or --vocab_map=", file.path()));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadDraftWeightsImpl(Eagle3DraftImpl& draft, const SafetensorsFile& file) {
  E3_RETURN_IF_ERROR(CheckDraftWeights(draft, file));
  torch::NoGradGuard no_grad;
  const at::Device device = draft.options().device;
  for (auto& [name, param] : draft.ExportedParameters()) {
    E3_ASSIGN_OR_RETURN(TensorView view, file.Get(name));
    E3_ASSIGN_OR_RETURN(at::Tensor value, ViewToTensor(view, param.scalar_type(), device));
    // copy_ keeps the parameter's identity (optimizer state refers to it).
    at::Tensor target = param;
    target.copy_(value);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> DraftConfigJson(const Eagle3DraftConfig& c, at::ScalarType dtype,
                                            const json& extra) {
  E3_RETURN_IF_ERROR(c.Validate());
  E3_ASSIGN_OR_RETURN(std::string dtype_name, TorchDtypeName(dtype));
  if (c.max_position_embeddings <= 0) {
    return absl::InvalidArgumentError("draft export: max_position_embeddings must be positive");
  }
  if (static_cast<int64_t>(c.aux_layer_ids.size()) != c.num_aux) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft export: aux_layer_ids must hold num_aux = ", c.num_aux, " ids, got ",
                     c.aux_layer_ids.size()));
  }
  json j = json::object();
  j["architectures"] = json::array({kArchitecture});
  j["model_type"] = "llama";
  j["num_hidden_layers"] = 1;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["vocab_size"] = c.vocab_size;
  j["draft_vocab_size"] = c.draft_vocab_size;
  j["target_hidden_size"] = c.target_hidden_size;
  j["tie_word_embeddings"] = false;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope.theta;
  j["rope_scaling"] = RopeScalingJson(c.rope);
  if (c.rope.partial_rotary_factor != 1.0)
    j["partial_rotary_factor"] = c.rope.partial_rotary_factor;
  j["torch_dtype"] = dtype_name;
  // vLLM reads only the top-level key, counting the state entering layer j;
  // SGLang reads only eagle_config, counting the output of layer i.
  j["eagle_aux_hidden_state_layer_ids"] = VllmAuxLayerIds(c.aux_layer_ids);
  j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", c.aux_layer_ids}, {"use_aux_hidden_state", true}};
  // EAGLE-3.1's keys, as vLLM, SGLang and SpecForge read them; absent
  // means false, so an EAGLE-3 export carries neither.
  if (c.fc_norm) j["fc_norm"] = true;
  if (c.norm_output) j["norm_output"] = true;
  if (!c.target.empty()) j["e3_target"] = TargetIdentityToJson(c.target);
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return j.dump(2) + "\n";
}

absl::Status ExportDraft(const Eagle3DraftImpl& draft, const std::string& dir,
                         const DraftExportOptions& options) {
  E3_ASSIGN_OR_RETURN(std::string config_text, DraftConfigJson(draft.config(), options.dtype, options.extra));
  E3_RETURN_IF_ERROR(MakeDirs(dir));
  std::vector<TensorToWrite> tensors;
  try {
    for (const auto& [name, param] : draft.ExportedParameters()) {
      E3_ASSIGN_OR_RETURN(TensorToWrite t,
                          TensorToWritable(name, param.detach().to(options.dtype)));
      tensors.push_back(std::move(t));
    }
    E3_ASSIGN_OR_RETURN(TensorToWrite d2t, TensorToWritable("d2t", draft.d2t.to(at::kLong)));
    E3_ASSIGN_OR_RETURN(TensorToWrite t2d, TensorToWritable("t2d", draft.t2d.to(at::kBool)));
    tensors.push_back(std::move(d2t));
    tensors.push_back(std::move(t2d));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("draft export to ", dir, ": ", e.what_without_backtrace()));
  }
  // "format": "pt" is what transformers' safetensors loader expects.
  E3_RETURN_IF_ERROR(WriteSafetensors(JoinPath(dir, kDraftWeightsFile),
                                      tensors, {{"format", "pt"}}));
  return WriteFileAtomically(JoinPath(dir, kDraftConfigFile), config_text);
}

absl::StatusOr<Eagle3DraftConfig> ReadDraftConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open draft config"));
  std::stringstream ss;
  ss << in.rdbuf();
  json root = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  auto field_error = [&](const std::string& key, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field \"", key, "\": ", what));
  };
  if (!root.contains("architectures") || !root["architectures"].is_array() ||
      root["architectures"].empty() || root["architectures"][0] != kArchitecture) {
    return field_error("architectures", absl::StrCat("expected [\"", kArchitecture, "\"]"));
  }
  if (!root.contains("num_hidden_layers") || root["num_hidden_layers"] != 1) {
    return field_error("num_hidden_layers", "expected 1");
  }
  // The rest is a Llama config: parse dims and rope with the target's
  // parser, as the serving engines do.
  json as_llama = root;
  as_llama["architectures"] = json::array({"LlamaForCausalLM"});
  E3_ASSIGN_OR_RETURN(ModelConfig llama, ParseModelConfig(as_llama.dump(), path));
  Eagle3DraftConfig c;
  c.hidden_size = llama.hidden_size;
  c.intermediate_size = llama.intermediate_size;
  c.num_heads = llama.num_attention_heads;
  c.num_kv_heads = llama.num_key_value_heads;
  c.head_dim = llama.head_dim;
  c.rms_norm_eps = llama.rms_norm_eps;
  c.rope = llama.rope;
  c.max_position_embeddings = llama.max_position_embeddings;
  c.vocab_size = llama.vocab_size;
  if (!root.contains("draft_vocab_size") || !root["draft_vocab_size"].is_number_integer()) {
    return field_error("draft_vocab_size", "required integer is missing");
  }
  c.draft_vocab_size = root["draft_vocab_size"].get<int64_t>();
  c.target_hidden_size = c.hidden_size;
  if (root.contains("target_hidden_size") && !root["target_hidden_size"].is_null()) {
    if (!root["target_hidden_size"].is_number_integer())
      return field_error("target_hidden_size", "expected an integer");
    c.target_hidden_size = root["target_hidden_size"].get<int64_t>();
  }
  for (const auto& [key, flag] : {std::pair<const char*, bool*>{"fc_norm", &c.fc_norm}, {"norm_output", &c.norm_output}}) {
    if (!root.contains(key) || root[key].is_null()) continue;
    if (!root[key].is_boolean()) return field_error(key, "expected true or false");
    *flag = root[key].get<bool>();
  }
  E3_ASSIGN_OR_RETURN(c.aux_layer_ids, ReadDraftAuxLayerIds(root, path));
  if (!c.aux_layer_ids.empty()) c.num_aux = static_cast<int64_t>(c.aux_layer_ids.size());
  if (root.contains("e3_target")) {
    E3_ASSIGN_OR_RETURN(c.target, TargetIdentityFromJson(root["e3_target"], absl::StrCat(path, ": e3_target")));
  }
  absl::Status valid = c.Validate();
  if (!valid.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::string(valid.message())));
  return c;
}

absl::Status LoadDraftWeights(Eagle3DraftImpl& draft, const SafetensorsFile& file) {
  try {
    return LoadDraftWeightsImpl(draft, file);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(file.path(), ": loading draft weights: ", e.what_without_backtrace()));
  }
}

absl::Status LoadDraftExport(Eagle3DraftImpl& draft, const std::string& dir, OtherTarget other_target) {
  const std::string config_path = JoinPath(dir, kDraftConfigFile);
  E3_ASSIGN_OR_RETURN(Eagle3DraftConfig file_config, ReadDraftConfig(config_path));
  const Eagle3DraftConfig& mine = draft.config();
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"hidden_size", {file_config.hidden_size, mine.hidden_size}},
      {"target_hidden_size", {file_config.target_hidden_size, mine.target_hidden_size}},
      {"intermediate_size", {file_config.intermediate_size, mine.intermediate_size}},
      {"num_attention_heads", {file_config.num_heads, mine.num_heads}},
      {"num_key_value_heads", {file_config.num_kv_heads, mine.num_kv_heads}},
      {"head_dim", {file_config.head_dim, mine.head_dim}},
      {"vocab_size", {file_config.vocab_size, mine.vocab_size}},
      {"draft_vocab_size", {file_config.draft_vocab_size, mine.draft_vocab_size}},
      {"eagle_config.eagle_aux_hidden_state_layer_ids (count)",
       {file_config.num_aux, mine.num_aux}},
  };
  for (const auto& [field, values] : fields) {
    if (values.first != values.second)
      return Mismatch(config_path, field, values.first, values.second);
  }
  if (file_config.fc_norm != mine.fc_norm || file_config.norm_output != mine.norm_output) {
    const auto variant = [](const Eagle3DraftConfig& c) {
      return absl::StrCat(c.fc_norm || c.norm_output ? "EAGLE-3.1" : "EAGLE-3", " (fc_norm ", c.fc_norm ? "true" : "false",
                          ", norm_output ", c.norm_output ? "true" : "false", ")");
    };
    return absl::FailedPreconditionError(absl::StrCat(config_path, ": fields \"fc_norm\"/\"norm_output\": the export is ",
                                                      variant(file_config), ", this draft is ", variant(mine),
                                                      ": set draft.algorithm to the export's"));
  }
  if (!file_config.aux_layer_ids.empty() && file_config.aux_layer_ids != mine.aux_layer_ids) {
    return absl::FailedPreconditionError(absl::StrCat(
        config_path, ": the draft was trained on aux layers [", absl::StrJoin(file_config.aux_layer_ids, ", "),
        "], but this draft reads [", absl::StrJoin(mine.aux_layer_ids, ", "),
        "]: set draft.aux_layer_ids (--aux_layer_ids) to the draft's, or leave it empty to read a warm start's"));
  }
  E3_RETURN_IF_ERROR(CheckSameTarget(file_config.target, mine.target, config_path, other_target));
  if (file_config.rope.type != mine.rope.type || file_config.rope.theta != mine.rope.theta) {
    return absl::FailedPreconditionError(
        absl::StrCat(config_path, ": rope (", RopeTypeName(file_config.rope.type), ", theta ",
                     file_config.rope.theta, ") differs from the draft's (",
                     RopeTypeName(mine.rope.type), ", theta ", mine.rope.theta, ")"));
  }
  E3_ASSIGN_OR_RETURN(
      std::unique_ptr<SafetensorsFile> file,
      SafetensorsFile::Open(JoinPath(dir, kDraftWeightsFile)));
  return LoadDraftWeights(draft, *file);
}

absl::Status Eagle3DraftImpl::Export(const std::string& dir, const DraftExportOptions& options) const {
  return ExportDraft(*this, dir, options);
}

absl::Status Eagle3DraftImpl::LoadExport(const std::string& dir, OtherTarget other_target) {
  return LoadDraftExport(*this, dir, other_target);
}

}  // namespace e3
