// e3_launch: starts a one-node training run from its run config (YAML):
// the teachers (TP groups over their devices, one data shard each), then,
// once every teacher serves, the data-parallel students; shows one live
// status line per process; reports a process that dies the moment it
// does, with the end of its log, and stops the others; at the end prints
// the students' summaries and draws the run's curves (<out>/run.png).
// Launched again on the same run.out it resumes the run (the students
// from their checkpoints); launcher/run_directory.h says what one launch
// owns there and what a relaunch renews.
//
//   e3_launch --config=run.yaml [section.key=value ...] [--plan]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/config/command_line.h"
#include "common/config/config_file.h"
#include "common/config/reference.h"
#include "launcher/child_process.h"
#include "launcher/node_plan.h"
#include "launcher/plan_inputs.h"
#include "launcher/run_directory.h"
#include "launcher/status_board.h"

namespace e3 {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::atomic<int> g_signal{0};

struct Running {
  const PlannedProcess* plan;
  std::unique_ptr<ChildProcess> child;
  bool serving = false;  // a teacher's rank 0 wrote its port file
};

class NodeRun {
 public:
  // `lock` makes this launch the run directory's owner while it runs.
  NodeRun(NodePlan plan, std::unique_ptr<RunDirectoryLock> lock)
      : plan_(std::move(plan)),
        lock_(std::move(lock)),
        board_(stdout, ::isatty(STDOUT_FILENO) != 0,
               std::chrono::milliseconds(
                   static_cast<int64_t>(1000 * plan_.config.launcher.status_every_s))) {}
  // The exit code: 0 when every student finished, 1 when a process failed,
  // 2 when the run directory could not be prepared, 130 when interrupted.
  int Run();

 private:
  absl::Status Prepare();
  absl::Status WaitForEarlierLaunch();
  absl::Status Start(const PlannedProcess& p, std::vector<std::string> extra_args);
  absl::StatusOr<std::string> WaitForTeachers();
  absl::Status WatchStudents();
  absl::Status ServeStudentGroups();
  void StopTeachers();
  // The first process that failed, described with the end of its log.
  absl::Status CheckProcesses();
  absl::Status Interrupted();
  void ShowStatus(bool force = false);
  void StopAll();
  void PrintSummaries();
  void Plot();

  NodePlan plan_;
  std::unique_ptr<RunDirectoryLock> lock_;
  StatusBoard board_;
  std::vector<Running> procs_;
  Clock::time_point last_show_{};
};

// A launcher killed with -9 leaves its processes draining on SIGTERM
// (they get it when it dies): they still append to the ledger and write
// checkpoints, so this launch waits for them before it starts its own.
absl::Status NodeRun::WaitForEarlierLaunch() {
  const std::string arg = "--config=" + plan_.resolved_config;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                                           1000 * plan_.config.launcher.earlier_exit_wait_s));
  std::vector<pid_t> earlier = ProcessesWithArgument(arg);
  if (!earlier.empty()) {
    board_.Print(absl::StrCat("e3_launch: waiting for ", earlier.size(),
                              " process(es) of an earlier launch on ", plan_.config.run.out,
                              " to exit (pid ", absl::StrJoin(earlier, ", "), ")"));
  }
  while (!earlier.empty()) {
    if (Clock::now() >= deadline) {
      return absl::FailedPreconditionError(
          absl::StrCat("processes of an earlier launch on ", plan_.config.run.out,
                       " still run (pid ", absl::StrJoin(earlier, ", "), "); stop them first"));
    }
    if (g_signal != 0) return Interrupted();
    std::this_thread::sleep_for(200ms);
    earlier = ProcessesWithArgument(arg);
  }
  return absl::OkStatus();
}

absl::Status NodeRun::Prepare() {
  for (const std::string& note : plan_.notes) board_.Print("e3_launch: note: " + note);
  E3_RETURN_IF_ERROR(WaitForEarlierLaunch());
  // Every process reads this one file: the config with the overrides in.
  E3_RETURN_IF_ERROR(WriteFileAtomically(plan_.resolved_config, RunConfigToYaml(plan_.config)));
  E3_RETURN_IF_ERROR(WriteAuthToken(plan_.auth_token));
  // A port file is its teacher's start's: an old one names a dead port.
  for (const std::string& port_file : plan_.port_files) E3_RETURN_IF_ERROR(RemoveStale(port_file));
  // FileStores of earlier launches: no process uses them any more.
  E3_RETURN_IF_ERROR(RemoveAll(plan_.rendezvous_dir));
  return MakeDirs(plan_.rendezvous_dir);
}

absl::Status NodeRun::Start(const PlannedProcess& p, std::vector<std::string> extra_args) {
  std::vector<std::string> argv = {p.binary};
  argv.insert(argv.end(), p.args.begin(), p.args.end());
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  E3_RETURN_IF_ERROR(RotateLog(p.log).status());
  E3_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> child, ChildProcess::Start(argv, p.env, p.log));
  procs_.push_back({&p, std::move(child)});
  return absl::OkStatus();
}

std::string StateOf(Running& r) {
  if (r.child->Running()) {
    if (!r.plan->teacher) return "running";
    return r.plan->rank != 0 ? "following" : (r.serving ? "serving" : "starting");
  }
  return r.child->Succeeded() ? "done" : absl::StrCat("failed (", r.child->DescribeEnd(), ")");
}

void NodeRun::ShowStatus(bool force) {
  // Four redraws a second are live enough, and keep the log reads small.
  const Clock::time_point now = Clock::now();
  if (!force && now - last_show_ < 250ms) return;
  last_show_ = now;
  std::vector<ProcessStatus> rows;
  for (Running& r : procs_) {
    const std::vector<std::string> tail = TailLines(r.plan->log, 1, /*max_bytes=*/4096);
    rows.push_back({r.plan->name, r.plan->device, StateOf(r), r.child->SecondsRunning(),
                    tail.empty() ? "" : tail[0]});
  }
  board_.Show(rows, force);
}

absl::Status NodeRun::CheckProcesses() {
  for (Running& r : procs_) {
    if (r.child->Running()) continue;
    // A teacher that exits cleanly after serving has seen its data
    // committed (--exit_when_done); any other end is a failure.
    const bool clean = r.child->Succeeded() && (!r.plan->teacher || r.serving || r.plan->rank != 0);
    if (clean) continue;
    const std::string what =
        r.child->Succeeded()
            ? absl::StrFormat("%s (pid %d) exited before serving, after %.1f s", r.plan->name,
                              r.child->pid(), r.child->SecondsRunning())
            : absl::StrFormat("%s (pid %d) failed (%s) after %.1f s", r.plan->name, r.child->pid(),
                              r.child->DescribeEnd(), r.child->SecondsRunning());
    const int64_t lines = plan_.config.launcher.log_tail_lines;
    std::string text = absl::StrCat(what, "; the last ", lines, " lines of ", r.plan->log, ":");
    for (const std::string& line : TailLines(r.plan->log, static_cast<size_t>(lines))) {
      absl::StrAppend(&text, "\n  | ", line);
    }
    return absl::AbortedError(text);
  }
  return absl::OkStatus();
}

absl::Status NodeRun::Interrupted() {
  return absl::CancelledError(absl::StrCat("signal ", g_signal.load(), ": stopping every process"));
}

absl::StatusOr<std::string> NodeRun::WaitForTeachers() {
  std::vector<std::string> addresses(plan_.port_files.size());
  while (true) {
    size_t ready = 0;
    for (Running& r : procs_) {
      if (!r.plan->teacher || r.plan->rank != 0) continue;
      // Prepare removed every port file: one that is here now is this
      // start's.
      const std::string& port_file = plan_.port_files[r.plan->index];
      int port = 0;
      if (!r.serving && IsRegularFile(port_file) &&
          absl::SimpleAtoi(ReadFileToString(port_file).value_or(""), &port) && port > 0) {
        addresses[r.plan->index] = absl::StrCat("127.0.0.1:", port);
        r.serving = true;
      }
      ready += r.serving;
    }
    if (ready == addresses.size()) return absl::StrJoin(addresses, ",");
    // Waits only while every teacher is alive: a dead one is reported now.
    E3_RETURN_IF_ERROR(CheckProcesses());
    if (g_signal != 0) return Interrupted();
    ShowStatus();
    std::this_thread::sleep_for(100ms);
  }
}

absl::Status NodeRun::WatchStudents() {
  while (true) {
    E3_RETURN_IF_ERROR(CheckProcesses());
    if (g_signal != 0) return Interrupted();
    bool students_running = false;
    for (Running& r : procs_) students_running |= !r.plan->teacher && r.child->Running();
    if (!students_running) return absl::OkStatus();
    ShowStatus();
    std::this_thread::sleep_for(100ms);
  }
}

// Teachers that also serve named student groups (teachers.student_groups,
// whose students are launched apart from this run) stay up after this
// run's students finish: they exit on their own once every group has
// committed its data (--exit_when_done), and until then the launcher
// watches them. A signal or a failed teacher ends the wait. Students
// stopped early (schedule.max_steps) never commit all their data, so their
// teachers could not tell when to leave: they stop with the run.
absl::Status NodeRun::ServeStudentGroups() {
  const std::vector<std::string>& groups = plan_.config.teachers.student_groups;
  if (groups.empty()) return absl::OkStatus();
  const std::string names = absl::StrJoin(groups, ", ");
  if (plan_.config.schedule.max_steps > 0) {
    board_.Print(absl::StrCat("e3_launch: schedule.max_steps stopped this run's students early; the teachers stop "
                              "with them and no longer serve student groups ",
                              names));
    return absl::OkStatus();
  }
  board_.Print(absl::StrCat("e3_launch: this run's students are done; the teachers keep serving student groups ",
                            names, " until each has committed its data (Ctrl-C stops them)"));
  while (true) {
    bool teachers_running = false;
    for (Running& r : procs_) teachers_running |= r.plan->teacher && r.child->Running();
    if (!teachers_running) return absl::OkStatus();
    E3_RETURN_IF_ERROR(CheckProcesses());
    if (g_signal != 0) return Interrupted();
    ShowStatus();
    std::this_thread::sleep_for(100ms);
  }
}

// Teachers exit once every rank has committed all their data, so after
// students that ran to the end of it they get a while; students stopped
// early (schedule.max_steps) leave them serving. Then SIGTERM: they drain.
void NodeRun::StopTeachers() {
  const double wait_s =
      plan_.config.schedule.max_steps > 0 ? 0 : plan_.config.launcher.teacher_exit_wait_s;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(1000 * wait_s));
  for (Running& r : procs_) {
    if (r.plan->teacher)
      r.child->WaitFor(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max(Clock::duration::zero(), deadline - Clock::now())));
  }
  StopAll();
}

void NodeRun::StopAll() {
  for (Running& r : procs_) r.child->Signal(SIGTERM);
  for (Running& r : procs_) {
    if (!r.child->WaitFor(30s)) {
      board_.Print(
          absl::StrCat("e3_launch: ", r.plan->name, " ignored SIGTERM for 30 s; killing it"));
      r.child->Signal(SIGKILL);
      r.child->WaitFor(5s);
    }
  }
}

void NodeRun::PrintSummaries() {
  for (Running& r : procs_) {
    if (r.plan->teacher) continue;
    for (const std::string& line : TailLines(r.plan->log, 12)) {
      if (absl::StartsWith(line, "=== student") || absl::StartsWith(line, "  ")) board_.Print(line);
    }
  }
}

// The run's curves from rank 0's step log; a missing matplotlib is a
// warning, not a failed run.
void NodeRun::Plot() {
  // Data-parallel students write one step log per rank (<step_log>.rank<r>).
  const std::string step_log =
      IsRegularFile(plan_.step_log) ? plan_.step_log : absl::StrCat(plan_.step_log, ".rank0");
  if (!plan_.config.launcher.plot || !IsRegularFile(step_log)) return;
  const std::string python = IsRegularFile("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string log = JoinPath(plan_.config.run.out, "plot.log");
  (void)RotateLog(log);  // an earlier launch's plot log is worth keeping, not worth failing on
  auto child = ChildProcess::Start(
      {python, std::string(E3_SOURCE_DIR) + "/tools/plot_run.py", "--step_log=" + step_log,
       "--out=" + plan_.plot, absl::StrCat("--title=", plan_.config.source, ": student rank 0")},
      {}, log);
  if (child.ok() && (*child)->WaitFor(120s) && (*child)->Succeeded()) {
    board_.Print(absl::StrCat("e3_launch: curves: ", plan_.plot));
  } else {
    board_.Print(absl::StrCat("e3_launch: warning: no plot (see ", log, ")"));
  }
}

int NodeRun::Run() {
  absl::Status status = Prepare();
  if (!status.ok()) {  // nothing started
    board_.Print(absl::StrCat("e3_launch: error: ", status.message()));
    return g_signal != 0 ? 130 : 2;
  }
  for (const PlannedProcess& p : plan_.processes) {
    if (status.ok() && p.teacher) status = Start(p, {});
  }
  absl::StatusOr<std::string> teachers = status.ok() ? WaitForTeachers() : status;
  if (teachers.ok()) {
    board_.Print(absl::StrCat("e3_launch: ", plan_.teachers,
                              " teacher(s) of TP=", plan_.config.teachers.tp, " at ", *teachers,
                              "; ", plan_.config.students.devices.size(), " student rank(s)"));
    for (const PlannedProcess& p : plan_.processes) {
      if (status.ok() && !p.teacher) status = Start(p, {"--teacher=" + *teachers});
    }
    if (status.ok()) status = WatchStudents();
    if (status.ok()) {
      PrintSummaries();
      status = ServeStudentGroups();
    }
  } else {
    status = teachers.status();
  }
  ShowStatus(/*force=*/true);
  if (!status.ok()) {
    board_.Print(absl::StrCat("e3_launch: ", status.message()));
    bool others = false;
    for (Running& r : procs_) others |= r.child->Running();
    if (others) board_.Print("e3_launch: stopping the other processes");
    StopAll();
    ShowStatus(/*force=*/true);
    board_.Keep();
    return g_signal != 0 ? 130 : 1;
  }
  StopTeachers();
  ShowStatus(/*force=*/true);
  board_.Keep();
  Plot();
  board_.Print(absl::StrCat("e3_launch: done; logs, summaries, the step log and the draft are in ",
                            plan_.config.run.out));
  return 0;
}

// Prints each line of `problems` as an error; returns 2, the exit code of
// a run that cannot start.
int Refuse(const std::vector<std::string>& problems) {
  for (const std::string& p : problems) std::fprintf(stderr, "e3_launch: error: %s\n", p.c_str());
  return 2;
}

int Refuse(const absl::Status& status) {
  return Refuse(absl::StrSplit(std::string(status.message()), '\n'));
}

// The plan of the config the command line gives.
absl::StatusOr<NodePlan> Plan(const RunConfig& config) {
  std::string build_dir = config.launcher.build_dir;
  if (build_dir.empty()) build_dir = Dirname(SelfExeDir());
  // Names this launch's rendezvous files, which no earlier launch used.
  E3_ASSIGN_OR_RETURN(const std::string launch_id, RandomHex(4));
  return PlanNode(config, build_dir, launch_id);
}

constexpr char kSummary[] =
    "Starts a one-node training run (teachers and students) from its run config.\n"
    "  e3_launch --config=run.yaml [section.key=value ...] [--plan]\n"
    "  e3_launch --config_reference   prints docs/config.md, the reference of every setting";

int Main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (std::find(args.begin(), args.end(), "--config_reference") != args.end()) {
    std::printf("%s", ConfigReferenceMarkdown().c_str());
    return 0;
  }
  absl::StatusOr<CommandLine> command_line = ReadCommandLine(args, kLauncher);
  if (!command_line.ok()) return Refuse(command_line.status());
  if (command_line->help) {
    std::printf("%s", Usage(kLauncher, kSummary).c_str());
    return 0;
  }
  absl::StatusOr<NodePlan> plan = Plan(command_line->config);
  if (!plan.ok()) return Refuse(plan.status());
  const std::vector<std::string> missing = MissingInputs(*plan);
  if (plan->config.launcher.plan) {
    // The layout is worth seeing even before the inputs are in place (a
    // plan made for another machine); the exit code still says they are
    // not.
    std::printf("%s", DescribePlan(*plan).c_str());
    std::fflush(stdout);
    return missing.empty() ? 0 : Refuse(missing);
  }
  if (!missing.empty()) return Refuse(missing);
  // Nothing in run.out is touched before the lock is held.
  const std::string& out = plan->config.run.out;
  absl::Status made = MakeDirs(out);
  if (!made.ok()) return Refuse(made);
  absl::StatusOr<std::unique_ptr<RunDirectoryLock>> lock = RunDirectoryLock::Acquire(out);
  if (!lock.ok()) return Refuse(lock.status());
  return NodeRun(*std::move(plan), *std::move(lock)).Run();
}

}  // namespace
}  // namespace e3

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { e3::g_signal = sig; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return e3::Main(argc, argv);
}
