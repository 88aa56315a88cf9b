#include "common/model/target_identity.h"

#include <openssl/evp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace e3 {

std::string Sha256Hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

TargetIdentity IdentifyTarget(const ModelConfig& config, const std::string& model_dir) {
  TargetIdentity t;
  const nlohmann::json raw = nlohmann::json::parse(config.raw_json, nullptr, /*allow_exceptions=*/false);
  if (raw.is_object() && raw.contains("_name_or_path") && raw["_name_or_path"].is_string() &&
      !raw["_name_or_path"].get<std::string>().empty()) {
    t.name_or_path = raw["_name_or_path"].get<std::string>();
  } else {
    t.name_or_path = model_dir;
  }
  t.architecture = config.architecture_name;
  t.num_hidden_layers = config.num_hidden_layers;
  t.config_sha256 = Sha256Hex(config.raw_json);
  return t;
}

nlohmann::json TargetIdentityToJson(const TargetIdentity& t) {
  return {{"name_or_path", t.name_or_path},
          {"architectures", nlohmann::json::array({t.architecture})},
          {"num_hidden_layers", t.num_hidden_layers},
          {"config_sha256", t.config_sha256}};
}

absl::StatusOr<TargetIdentity> TargetIdentityFromJson(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](const std::string& field, const std::string& expected) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", field, ": expected ", expected));
  };
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected an object"));
  TargetIdentity t;
  if (!j.contains("name_or_path") || !j["name_or_path"].is_string()) return bad("name_or_path", "a string");
  t.name_or_path = j["name_or_path"].get<std::string>();
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      !j["architectures"][0].is_string()) {
    return bad("architectures", "a list of one architecture name");
  }
  t.architecture = j["architectures"][0].get<std::string>();
  if (!j.contains("num_hidden_layers") || !j["num_hidden_layers"].is_number_integer()) {
    return bad("num_hidden_layers", "an integer");
  }
  t.num_hidden_layers = j["num_hidden_layers"].get<int64_t>();
  if (!j.contains("config_sha256") || !j["config_sha256"].is_string() ||
      j["config_sha256"].get<std::string>().size() != 64) {
    return bad("config_sha256", "64 hex digits");
  }
  t.config_sha256 = j["config_sha256"].get<std::string>();
  return t;
}

}  // namespace e3
