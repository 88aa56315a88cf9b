// Which target model a draft was trained for, recorded in the draft's
// export: the serving engines load a draft beside any target, so the draft
// itself must say which one it belongs to. The config's hash tells two
// checkpoints of one architecture apart.
#ifndef E3_COMMON_MODEL_TARGET_IDENTITY_H_
#define E3_COMMON_MODEL_TARGET_IDENTITY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "nlohmann/json.hpp"

namespace e3 {

struct TargetIdentity {
  // config.json's "_name_or_path" (a hub id, as transformers records it),
  // else the teacher's model directory.
  std::string name_or_path;
  std::string architecture;
  int64_t num_hidden_layers = 0;
  std::string config_sha256;  // of config.json's bytes, hex

  bool empty() const { return config_sha256.empty(); }
};

// The identity of `config` (its raw_json is hashed), served from `model_dir`.
TargetIdentity IdentifyTarget(const ModelConfig& config, const std::string& model_dir);

nlohmann::json TargetIdentityToJson(const TargetIdentity& t);
// `where` prefixes errors ("draft/config.json: e3_target").
absl::StatusOr<TargetIdentity> TargetIdentityFromJson(const nlohmann::json& j, const std::string& where);

// SHA-256 of `bytes`, as 64 hex digits.
std::string Sha256Hex(std::string_view bytes);

}  // namespace e3

#endif  // E3_COMMON_MODEL_TARGET_IDENTITY_H_
