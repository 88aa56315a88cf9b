// The registry of settings.h's rows: for each setting its path, type and
// expectations in words, its help, who reads it, its flag, its default,
// and how a value is stored into a RunConfig and read back as text. Every
// reader and writer of settings (YAML, overrides, command lines, --help,
// the resolved run.yaml, docs/config.md) goes through it.
#ifndef E3_COMMON_CONFIG_SETTING_H_
#define E3_COMMON_CONFIG_SETTING_H_

#include <functional>
#include <string>
#include <vector>

#include "common/config/run_config.h"

namespace e3 {

// A value as a file, an override or a command line wrote it: a scalar, or
// a list of scalars.
struct RawValue {
  bool is_list = false;
  std::string scalar;
  std::vector<std::string> items;
  std::string Describe() const;  // as an error quotes it
};

struct Setting {
  std::string section;  // the YAML section: "schedule"
  std::string key;      // "lr"
  std::string path;     // "schedule.lr"
  std::string type;     // for the reference: "integer", "number", "bool", "string", "list"
  std::string expected;  // "a number in [0, 1]"
  std::string help;
  unsigned roles = 0;  // SettingRole bits
  std::string flag;    // the command-line name; empty: none
  std::string default_text;
  Check check;  // what a value must be (checks.h)
  bool is_bool = false;
  bool is_list = false;
  char list_separator = ',';  // how a list is written as one scalar: ',' or ' '
  // Stores `value` into the config; false when it is not what `expected`
  // says (the config is then unchanged). *text receives it as text.
  std::function<bool(const RawValue& value, RunConfig& config, std::string* text)> set;
  // The config's value, as a list for list settings.
  std::function<RawValue(const RunConfig& config)> get;

  bool ReadBy(unsigned role) const { return (roles & role) != 0; }
};

// Every setting, in the order of settings.h.
const std::vector<Setting>& AllSettings();
// The setting at `path` ("schedule.lr"), or null.
const Setting* FindSetting(const std::string& path);
// The section names, in order.
const std::vector<std::string>& SettingSections();

// A flag's old spelling, still taken by the processes in `roles` with a
// deprecation warning.
struct DeprecatedFlag {
  std::string old_flag;
  unsigned roles;
  std::string path;  // the setting it sets
};
const std::vector<DeprecatedFlag>& DeprecatedFlags();

// The setting `flag` names for a process of `role` (its own flag, or an
// old spelling, when *old_spelling is set), or null.
const Setting* SettingOfFlag(const std::string& flag, unsigned role, bool* old_spelling = nullptr);

// The value as one line of text (a list joined by its separator).
std::string ValueText(const Setting& setting, const RawValue& value);

}  // namespace e3

#endif  // E3_COMMON_CONFIG_SETTING_H_
