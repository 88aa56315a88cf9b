#include "launcher/owned_flags.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/config/setting.h"

namespace e3 {
namespace {

// Each owned flag with what to do instead (it completes "--flag is set by
// e3_launch; ").
using OwnedTable = std::map<std::string, std::string>;

constexpr char kConfig[] =
    "give e3_launch's own --config (every process reads the resolved run.out/run.yaml)";
constexpr char kUnderOut[] = "it writes it under run.out";
constexpr char kRendezvous[] =
    "its c10d groups meet through a fresh file under run.out/rendezvous (nothing listens)";
constexpr char kToken[] = "it writes a fresh token per launch to run.out/auth_token";

const OwnedTable& TeacherOwned() {
  static const OwnedTable* const table = new OwnedTable{
      {"config", kConfig},
      {"device", "use teachers.devices"},
      {"num_data_shards", "use teachers.devices and teachers.tp (each TP group serves one shard)"},
      {"data_shard", "use teachers.devices and teachers.tp (each TP group serves one shard)"},
      {"listen", "it binds every teacher to 127.0.0.1 on a free port"},
      {"port_file", kUnderOut},
      {"ledger", kUnderOut},
      {"exit_when_done", "its teachers exit once every student rank has committed its data"},
      {"tp_size", "use teachers.tp"},
      {"ep_size", "use teachers.ep"},
      {"tp_rank", "use teachers.devices (a group's ranks follow its devices' order)"},
      {"master_addr", kRendezvous},
      {"master_port", kRendezvous},
      {"rendezvous_file", kRendezvous},
      {"auth_token_file", kToken},
      {"metrics_port", "use teachers.metrics_port"},
      {"student_world_size", "use students.devices (one rank per device)"},
  };
  return *table;
}

const OwnedTable& StudentOwned() {
  static const OwnedTable* const table = new OwnedTable{
      {"config", kConfig},
      {"device", "use students.devices"},
      {"checkpoint_dir", kUnderOut},
      {"output_dir", kUnderOut},
      {"summary_json", kUnderOut},
      {"step_log", kUnderOut},
      {"metrics_port", "use students.metrics_port"},
      {"rank", "use students.devices (one rank per device)"},
      {"world_size", "use students.devices (one rank per device)"},
      {"master_addr", kRendezvous},
      {"master_port", kRendezvous},
      {"rendezvous_file", kRendezvous},
      {"teacher", "it connects the students to the teachers it started"},
      {"auth_token_file", kToken},
      {"subscriber_id", "rank r subscribes as rank-<r>, the id its checkpoints resume under"},
      {"best_dir", kUnderOut},
      {"tensorboard_dir", kUnderOut},
  };
  return *table;
}

// The problem with one argument of an args list, or "".
std::string ArgProblem(const std::string& arg, unsigned role) {
  if (!absl::StartsWith(arg, "-")) return absl::StrCat("expected flags (--name=value), got \"", arg, "\"");
  std::string name(absl::StripPrefix(absl::StripPrefix(arg, "-"), "-"));
  name = name.substr(0, name.find('='));
  bool old_spelling = false;
  const Setting* s = SettingOfFlag(name, role, &old_spelling);
  // "--noexit_when_done" turns a boolean off: the same setting.
  if (s == nullptr && absl::StartsWith(name, "no")) s = SettingOfFlag(name.substr(2), role, &old_spelling);
  if (s == nullptr) {
    return absl::StrCat("--", name, " is not a flag of ", role == kTeacher ? "teacher_server" : "student_trainer");
  }
  const OwnedTable& owned = role == kTeacher ? TeacherOwned() : StudentOwned();
  auto it = owned.find(s->flag);
  if (it == owned.end()) return "";
  const std::string spelling = old_spelling ? absl::StrCat(" (an old spelling of --", s->flag, ")") : "";
  return absl::StrCat("--", name, spelling, " is set by e3_launch; ", it->second);
}

}  // namespace

std::vector<std::string> OwnedFlagErrors(const RunConfig& config) {
  std::vector<std::string> errors;
  for (unsigned role : {kTeacher, kStudent}) {
    const std::string key = role == kTeacher ? "teachers.args" : "students.args";
    for (const std::string& arg : role == kTeacher ? config.teachers.args : config.students.args) {
      const std::string problem = ArgProblem(arg, role);
      if (!problem.empty()) errors.push_back(absl::StrCat(config.source, ": ", key, ": ", problem));
    }
  }
  return errors;
}

}  // namespace e3
