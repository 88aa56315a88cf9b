#include "common/config/command_line.h"

#include <cstdio>

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/config/config_file.h"
#include "common/config/setting.h"

namespace e3 {
namespace {

std::string Program(unsigned role) {
  if (role == kTeacher) return "teacher_server";
  if (role == kStudent) return "student_trainer";
  return "e3_launch";
}

// One "--name[=value]" argument, split; value_given says whether "=" was there.
struct FlagArg {
  std::string name;
  std::string value;
  bool value_given = false;
};

bool IsFlag(const std::string& arg) { return absl::StartsWith(arg, "-") && arg.size() > 1 && arg != "--"; }

FlagArg SplitFlag(const std::string& arg) {
  std::string body = std::string(absl::StripPrefix(absl::StripPrefix(arg, "-"), "-"));
  FlagArg f;
  const size_t eq = body.find('=');
  f.value_given = eq != std::string::npos;
  f.name = body.substr(0, eq);
  if (f.value_given) f.value = body.substr(eq + 1);
  return f;
}

// --flagfile's lines, in place of the argument; comments (#) and blank
// lines skipped.
absl::StatusOr<std::vector<std::string>> Expand(const std::vector<std::string>& args, int depth = 0) {
  std::vector<std::string> out;
  for (const std::string& arg : args) {
    const FlagArg f = IsFlag(arg) ? SplitFlag(arg) : FlagArg{};
    if (f.name != "flagfile") {
      out.push_back(arg);
      continue;
    }
    if (depth > 8) return absl::InvalidArgumentError(absl::StrCat("--flagfile=", f.value, ": nested too deep"));
    E3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(f.value));
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (!line.empty() && line[0] != '#') lines.emplace_back(line);
    }
    E3_ASSIGN_OR_RETURN(std::vector<std::string> expanded, Expand(lines, depth + 1));
    out.insert(out.end(), expanded.begin(), expanded.end());
  }
  return out;
}

// Who reads `s`, for an error about a flag this process does not take.
std::string Readers(const Setting& s) {
  std::vector<std::string> who;
  for (unsigned role : {kTeacher, kStudent, kLauncher}) {
    if (s.ReadBy(role)) who.push_back(Program(role));
  }
  return who.empty() ? "nobody" : absl::StrJoin(who, " and ");
}

// The setting a flag names for `role`, with its value as a raw value.
absl::StatusOr<const Setting*> Resolve(const FlagArg& f, unsigned role, CommandLine* out) {
  bool old_spelling = false;
  const Setting* s = SettingOfFlag(f.name, role, &old_spelling);
  bool negated = false;
  if (s == nullptr && absl::StartsWith(f.name, "no") && !f.value_given) {
    s = SettingOfFlag(f.name.substr(2), role, &old_spelling);
    negated = s != nullptr && s->is_bool;
    if (!negated) s = nullptr;
  }
  if (s == nullptr && f.name.find('.') != std::string::npos) s = FindSetting(f.name);
  // The launcher's flags are its own section's; the rest of a run is set
  // by the config and its section.key=value overrides.
  if (s != nullptr && role == kLauncher && f.name.find('.') == std::string::npos && s->section != "launcher") {
    s = nullptr;
  }
  if (s == nullptr) {
    for (const Setting& other : AllSettings()) {
      if (other.flag == f.name) {
        return absl::InvalidArgumentError(absl::StrCat("--", f.name, " (", other.path, ") is not a setting of ",
                                                       Program(role), ": ", Readers(other), " read it"));
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown flag --", f.name, " (", Program(role), " --help lists its flags)"));
  }
  if (!s->ReadBy(role)) {
    return absl::InvalidArgumentError(absl::StrCat("--", f.name, " (", s->path, ") is not a setting of ",
                                                   Program(role), ": ", Readers(*s), " read it"));
  }
  if (old_spelling) {
    out->warnings.push_back(absl::StrCat("--", negated ? f.name.substr(2) : f.name, " is deprecated; use --", s->flag));
  }
  return s;
}

// Applies the flags of `args` (a service's config args, or its command
// line); `where` names them in errors. Positional arguments go to
// out->positional when `positional_allowed`.
absl::Status ApplyFlags(const std::vector<std::string>& args, unsigned role, const std::string& where,
                        bool positional_allowed, CommandLine* out,
                        std::map<std::string, std::string>* set_by_flag) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (!IsFlag(args[i])) {
      if (!positional_allowed) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": expected flags (--name=value), got \"", args[i], "\""));
      }
      out->positional.push_back(args[i]);
      continue;
    }
    FlagArg f = SplitFlag(args[i]);
    if (f.name == "config" || f.name == "help" || f.name == "h" || f.name == "helpfull") continue;
    if (f.name == "preview_data" && role == kTeacher) {
      if (set_by_flag == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": --preview_data is an action of teacher_server's command line, not a setting"));
      }
      if (!f.value_given && i + 1 < args.size() && !IsFlag(args[i + 1])) {
        f.value = args[++i];
        f.value_given = true;
      }
      if (!absl::SimpleAtoi(f.value, &out->preview_data) || out->preview_data < 1) {
        return absl::InvalidArgumentError(absl::StrCat("--preview_data=", f.value,
                                                       ": expected a number of lines, at least 1 (e.g. "
                                                       "--preview_data=3)"));
      }
      continue;
    }
    E3_ASSIGN_OR_RETURN(const Setting* s, Resolve(f, role, out));
    RawValue value;
    if (f.value_given) {
      value.scalar = f.value;
    } else if (s->is_bool) {
      value.scalar = absl::StartsWith(f.name, "no") && f.name.substr(2) == s->flag ? "false" : "true";
    } else if (i + 1 < args.size() && !IsFlag(args[i + 1])) {
      value.scalar = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": --", f.name, " needs a value (", s->expected, ")"));
    }
    if (set_by_flag != nullptr) {
      // A flag given again wins, as the last word does; a flag and its old
      // spelling together are a mistake to name.
      auto [it, inserted] = set_by_flag->emplace(s->path, f.name);
      if (!inserted && it->second != f.name) {
        const std::string first = it->second;
        return absl::InvalidArgumentError(absl::StrCat("--", first == s->flag ? f.name : first, " and --", s->flag,
                                                       " are the same flag; give only --", s->flag));
      }
    }
    const std::string flag_where = set_by_flag != nullptr ? absl::StrCat("--", f.name) : where;
    E3_RETURN_IF_ERROR(ApplySetting(*s, value, flag_where, out->config));
  }
  return absl::OkStatus();
}

std::string ConfigPathOf(const std::vector<std::string>& args) {
  std::string path;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!IsFlag(args[i])) continue;
    const FlagArg f = SplitFlag(args[i]);
    if (f.name != "config") continue;
    path = f.value_given ? f.value : (i + 1 < args.size() ? args[i + 1] : "");
  }
  return path;
}

bool AsksForHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpfull") return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<CommandLine> ReadCommandLine(const std::vector<std::string>& raw_args, unsigned role) {
  CommandLine out;
  E3_ASSIGN_OR_RETURN(const std::vector<std::string> args, Expand(raw_args));
  out.help = AsksForHelp(args);
  out.config_path = ConfigPathOf(args);
  out.config.source = out.config_path.empty() ? "<command line>" : out.config_path;
  if (!out.config_path.empty()) {
    E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(out.config_path));
    E3_RETURN_IF_ERROR(ApplyYaml(text, out.config_path, out.config));
    out.from_file = static_cast<int>(out.config.given.size());
  }
  const std::map<std::string, std::string> from_file = out.config.given;
  // A service takes its section's args as if given on its command line,
  // before the command line itself.
  if (role == kTeacher || role == kStudent) {
    const auto& section_args = role == kTeacher ? out.config.teachers.args : out.config.students.args;
    const std::string where = absl::StrCat(out.config.source, ": ", role == kTeacher ? "teachers" : "students", ".args");
    E3_RETURN_IF_ERROR(ApplyFlags(section_args, role, where, false, &out, nullptr));
  }
  std::map<std::string, std::string> set_by_flag;  // path -> the flag name that set it
  E3_RETURN_IF_ERROR(ApplyFlags(args, role, "command line", role == kLauncher, &out, &set_by_flag));
  for (const auto& [path, flag] : set_by_flag) out.overridden += from_file.count(path) > 0;
  for (const std::string& o : out.positional) E3_RETURN_IF_ERROR(ApplyOverride(o, out.config));
  E3_RETURN_IF_ERROR(CheckConsistent(out.config));
  return out;
}

absl::StatusOr<CommandLine> ReadCommandLine(int argc, char** argv, unsigned role) {
  return ReadCommandLine(std::vector<std::string>(argv + 1, argv + argc), role);
}

// How a setting is given to `role`'s program: a flag, or (the launcher's
// run settings) a section.key=value override.
std::string UsageName(const Setting& s, unsigned role) {
  if (role == kLauncher && s.section != "launcher") return s.path;
  return "--" + s.flag;
}

std::string Usage(unsigned role, const std::string& summary) {
  std::string text = absl::StrCat(summary, "\n\nSettings (flag, or --section.key; in a run config, section.key):\n");
  std::string section;
  for (const Setting& s : AllSettings()) {
    // The launcher writes the whole run config: it lists every setting.
    if (role != kLauncher && !s.ReadBy(role)) continue;
    if (s.section != section) {
      section = s.section;
      absl::StrAppend(&text, "\n", section, ":\n");
    }
    const std::string def = s.default_text.empty() ? "\"\"" : s.default_text;
    absl::StrAppend(&text, "  ", UsageName(s, role), "=<", s.type, ">  (", s.path, "; default ", def, ")\n      ",
                    s.help, "\n");
  }
  absl::StrAppend(&text, "\n  --config=FILE  the run config (YAML; examples/configs/)\n",
                  "  --flagfile=FILE  more arguments, one per line\n");
  if (role == kTeacher) {
    absl::StrAppend(&text,
                    "  --preview_data=N  print the first N lines of the training data as the teacher trains on "
                    "them\n      (its tokenizer and chat template, not its weights; trained tokens between [[ "
                    "and ]]), then exit\n");
  }
  return text;
}

ServiceCommandLine ReadServiceCommandLine(int argc, char** argv, unsigned role, const char* program,
                                          const std::string& summary) {
  ServiceCommandLine out;
  absl::StatusOr<CommandLine> command_line = ReadCommandLine(argc, argv, role);
  if (!command_line.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", program, std::string(command_line.status().message()).c_str());
    out.exit_code = 2;
    return out;
  }
  if (command_line->help) {
    std::printf("%s", Usage(role, summary).c_str());
    return out;
  }
  for (const std::string& w : command_line->warnings) std::fprintf(stderr, "%s: warning: %s\n", program, w.c_str());
  out.command_line = std::move(command_line).value();
  return out;
}

}  // namespace e3
