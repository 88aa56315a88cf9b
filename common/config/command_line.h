// A process's command line read against the settings (settings.h), for
// teacher_server, student_trainer and e3_launch alike:
//   --config=run.yaml     the run config, read first (the launcher: its run)
//   --flag=value          a setting this process reads, by its flag
//   --section.key=value   the same by its path
//   --flag / --noflag     a bool setting on or off
//   --flagfile=FILE       more arguments, one per line
//   --help                every setting this process reads, with its default
//   --preview_data=N      teacher_server only: print the first N lines of the
//                         training data as the teacher trains on them, exit
// Later sources win: a setting's default, the config file, the config's
// teachers.args / students.args for a service, then the command line. An
// old spelling of a flag is taken with a warning; an unknown flag is an
// error naming it.
#ifndef E3_COMMON_CONFIG_COMMAND_LINE_H_
#define E3_COMMON_CONFIG_COMMAND_LINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_config.h"

namespace e3 {

struct CommandLine {
  RunConfig config;
  std::string config_path;              // --config, when given
  std::vector<std::string> positional;  // arguments that are no flags (the launcher's overrides)
  std::vector<std::string> warnings;    // one per old spelling used
  bool help = false;                    // --help: print Usage and exit
  // teacher_server --preview_data=N (0: not asked): an action, like --help,
  // not a setting: a run config that carried it would make every teacher
  // the launcher starts print and exit instead of serving.
  int64_t preview_data = 0;
  int from_file = 0;                    // settings the config file gave
  int overridden = 0;                   // of those, set again on the command line
};

// `role`: kTeacher, kStudent or kLauncher (settings.h).
absl::StatusOr<CommandLine> ReadCommandLine(const std::vector<std::string>& args, unsigned role);
absl::StatusOr<CommandLine> ReadCommandLine(int argc, char** argv, unsigned role);

// What --help prints: `summary`, then every setting `role` reads, by
// section, with its flag, type, default and help.
std::string Usage(unsigned role, const std::string& summary);

// A service's command line as its main takes it: the command line, or the
// code to exit with now (0 after --help, printed; 2 after an error, printed
// to stderr after `program`). Warnings for old spellings go to stderr.
struct ServiceCommandLine {
  std::optional<CommandLine> command_line;
  int exit_code = 0;
};
ServiceCommandLine ReadServiceCommandLine(int argc, char** argv, unsigned role, const char* program,
                                          const std::string& summary);

}  // namespace e3

#endif  // E3_COMMON_CONFIG_COMMAND_LINE_H_
