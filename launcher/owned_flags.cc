#include "launcher/owned_flags.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/service_flags.h"

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

// The config key that sets `flag` of `role`, or "--flag" when none does.
std::string SetterOf(const std::string& flag, ServiceRole role) {
  for (const RunConfigKey& k : RunConfigKeys()) {
    if ((role == ServiceRole::kTeacher ? k.teacher_flag : k.student_flag) == flag) return k.path;
  }
  return "--" + flag;
}

// The problem with one flag of an args list, or "".
std::string Check(const ServiceFlag& f, ServiceRole role) {
  const OwnedTable& owned = role == ServiceRole::kTeacher ? TeacherOwned() : StudentOwned();
  std::string name = f.flag;
  // "--noexit_when_done" turns an owned boolean off: owned too.
  if (f.value == "true" && absl::StartsWith(name, "no") && owned.count(name.substr(2)) > 0) {
    name = name.substr(2);
  }
  for (const DeprecatedFlag& d : DeprecatedFlags(role)) {
    if (d.old_name != name) continue;
    auto it = owned.find(d.new_name);
    if (it != owned.end()) {
      return absl::StrCat("--", name, " (a deprecated spelling of --", d.new_name,
                          ") is set by e3_launch; ", it->second);
    }
    return absl::StrCat("--", name, " is a deprecated spelling of --", d.new_name,
                        ", which a service takes only on its command line; use ",
                        SetterOf(d.new_name, role));
  }
  auto it = owned.find(name);
  if (it == owned.end()) return "";
  return absl::StrCat("--", f.flag, " is set by e3_launch; ", it->second);
}

}  // namespace

std::vector<std::string> OwnedFlagErrors(const RunConfig& config) {
  std::vector<std::string> errors;
  for (ServiceRole role : {ServiceRole::kTeacher, ServiceRole::kStudent}) {
    const std::string key = role == ServiceRole::kTeacher ? "teachers.args" : "students.args";
    absl::StatusOr<std::vector<ServiceFlag>> flags = ServiceFlags(config, role);
    if (!flags.ok()) {
      errors.emplace_back(flags.status().message());
      continue;
    }
    for (const ServiceFlag& f : *flags) {
      if (f.key != key) continue;
      const std::string problem = Check(f, role);
      if (!problem.empty()) errors.push_back(absl::StrCat(config.source, ": ", key, ": ", problem));
    }
  }
  return errors;
}

}  // namespace e3
