// What the tokenizer.json readers (tokenizer, normalizer, post-processor)
// share to report a bad field: the value rendered for a message, and an
// error that names the file and the field.
#ifndef E3_COMMON_TEXT_TOKENIZER_JSON_H_
#define E3_COMMON_TEXT_TOKENIZER_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace e3::tokenizer_json {

// Renders a JSON value for an error message; never throws.
inline std::string Show(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline absl::Status FieldError(const std::string& path, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " ", what));
}

// `obj[key]` as a bool: absent or null gives `fallback`.
inline absl::StatusOr<bool> GetBool(const std::string& path, const nlohmann::json& obj, const std::string& field,
                                    const char* key, bool fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return FieldError(path, absl::StrCat(field, ".", key), absl::StrCat("is ", Show(*it), "; expected a boolean"));
  }
  return it->get<bool>();
}

}  // namespace e3::tokenizer_json

#endif  // E3_COMMON_TEXT_TOKENIZER_JSON_H_
