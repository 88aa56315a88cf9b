#include "common/service_flags.h"

#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace e3 {
namespace {

// absl keeps the names it saw on the command line and in --flagfile; this
// is the one query it has for them.
bool OnCommandLine(const std::string& name) {
  return absl::flags_internal::WasPresentOnCommandLine(name);
}

absl::Status CopyDeprecated(const DeprecatedFlag& d, SettledFlags* settled) {
  if (!OnCommandLine(d.old_name)) return absl::OkStatus();
  if (OnCommandLine(d.new_name)) {
    return absl::InvalidArgumentError(absl::StrCat("--", d.old_name, " and --", d.new_name,
                                                   " are the same flag; give only --", d.new_name));
  }
  absl::CommandLineFlag* old_flag = absl::FindCommandLineFlag(d.old_name);
  absl::CommandLineFlag* new_flag = absl::FindCommandLineFlag(d.new_name);
  if (old_flag == nullptr || new_flag == nullptr) {
    return absl::InternalError(absl::StrCat("deprecated flag --", d.old_name, " -> --", d.new_name,
                                            ": one of them is not defined"));
  }
  std::string error;
  if (!new_flag->ParseFrom(old_flag->CurrentValue(), &error)) {
    return absl::InvalidArgumentError(absl::StrCat("--", d.old_name, ": ", error));
  }
  settled->warnings.push_back(absl::StrCat("--", d.old_name, " is deprecated; use --", d.new_name));
  return absl::OkStatus();
}

// The flag a config entry sets: `flag` itself, or for a bare `--noname`
// in an args list the boolean `name`, off.
absl::CommandLineFlag* Resolve(ServiceFlag* f) {
  if (absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f->flag)) return flag;
  if (f->value == "true" && absl::StartsWith(f->flag, "no")) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f->flag.substr(2));
    if (flag != nullptr) {
      f->flag = f->flag.substr(2);
      f->value = "false";
    }
    return flag;
  }
  return nullptr;
}

}  // namespace

const std::vector<DeprecatedFlag>& DeprecatedFlags(ServiceRole role) {
  static const std::vector<DeprecatedFlag>* const teacher = new std::vector<DeprecatedFlag>{
      {"seed", "data_seed"},
      {"max_credit_window", "credit_window"},
      {"tp_master_addr", "master_addr"},
      {"tp_master_port", "master_port"},
  };
  static const std::vector<DeprecatedFlag>* const student =
      new std::vector<DeprecatedFlag>{{"seed", "init_seed"}};
  return role == ServiceRole::kTeacher ? *teacher : *student;
}

bool FlagGiven(const std::string& name, const std::vector<DeprecatedFlag>& deprecated) {
  if (OnCommandLine(name)) return true;
  for (const DeprecatedFlag& d : deprecated) {
    if (d.new_name == name && OnCommandLine(d.old_name)) return true;
  }
  return false;
}

absl::StatusOr<SettledFlags> SettleServiceFlags(const std::string& config_path, ServiceRole role,
                                                const std::vector<DeprecatedFlag>& deprecated) {
  SettledFlags settled;
  for (const DeprecatedFlag& d : deprecated) E3_RETURN_IF_ERROR(CopyDeprecated(d, &settled));
  if (config_path.empty()) return settled;
  E3_ASSIGN_OR_RETURN(const RunConfig config, LoadRunConfig(config_path));
  E3_ASSIGN_OR_RETURN(std::vector<ServiceFlag> flags, ServiceFlags(config, role));
  for (ServiceFlag& f : flags) {
    absl::CommandLineFlag* flag = Resolve(&f);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": ", f.key, ": --", f.flag, " is not a flag of this program"));
    }
    if (FlagGiven(f.flag, deprecated)) {
      ++settled.overridden;
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(f.value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": ", f.key, ": --", f.flag, "=", f.value, ": ", error));
    }
    ++settled.from_config;
  }
  return settled;
}

}  // namespace e3
