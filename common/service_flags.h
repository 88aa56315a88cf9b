// Where a service's flag values come from, settled once after
// absl::ParseCommandLine, in this order of precedence:
//   1. the flag given on the command line (or in a --flagfile);
//   2. its deprecated spelling given there (a warning says the new name);
//   3. the run config (--config=run.yaml, common/run_config.h);
//   4. the flag's default.
// The services read their flags only after this, into their options.
#ifndef E3_COMMON_SERVICE_FLAGS_H_
#define E3_COMMON_SERVICE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/run_config.h"

namespace e3 {

// A flag renamed so that one meaning has one name across the binaries and
// the launcher (docs/DECISIONS.md, "One name per flag"). Both stay
// defined; the old one says "deprecated" in its help.
struct DeprecatedFlag {
  std::string old_name;
  std::string new_name;
};

// The deprecated spellings of `role`'s flags: the services settle their
// flags with them, and the launcher refuses them in a config's args.
const std::vector<DeprecatedFlag>& DeprecatedFlags(ServiceRole role);

struct SettledFlags {
  int from_config = 0;                // flags set from the run config
  int overridden = 0;                 // config keys the command line overrode
  std::vector<std::string> warnings;  // one per deprecated spelling used
};

// Applies `deprecated` spellings, then the config at `config_path` (none
// when empty) for `role`. Errors name the config file and key, or the
// flags at odds.
absl::StatusOr<SettledFlags> SettleServiceFlags(const std::string& config_path, ServiceRole role,
                                                const std::vector<DeprecatedFlag>& deprecated);

// Whether `name` (or a deprecated spelling of it) was on the command line.
bool FlagGiven(const std::string& name, const std::vector<DeprecatedFlag>& deprecated);

}  // namespace e3

#endif  // E3_COMMON_SERVICE_FLAGS_H_
