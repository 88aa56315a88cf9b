#include "launcher/node_plan.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "launcher/owned_flags.h"

namespace e3 {
namespace {

absl::Status Required(const RunConfig& c, const std::string& key, bool present) {
  if (present) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(c.source, ": ", key, ": required to launch a run"));
}

// The /metrics port of the process at `offset` from a base port: base +
// offset, or the base itself when it means "picked at start" (0) or
// "none" (-1).
int MetricsPort(int64_t base, int offset) {
  return static_cast<int>(base > 0 ? base + offset : base);
}

// The flags every teacher and student gets from the plan alone.
std::vector<std::string> CommonArgs(const NodePlan& plan, const std::string& device) {
  return {"--config=" + plan.resolved_config, "--device=" + device,
          "--auth_token_file=" + plan.auth_token};
}

std::vector<PlannedProcess> PlanTeachers(const NodePlan& plan, const std::string& build_dir,
                                         const std::vector<std::string>& devices) {
  const RunConfig& c = plan.config;
  const std::string& out = c.run.out;
  const int tp = static_cast<int>(c.teachers.tp);
  const int groups = static_cast<int>(devices.size()) / tp;
  std::vector<PlannedProcess> out_processes;
  for (int i = 0; i < groups; ++i) {
    for (int r = tp - 1; r >= 0; --r) {  // rank 0 last: the group's store waits for it
      PlannedProcess p;
      p.teacher = true;
      p.index = i;
      p.rank = r;
      p.name = r == 0 ? absl::StrCat("teacher-", i) : absl::StrCat("teacher-", i, "-rank", r);
      p.device = devices[i * tp + r];
      p.binary = JoinPath(build_dir, "teacher_server/teacher_server");
      p.log = JoinPath(out, p.name + ".log");
      p.args = CommonArgs(plan, p.device);
      for (const std::string& a :
           {absl::StrCat("--num_data_shards=", groups), absl::StrCat("--data_shard=", i),
            std::string("--listen=127.0.0.1:0"), "--port_file=" + plan.port_files[i],
            "--ledger=" + JoinPath(out, absl::StrCat("ledger-", i, ".jsonl")),
            std::string("--exit_when_done"),
            // The world is the launcher's to say, never a subscriber's.
            absl::StrCat("--student_world_size=", c.students.devices.size())}) {
        p.args.push_back(a);
      }
      // Only rank 0 serves /metrics.
      if (r == 0) {
        p.metrics_port = MetricsPort(c.teachers.metrics_port, i);
        p.args.push_back(absl::StrCat("--metrics_port=", p.metrics_port));
      }
      if (tp > 1) {
        // A loopback master_addr keeps Gloo's connections on loopback too.
        for (const std::string& a :
             {absl::StrCat("--tp_size=", tp), absl::StrCat("--ep_size=", c.teachers.ep),
              absl::StrCat("--tp_rank=", r), std::string("--master_addr=127.0.0.1"),
              "--rendezvous_file=" + plan.teacher_rendezvous[i]}) {
          p.args.push_back(a);
        }
      }
      out_processes.push_back(std::move(p));
    }
  }
  return out_processes;
}

std::vector<PlannedProcess> PlanStudents(const NodePlan& plan, const std::string& build_dir,
                                         const std::vector<std::string>& devices) {
  const RunConfig& c = plan.config;
  const std::string& out = c.run.out;
  const int world = static_cast<int>(devices.size());
  std::vector<PlannedProcess> out_processes;
  for (int r = 0; r < world; ++r) {
    PlannedProcess p;
    p.index = r;
    p.rank = r;
    p.name = absl::StrCat("student-", r);
    p.device = devices[r];
    p.binary = JoinPath(build_dir, "student_trainer/student_trainer");
    p.log = JoinPath(out, p.name + ".log");
    p.metrics_port = MetricsPort(c.students.metrics_port, r);
    p.args = CommonArgs(plan, p.device);
    for (const std::string& a :
         {"--checkpoint_dir=" + JoinPath(out, "checkpoints"),
          "--output_dir=" + JoinPath(out, "draft"),
          "--summary_json=" + JoinPath(out, absl::StrCat("summary-", r, ".json")),
          "--step_log=" + plan.step_log, absl::StrCat("--metrics_port=", p.metrics_port),
          "--best_dir=" + JoinPath(out, "best"), "--tensorboard_dir=" + JoinPath(out, "tb")}) {
      p.args.push_back(a);
    }
    if (world > 1) p.args.push_back("--rendezvous_file=" + plan.student_rendezvous);
    // torchrun's environment: the process rank, never a node rank. A
    // loopback MASTER_ADDR keeps Gloo's connections on loopback.
    p.env = {{"RANK", absl::StrCat(r)},
             {"WORLD_SIZE", absl::StrCat(world)},
             {"LOCAL_RANK", absl::StrCat(r)},
             {"MASTER_ADDR", "127.0.0.1"}};
    out_processes.push_back(std::move(p));
  }
  return out_processes;
}

std::string ModelLine(const NodePlan& plan) {
  const RunConfig& c = plan.config;
  if (!plan.model.has_value()) return absl::StrCat(c.model.dir, " (", plan.model_error, ")");
  const ModelConfig& m = *plan.model;
  std::string moe;
  if (m.moe.num_experts > 0)
    moe = absl::StrCat(", ", m.moe.num_experts, " experts (", m.moe.top_k, " active)");
  const double params = TargetParameters(m);
  const std::string count = params >= 1e9 ? absl::StrFormat("%.2fB", params / 1e9)
                                          : absl::StrFormat("%.1fM", params / 1e6);
  return absl::StrFormat("%s: %s, L=%d, H=%d, vocab %d%s, %s parameters; draft %.1fM parameters",
                         c.model.dir, m.architecture_name, m.num_hidden_layers, m.hidden_size,
                         m.vocab_size, moe, count, DraftParameters(m, c) / 1e6);
}

std::string MemoryLine(const PlannedProcess& p) {
  if (!p.memory.has_value()) return "";
  const MemoryEstimate& m = *p.memory;
  std::string parts = absl::StrCat("weights ", FormatBytes(m.weights));
  if (m.optimizer > 0) absl::StrAppend(&parts, ", optimizer ", FormatBytes(m.optimizer));
  absl::StrAppend(&parts, ", activations ", FormatBytes(m.activations), ", batches in flight ",
                  FormatBytes(m.buffers));
  return absl::StrFormat("    %-8s %-16s ~%s (%s)\n", p.device, p.name, FormatBytes(m.total()),
                         parts);
}

std::string MetricsWhere(int port) {
  if (port < 0) return "no metrics";
  return port == 0 ? "metrics port picked at start" : absl::StrCat("metrics :", port);
}

std::string RendezvousWhere(const std::string& file) {
  return absl::StrCat("c10d rendezvous through ", file, " (nothing listens)");
}

// A process's ranks, ports and rendezvous, as --plan shows them.
std::string Where(const NodePlan& plan, const PlannedProcess& p) {
  if (p.teacher && p.rank != 0) {
    return absl::StrCat("TP rank ", p.rank, " of teacher-", p.index, "; ",
                        RendezvousWhere(plan.teacher_rendezvous[p.index]));
  }
  std::string where;
  if (p.teacher) {
    where = absl::StrCat("gRPC port picked at start -> ", plan.port_files[p.index], "; ",
                         MetricsWhere(p.metrics_port));
    if (!plan.teacher_rendezvous[p.index].empty())
      absl::StrAppend(&where, "; ", RendezvousWhere(plan.teacher_rendezvous[p.index]));
    return where;
  }
  where = absl::StrCat("RANK=", p.rank, " WORLD_SIZE=", plan.config.students.devices.size(), "; ",
                       MetricsWhere(p.metrics_port));
  if (!plan.student_rendezvous.empty())
    absl::StrAppend(&where, "; ", RendezvousWhere(plan.student_rendezvous));
  return where;
}

}  // namespace

absl::StatusOr<std::string> DeviceName(const std::string& entry, const std::string& key) {
  const std::string e = absl::AsciiStrToLower(entry);
  if (e == "cpu") return std::string("cpu");
  int index;
  if (absl::SimpleAtoi(e, &index) && index >= 0) return absl::StrCat("cuda:", index);
  if (absl::StartsWith(e, "cuda:") && absl::SimpleAtoi(e.substr(5), &index) && index >= 0) return e;
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": expected a GPU index, cuda:N or cpu, got \"", entry, "\""));
}

absl::StatusOr<NodePlan> PlanNode(const RunConfig& c, const std::string& build_dir,
                                  const std::string& launch_id) {
  E3_RETURN_IF_ERROR(Required(c, "model.dir", !c.model.dir.empty()));
  E3_RETURN_IF_ERROR(Required(c, "data.train", !c.data.train.empty()));
  E3_RETURN_IF_ERROR(Required(c, "teachers.devices", !c.teachers.devices.empty()));
  E3_RETURN_IF_ERROR(Required(c, "students.devices", !c.students.devices.empty()));
  std::vector<std::string> teacher_devices, student_devices;
  for (const std::string& d : c.teachers.devices) {
    E3_ASSIGN_OR_RETURN(std::string name, DeviceName(d, c.source + ": teachers.devices"));
    teacher_devices.push_back(name);
  }
  for (const std::string& d : c.students.devices) {
    E3_ASSIGN_OR_RETURN(std::string name, DeviceName(d, c.source + ": students.devices"));
    student_devices.push_back(name);
  }
  const std::vector<std::string> owned = OwnedFlagErrors(c);
  if (!owned.empty()) return absl::InvalidArgumentError(absl::StrJoin(owned, "\n"));
  NodePlan plan;
  plan.config = c;
  const std::string out = c.run.out;
  plan.resolved_config = JoinPath(out, "run.yaml");
  plan.auth_token = JoinPath(out, "auth_token");
  plan.step_log = JoinPath(out, "steps.jsonl");
  plan.plot = JoinPath(out, "run.png");
  plan.teachers = static_cast<int>(teacher_devices.size() / c.teachers.tp);
  plan.rendezvous_dir = JoinPath(out, "rendezvous");
  for (int i = 0; i < plan.teachers; ++i) {
    plan.port_files.push_back(JoinPath(out, absl::StrCat("teacher-", i, ".port")));
    plan.teacher_rendezvous.push_back(
        c.teachers.tp > 1
            ? JoinPath(plan.rendezvous_dir, absl::StrCat("teacher-", i, ".", launch_id))
            : "");
  }
  if (student_devices.size() > 1)
    plan.student_rendezvous = JoinPath(plan.rendezvous_dir, absl::StrCat("students.", launch_id));
  if (c.given.count("run.master_port") > 0) {
    plan.notes.push_back(absl::StrCat(
        c.source, ": run.master_port is unused: the c10d groups meet through files under ",
        plan.rendezvous_dir, " (nothing listens)"));
  }
  plan.processes = PlanTeachers(plan, build_dir, teacher_devices);
  for (PlannedProcess& p : PlanStudents(plan, build_dir, student_devices)) {
    plan.processes.push_back(std::move(p));
  }
  absl::StatusOr<ModelConfig> model = LoadModelConfig(JoinPath(c.model.dir, "config.json"));
  if (model.ok()) {
    plan.model = *model;
    const int students = static_cast<int>(student_devices.size());
    for (PlannedProcess& p : plan.processes) {
      const bool gpu = p.device != "cpu";
      p.memory = p.teacher ? TeacherRankMemory(*model, c, gpu, p.rank == 0 ? students : 0)
                           : StudentRankMemory(*model, c, gpu);
    }
  } else {
    plan.model_error = std::string(model.status().message());
  }
  return plan;
}

std::string DescribePlan(const NodePlan& plan) {
  const RunConfig& c = plan.config;
  const int world = static_cast<int>(c.students.devices.size());
  std::string s = absl::StrCat("e3_launch plan (", c.source, ")\n");
  absl::StrAppend(&s, "  model     ", ModelLine(plan), "\n");
  absl::StrAppend(
      &s, "  data      ", c.data.train, ", max_seq_len ", c.data.max_seq_len, ", ", c.data.epochs,
      " epoch(s)",
      c.data.eval_prompts.empty() ? "" : absl::StrCat("; eval prompts ", c.data.eval_prompts),
      "\n");
  absl::StrAppend(&s, "  teachers  ", plan.teachers, " x TP=", c.teachers.tp, " EP=", c.teachers.ep,
                  ", each serving 1/", plan.teachers, " of the data\n");
  absl::StrAppend(
      &s, "  students  ", world, " data-parallel rank(s); batch ", c.schedule.tokens_per_batch,
      " tokens per rank, ", static_cast<int64_t>(world) * c.schedule.tokens_per_batch,
      " per step; TTT length ", c.draft.ttt_length, ", draft vocab ", c.draft.vocab_size, "\n");
  absl::StrAppend(&s, "  schedule  lr ", c.schedule.lr, ", ",
                  c.schedule.max_steps > 0 ? absl::StrCat(c.schedule.max_steps, " steps")
                                           : std::string("until the data ends"),
                  ", checkpoint every ", c.schedule.checkpoint_every, "\n");
  absl::StrAppend(&s, "  output    ", c.run.out, "/ (", plan.resolved_config,
                  ", logs, checkpoints/, draft/, best/, tb/, ", plan.step_log, ", ", plan.plot, ")\n");
  absl::StrAppend(&s, "  peers     a fresh shared token per launch in ", plan.auth_token,
                  " (mode 0600), read by every process\n");
  absl::StrAppend(&s, "  processes\n");
  for (const PlannedProcess& p : plan.processes) {
    absl::StrAppendFormat(&s, "    %-16s %-8s %s; log %s\n", p.name, p.device, Where(plan, p),
                          p.log);
  }
  absl::StrAppend(
      &s, "  memory per device (estimate; add 1-3 GB per GPU for CUDA context and workspaces)\n");
  if (!plan.model.has_value()) absl::StrAppend(&s, "    (no estimate: ", plan.model_error, ")\n");
  for (const PlannedProcess& p : plan.processes) absl::StrAppend(&s, MemoryLine(p));
  if (!plan.notes.empty()) absl::StrAppend(&s, "  notes\n");
  for (const std::string& note : plan.notes) absl::StrAppend(&s, "    ", note, "\n");
  return s;
}

}  // namespace e3
