#include "common/config/config_file.h"

#include <yaml-cpp/yaml.h>

#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"

namespace e3 {
namespace {

std::string KnownKeys(const std::string& section) {
  std::vector<std::string> names;
  for (const Setting& s : AllSettings()) {
    if (s.section == section) names.push_back(s.key);
  }
  return absl::StrJoin(names, ", ");
}

bool IsSection(const std::string& name) {
  for (const std::string& s : SettingSections()) {
    if (s == name) return true;
  }
  return false;
}

absl::Status KeyError(const std::string& where, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", path, ": ", what));
}

absl::Status UnknownKey(const std::string& where, const std::string& path) {
  const std::string section = path.substr(0, path.find('.'));
  if (path.find('.') == std::string::npos || !IsSection(section)) {
    return KeyError(where, path,
                    absl::StrCat("unknown key (sections: ", absl::StrJoin(SettingSections(), ", "), ")"));
  }
  return KeyError(where, path, absl::StrCat("unknown key (", section, " has: ", KnownKeys(section), ")"));
}

// A YAML node as a raw value; false for a map or a list of non-scalars.
bool ToRaw(const YAML::Node& node, RawValue* raw) {
  if (node.IsNull()) return true;
  if (node.IsScalar()) {
    raw->scalar = node.Scalar();
    return true;
  }
  if (!node.IsSequence()) return false;
  raw->is_list = true;
  for (const YAML::Node& item : node) {
    if (!item.IsScalar()) return false;
    raw->items.push_back(item.Scalar());
  }
  return true;
}

// YAML leaves a repeated key to the reader; yaml-cpp keeps both and the
// last would silently win, so a key given twice is an error naming both
// lines. `first_line` remembers each name's line (1-based).
absl::Status CheckOnce(const YAML::Node& key, const std::string& path, const std::string& source,
                       std::map<std::string, int>* first_line) {
  const int line = key.Mark().line + 1;
  auto [it, inserted] = first_line->emplace(path, line);
  if (inserted) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(source, ":", line, ": ", path, ": given twice (first on line ", it->second, ")"));
}

absl::Status ReadSection(const std::string& name, const YAML::Node& body, const std::string& source,
                         std::map<std::string, int>* seen, RunConfig& config) {
  if (body.IsNull()) return absl::OkStatus();
  if (!body.IsMap()) return KeyError(source, name, absl::StrCat("expected a map (keys: ", KnownKeys(name), ")"));
  for (const auto& entry : body) {
    const std::string path = absl::StrCat(name, ".", entry.first.as<std::string>());
    E3_RETURN_IF_ERROR(CheckOnce(entry.first, path, source, seen));
    const Setting* setting = FindSetting(path);
    if (setting == nullptr) return UnknownKey(source, path);
    RawValue raw;
    if (!ToRaw(entry.second, &raw)) {
      return KeyError(source, path, absl::StrCat("expected ", setting->expected, ", got a map"));
    }
    E3_RETURN_IF_ERROR(ApplySetting(*setting, raw, source, config));
  }
  return absl::OkStatus();
}

absl::Status ReadDocument(const YAML::Node& root, const std::string& source, RunConfig& config) {
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a map of sections (", absl::StrJoin(SettingSections(), ", "), ")"));
  }
  std::map<std::string, int> seen;
  for (const auto& section : root) {
    const std::string name = section.first.as<std::string>();
    E3_RETURN_IF_ERROR(CheckOnce(section.first, name, source, &seen));
    if (!IsSection(name)) {
      return KeyError(source, name,
                      absl::StrCat("unknown section (sections: ", absl::StrJoin(SettingSections(), ", "), ")"));
    }
    E3_RETURN_IF_ERROR(ReadSection(name, section.second, source, &seen, config));
  }
  return absl::OkStatus();
}

// A base port whose `count` processes take base, base + 1, ...: the last
// must still be a port.
absl::Status CheckPortRange(const RunConfig& c, const std::string& key, int64_t base, int64_t count,
                            const std::string& what) {
  constexpr int64_t kLastPort = 65535;
  if (base <= 0 || base + count - 1 <= kLastPort) return absl::OkStatus();
  return KeyError(c.source, key,
                  absl::StrCat(base, " + ", count, " ", what, " - 1 = ", base + count - 1,
                               " is past the last port (", kLastPort, ")"));
}

}  // namespace

absl::Status ApplySetting(const Setting& setting, const RawValue& value, const std::string& where,
                          RunConfig& config) {
  std::string text;
  if (!setting.set(value, config, &text)) {
    return KeyError(where, setting.path, absl::StrCat("expected ", setting.expected, ", got ", value.Describe()));
  }
  config.given[setting.path] = text;
  return absl::OkStatus();
}

absl::Status ApplyYaml(const std::string& yaml, const std::string& source, RunConfig& config) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  return ReadDocument(root, source, config);
}

absl::Status ApplyOverride(const std::string& override_text, RunConfig& config) {
  const std::string where = absl::StrCat("override '", override_text, "'");
  const size_t eq = override_text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected section.key=value"));
  }
  const std::string path(absl::StripAsciiWhitespace(override_text.substr(0, eq)));
  const Setting* setting = FindSetting(path);
  if (setting == nullptr) return UnknownKey(where, path);
  RawValue raw;
  raw.scalar = std::string(absl::StripAsciiWhitespace(override_text.substr(eq + 1)));
  // A flow list ([0, 1]) or a quoted string reads as YAML; anything YAML
  // cannot read is taken as written.
  if (absl::StartsWith(raw.scalar, "[") || absl::StartsWith(raw.scalar, "\"") ||
      absl::StartsWith(raw.scalar, "'")) {
    try {
      RawValue parsed;
      if (ToRaw(YAML::Load(raw.scalar), &parsed)) raw = parsed;
    } catch (const YAML::Exception&) {
    }
  }
  return ApplySetting(*setting, raw, where, config);
}

absl::Status CheckConsistent(const RunConfig& c) {
  if (c.teachers.tp % c.teachers.ep != 0) {
    return KeyError(c.source, "teachers.ep",
                    absl::StrCat(c.teachers.ep, " does not divide teachers.tp (", c.teachers.tp,
                                 "): experts are split over a teacher's TP ranks"));
  }
  if (!c.teachers.devices.empty() && static_cast<int64_t>(c.teachers.devices.size()) % c.teachers.tp != 0) {
    return KeyError(c.source, "teachers.devices",
                    absl::StrCat(c.teachers.devices.size(), " devices do not divide into groups of ",
                                 "teachers.tp (", c.teachers.tp, ")"));
  }
  const int64_t teacher_groups = static_cast<int64_t>(c.teachers.devices.size()) / c.teachers.tp;
  E3_RETURN_IF_ERROR(
      CheckPortRange(c, "teachers.metrics_port", c.teachers.metrics_port, teacher_groups, "teacher group(s)"));
  return CheckPortRange(c, "students.metrics_port", c.students.metrics_port,
                        static_cast<int64_t>(c.students.devices.size()), "student rank(s)");
}

absl::StatusOr<RunConfig> ParseRunConfig(const std::string& yaml, const std::string& source,
                                         const std::vector<std::string>& overrides) {
  RunConfig config;
  config.source = source;
  E3_RETURN_IF_ERROR(ApplyYaml(yaml, source, config));
  for (const std::string& o : overrides) E3_RETURN_IF_ERROR(ApplyOverride(o, config));
  E3_RETURN_IF_ERROR(CheckConsistent(config));
  return config;
}

absl::StatusOr<RunConfig> LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides) {
  E3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseRunConfig(text, path, overrides);
}

std::string RunConfigToYaml(const RunConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const std::string& section : SettingSections()) {
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const Setting& s : AllSettings()) {
      if (s.section != section) continue;
      const RawValue value = s.get(config);
      out << YAML::Key << s.key << YAML::Value;
      if (value.is_list) {
        out << YAML::Flow << value.items;
      } else {
        out << YAML::DoubleQuoted << value.scalar;
      }
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace e3
