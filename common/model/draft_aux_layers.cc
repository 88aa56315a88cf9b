#include "common/model/draft_aux_layers.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"

namespace e3 {
namespace {

constexpr char kKey[] = "eagle_aux_hidden_state_layer_ids";

absl::StatusOr<std::vector<int32_t>> IdList(const nlohmann::json& ids, const std::string& path,
                                            const std::string& key) {
  if (!ids.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field \"", key, "\": expected a list"));
  }
  std::vector<int32_t> out;
  for (const nlohmann::json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": field \"", key, "\": expected integers >= 0"));
    }
    out.push_back(id.get<int32_t>());
  }
  return out;
}

}  // namespace

std::vector<int32_t> VllmAuxLayerIds(const std::vector<int32_t>& ids) {
  std::vector<int32_t> out;
  for (int32_t id : ids) out.push_back(id + 1);
  return out;
}

absl::StatusOr<std::vector<int32_t>> ReadDraftAuxLayerIds(const nlohmann::json& root, const std::string& path) {
  if (root.is_object() && root.contains("dflash_config") && root["dflash_config"].is_object() &&
      root["dflash_config"].contains("target_layer_ids")) {
    return IdList(root["dflash_config"]["target_layer_ids"], path, "dflash_config.target_layer_ids");
  }
  if (!root.is_object() || !root.contains("eagle_config") || !root["eagle_config"].is_object() ||
      !root["eagle_config"].contains(kKey)) {
    return std::vector<int32_t>{};
  }
  E3_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                      IdList(root["eagle_config"][kKey], path, absl::StrCat("eagle_config.", kKey)));
  if (root.contains(kKey)) {
    E3_ASSIGN_OR_RETURN(std::vector<int32_t> vllm, IdList(root[kKey], path, kKey));
    if (vllm != VllmAuxLayerIds(ids)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": field \"", kKey, "\" is [", absl::StrJoin(vllm, ", "), "], but eagle_config's [",
          absl::StrJoin(ids, ", "), "] in vLLM's numbering (the state entering layer i + 1) is [",
          absl::StrJoin(VllmAuxLayerIds(ids), ", "), "]: SGLang and vLLM would serve different layers"));
    }
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> ReadDraftAuxLayerIds(const std::string& config_json_path) {
  E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(config_json_path));
  const nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_json_path, ": not a JSON object"));
  }
  return ReadDraftAuxLayerIds(root, config_json_path);
}

std::vector<int32_t> DFlashTargetLayerIds(int64_t num_target_layers, int64_t num_draft_layers) {
  if (num_draft_layers <= 1) return {static_cast<int32_t>(num_target_layers / 2)};
  const double first = 1, last = static_cast<double>(num_target_layers - 3);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < num_draft_layers; ++i) {
    ids.push_back(static_cast<int32_t>(
        std::nearbyint(first + static_cast<double>(i) * (last - first) / static_cast<double>(num_draft_layers - 1))));
  }
  return ids;
}

std::vector<int32_t> DefaultDraftAuxLayerIds(const std::string& algorithm, int64_t dflash_layers,
                                             const ModelConfig& target) {
  if (algorithm == "dflash") return DFlashTargetLayerIds(target.num_hidden_layers, dflash_layers);
  return target.DefaultAuxLayerIds();
}

absl::StatusOr<std::vector<int32_t>> DraftAuxLayerIds(const std::string& algorithm,
                                                      const std::vector<int64_t>& configured,
                                                      const std::string& init_from, int64_t dflash_layers,
                                                      const ModelConfig& target) {
  std::vector<int32_t> ids;
  for (int64_t id : configured) {
    if (id < 0 || id > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("draft.aux_layer_ids (--aux_layer_ids): ", id,
                                                     " is not a layer id; expected ids in [0, ",
                                                     target.num_hidden_layers - 2, "]"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  if (ids.empty() && !init_from.empty()) {
    E3_ASSIGN_OR_RETURN(ids, ReadDraftAuxLayerIds(JoinPath(init_from, "config.json")));
  }
  if (ids.empty()) ids = DefaultDraftAuxLayerIds(algorithm, dflash_layers, target);
  if (absl::Status s = CheckAuxLayerIds(ids, target.num_hidden_layers); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("draft.aux_layer_ids (--aux_layer_ids) [",
                                                   absl::StrJoin(ids, ", "), "]: ", s.message()));
  }
  return ids;
}

std::vector<int32_t> AuxLayerUnion(const std::vector<std::vector<int32_t>>& lists) {
  std::vector<int32_t> out;
  if (lists.empty()) return out;
  for (int32_t id : lists.front()) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  std::set<int32_t> rest;
  for (size_t i = 1; i < lists.size(); ++i) {
    for (int32_t id : lists[i]) {
      if (std::find(out.begin(), out.end(), id) == out.end()) rest.insert(id);
    }
  }
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace e3
