#include "student_trainer/draft/dflash_export.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"
#include "common/torch/tensor_convert.h"
#include "student_trainer/draft/draft_export.h"

namespace e3 {
namespace {

using nlohmann::json;

// A config field the draft must have as it is, or an error naming it.
absl::Status SameField(const std::string& path, const char* field, int64_t file_value, int64_t draft_value) {
  if (file_value == draft_value) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(path, ": field \"", field, "\" is ", file_value, ", but the draft has ", draft_value));
}

template <typename T>
absl::StatusOr<T> Field(const json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) return absl::InvalidArgumentError(absl::StrCat(path, ": field \"", key, "\" is missing"));
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field \"", key, "\": ", e.what()));
  }
}

absl::Status CheckConfigMatches(const DFlashDraftConfig& file, const DFlashDraftConfig& mine, const std::string& path) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"hidden_size", {file.hidden_size, mine.hidden_size}},
      {"intermediate_size", {file.intermediate_size, mine.intermediate_size}},
      {"num_hidden_layers", {file.num_layers, mine.num_layers}},
      {"num_attention_heads", {file.num_heads, mine.num_heads}},
      {"num_key_value_heads", {file.num_kv_heads, mine.num_kv_heads}},
      {"head_dim", {file.head_dim, mine.head_dim}},
      {"vocab_size", {file.vocab_size, mine.vocab_size}},
      {"block_size", {file.block_size, mine.block_size}},
      {"dflash_config.mask_token_id", {file.mask_token_id, mine.mask_token_id}},
  };
  for (const auto& [name, values] : fields) E3_RETURN_IF_ERROR(SameField(path, name, values.first, values.second));
  if (file.target_layer_ids != mine.target_layer_ids) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": field \"dflash_config.target_layer_ids\" is [", absl::StrJoin(file.target_layer_ids, ", "),
        "], but the draft reads [", absl::StrJoin(mine.target_layer_ids, ", "), "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> DFlashConfigJson(const DFlashDraftConfig& c, at::ScalarType dtype, const json& extra) {
  E3_RETURN_IF_ERROR(c.Validate());
  E3_ASSIGN_OR_RETURN(std::string dtype_name, TorchDtypeName(dtype));
  json j = {
      {"architectures", {kDFlashArchitecture}},
      {"model_type", "qwen3"},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"rms_norm_eps", c.rms_norm_eps},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rope_theta", c.rope.theta},
      {"tie_word_embeddings", false},
      {"torch_dtype", dtype_name},
      {"block_size", c.block_size},
      {"num_target_layers", c.num_target_layers},
      {"layer_types", std::vector<std::string>(static_cast<size_t>(c.num_layers), "full_attention")},
      {"dflash_config",
       {{"mask_token_id", c.mask_token_id}, {"target_layer_ids", c.target_layer_ids}, {"block_size", c.block_size}}},
  };
  const json scaling = RopeScalingJson(c.rope);
  j["rope_scaling"] = scaling.empty() ? json(nullptr) : scaling;
  if (!c.target.empty()) j["e3_target"] = TargetIdentityToJson(c.target);
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return j.dump(2) + "\n";
}

absl::StatusOr<DFlashDraftConfig> ReadDFlashConfig(const std::string& path) {
  E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  E3_ASSIGN_OR_RETURN(const auto archs, Field<std::vector<std::string>>(j, "architectures", path));
  if (archs != std::vector<std::string>{kDFlashArchitecture}) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field \"architectures\" is [", absl::StrJoin(archs, ", "),
                                                   "]; expected [", kDFlashArchitecture, "]"));
  }
  DFlashDraftConfig c;
  E3_ASSIGN_OR_RETURN(c.hidden_size, Field<int64_t>(j, "hidden_size", path));
  E3_ASSIGN_OR_RETURN(c.intermediate_size, Field<int64_t>(j, "intermediate_size", path));
  E3_ASSIGN_OR_RETURN(c.num_layers, Field<int64_t>(j, "num_hidden_layers", path));
  E3_ASSIGN_OR_RETURN(c.num_heads, Field<int64_t>(j, "num_attention_heads", path));
  E3_ASSIGN_OR_RETURN(c.num_kv_heads, Field<int64_t>(j, "num_key_value_heads", path));
  E3_ASSIGN_OR_RETURN(c.head_dim, Field<int64_t>(j, "head_dim", path));
  E3_ASSIGN_OR_RETURN(c.rms_norm_eps, Field<double>(j, "rms_norm_eps", path));
  E3_ASSIGN_OR_RETURN(c.vocab_size, Field<int64_t>(j, "vocab_size", path));
  E3_ASSIGN_OR_RETURN(c.max_position_embeddings, Field<int64_t>(j, "max_position_embeddings", path));
  E3_ASSIGN_OR_RETURN(c.rope.theta, Field<double>(j, "rope_theta", path));
  E3_ASSIGN_OR_RETURN(c.block_size, Field<int64_t>(j, "block_size", path));
  E3_ASSIGN_OR_RETURN(c.num_target_layers, Field<int64_t>(j, "num_target_layers", path));
  E3_ASSIGN_OR_RETURN(const json dflash, Field<json>(j, "dflash_config", path));
  const std::string where = absl::StrCat(path, " dflash_config");
  E3_ASSIGN_OR_RETURN(c.mask_token_id, Field<int64_t>(dflash, "mask_token_id", where));
  E3_ASSIGN_OR_RETURN(c.target_layer_ids, Field<std::vector<int32_t>>(dflash, "target_layer_ids", where));
  if (j.contains("e3_target")) {
    E3_ASSIGN_OR_RETURN(c.target, TargetIdentityFromJson(j.at("e3_target"), path));
  }
  if (absl::Status valid = c.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", valid.message()));
  }
  return c;
}

absl::Status DFlashDraftImpl::Export(const std::string& dir, const DraftExportOptions& options) const {
  E3_ASSIGN_OR_RETURN(std::string config_text, DFlashConfigJson(config_, options.dtype, options.extra));
  E3_RETURN_IF_ERROR(MakeDirs(dir));
  std::vector<TensorToWrite> tensors;
  try {
    for (const auto& [name, param] : ExportedParameters()) {
      E3_ASSIGN_OR_RETURN(TensorToWrite t, TensorToWritable(name, param.detach().to(options.dtype)));
      tensors.push_back(std::move(t));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("DFlash draft export to ", dir, ": ", e.what_without_backtrace()));
  }
  E3_RETURN_IF_ERROR(WriteSafetensors(JoinPath(dir, kDraftWeightsFile), tensors, {{"format", "pt"}}));
  return WriteFileAtomically(JoinPath(dir, kDraftConfigFile), config_text);
}

absl::Status DFlashDraftImpl::LoadExport(const std::string& dir, OtherTarget other_target) {
  const std::string config_path = JoinPath(dir, kDraftConfigFile);
  E3_ASSIGN_OR_RETURN(const DFlashDraftConfig file_config, ReadDFlashConfig(config_path));
  E3_RETURN_IF_ERROR(CheckConfigMatches(file_config, config_, config_path));
  E3_RETURN_IF_ERROR(CheckSameTarget(file_config.target, config_.target, config_path, other_target));
  E3_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(JoinPath(dir, kDraftWeightsFile)));
  // Every name and shape before the first copy: a file that fails leaves
  // the draft as it was.
  const auto params = ExportedParameters();
  for (const auto& [name, param] : params) {
    E3_ASSIGN_OR_RETURN(TensorView view, file->Get(name));
    if (view.shape != param.sizes().vec()) {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": tensor \"", name, "\": expected shape ",
                                                     c10::str(param.sizes()), ", got [",
                                                     absl::StrJoin(view.shape, ", "), "]"));
    }
  }
  for (const std::string& name : file->Names()) {
    bool known = false;
    for (const auto& p : params) known = known || p.first == name;
    if (!known) return absl::InvalidArgumentError(absl::StrCat(file->path(), ": unexpected tensor \"", name, "\""));
  }
  torch::NoGradGuard no_grad;
  for (auto [name, param] : params) {
    E3_ASSIGN_OR_RETURN(TensorView view, file->Get(name));
    E3_ASSIGN_OR_RETURN(at::Tensor value, ViewToTensor(view, param.scalar_type(), param.device()));
    param.copy_(value);  // keeps the flat buffer's view
  }
  return absl::OkStatus();
}

}  // namespace e3
