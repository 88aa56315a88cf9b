// The run config as YAML: a file of sections (examples/configs/), dotted
// overrides ("schedule.lr=2e-4", the value read as YAML: `[0, 1]` or
// `0,1` for a list), and the resolved file every process of a launch reads.
// Errors name the file, the line where one is known, the key and what was
// expected:
//   run.yaml: teachers.tp: expected a positive integer, got "x"
#ifndef E3_COMMON_CONFIG_CONFIG_FILE_H_
#define E3_COMMON_CONFIG_CONFIG_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_config.h"
#include "common/config/setting.h"

namespace e3 {

// Reads `path` over the defaults, then applies `overrides`.
absl::StatusOr<RunConfig> LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from text; `source` names it in errors.
absl::StatusOr<RunConfig> ParseRunConfig(const std::string& yaml, const std::string& source,
                                         const std::vector<std::string>& overrides = {});

// Applies a YAML document's keys to `config` (given in `config.given`).
absl::Status ApplyYaml(const std::string& yaml, const std::string& source, RunConfig& config);
// Applies one "section.key=value".
absl::Status ApplyOverride(const std::string& override_text, RunConfig& config);
// Sets `setting` from `value`; `where` prefixes the error.
absl::Status ApplySetting(const Setting& setting, const RawValue& value, const std::string& where,
                          RunConfig& config);
// The checks between keys, once every value is in (ep divides tp, devices
// divide into TP groups, fixed metrics ports stay ports).
absl::Status CheckConsistent(const RunConfig& config);

// Every setting as YAML, section by section: what a process reading the
// file takes is exactly `config`.
std::string RunConfigToYaml(const RunConfig& config);

}  // namespace e3

#endif  // E3_COMMON_CONFIG_CONFIG_FILE_H_
