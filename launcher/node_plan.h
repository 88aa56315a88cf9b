// The layout of a one-node run, computed from the run config alone before
// anything starts: which processes (teachers cut into TP groups of
// teachers.tp devices, one data shard each; one student rank per student
// device), on which device, with which flags, environment, ports,
// rendezvous files and logs; and what each holds in memory. e3_launch
// prints it (--plan) and starts it.
#ifndef E3_LAUNCHER_NODE_PLAN_H_
#define E3_LAUNCHER_NODE_PLAN_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_config.h"
#include "common/model/model_config.h"
#include "launcher/memory_estimate.h"

namespace e3 {

struct PlannedProcess {
  std::string name;  // teacher-0, teacher-0-rank1, student-0
  bool teacher = false;
  int index = 0;       // the teacher, or the student rank
  int rank = 0;        // the teacher's TP rank, or the student rank
  std::string device;  // cpu or cuda:N
  std::string binary;
  std::vector<std::string> args;  // students get --teacher=... once the teachers serve
  std::vector<std::pair<std::string, std::string>> env;
  std::string log;
  int metrics_port = -1;                 // /metrics: a port, 0 picked at start, -1 none
  std::optional<MemoryEstimate> memory;  // when the model's config.json was readable
};

struct NodePlan {
  RunConfig config;
  std::string resolved_config;  // <out>/run.yaml: the file every process reads
  int teachers = 0;             // TP groups
  // Start order: each teacher's followers before its rank 0 (the group's
  // store waits for rank 0), then the students.
  std::vector<PlannedProcess> processes;
  std::vector<std::string> port_files;  // teacher i's rank 0 writes its gRPC port here
  std::string auth_token;               // the shared token every process reads
  // The c10d FileStores, new to this launch (run_directory.h): teacher i's
  // TP group (under TP > 1), the students' data-parallel group (for more
  // than one rank); empty where there is no group.
  std::string rendezvous_dir;
  std::vector<std::string> teacher_rendezvous;
  std::string student_rendezvous;
  std::string step_log;  // student rank 0's step log
  std::string plot;      // the PNG drawn at the end
  std::optional<ModelConfig> model;
  std::string model_error;         // why `model` is missing
  std::vector<std::string> notes;  // what the config says that planning ignores, and why
};

// "0" -> cuda:0, "cpu" -> cpu. An error names the entry.
absl::StatusOr<std::string> DeviceName(const std::string& entry, const std::string& key);

// Checks what the launcher needs beyond the file's own rules: the model,
// the data and both device lists given, and no flag the launcher sets
// itself in an args list (owned_flags.h; every such flag at once).
// `build_dir` holds teacher_server/ and student_trainer/; `launch_id`
// names this launch's rendezvous files.
absl::StatusOr<NodePlan> PlanNode(const RunConfig& config, const std::string& build_dir,
                                  const std::string& launch_id);

// The plan as --plan prints it.
std::string DescribePlan(const NodePlan& plan);

}  // namespace e3

#endif  // E3_LAUNCHER_NODE_PLAN_H_
