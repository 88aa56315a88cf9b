// A process the launcher starts: its stdout and stderr go to a log file,
// extra environment variables are added to the launcher's, and its end is
// observed without blocking, so that one loop can watch every process and
// report a failure the moment it happens. It gets SIGTERM when the
// launcher dies, however it dies (PR_SET_PDEATHSIG), so no process
// outlives the launcher by more than its own drain.
#ifndef E3_LAUNCHER_CHILD_PROCESS_H_
#define E3_LAUNCHER_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace e3 {

class ChildProcess {
 public:
  using Clock = std::chrono::steady_clock;
  // argv[0] is the program's path.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv,
      const std::vector<std::pair<std::string, std::string>>& env, const std::string& log_path);
  ~ChildProcess();  // kills a process still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reaps the process if it has ended; true while it runs.
  bool Running();
  // The wait status once ended.
  std::optional<int> status() const { return status_; }
  // "exit 0", "exit 1", "signal 9 (Killed)".
  std::string DescribeEnd() const;
  bool Succeeded() const;
  double SecondsRunning() const;
  void Signal(int sig);
  // Waits up to `timeout` for the process to end; true if it did.
  bool WaitFor(std::chrono::milliseconds timeout);

 private:
  ChildProcess(pid_t pid) : pid_(pid), started_(Clock::now()) {}
  pid_t pid_;
  Clock::time_point started_;
  std::optional<Clock::time_point> ended_;
  std::optional<int> status_;
};

// The last `lines` lines of the file at `path` (within its last
// `max_bytes`), with carriage-return progress collapsed to the last state
// of each line.
std::vector<std::string> TailLines(const std::string& path, size_t lines, size_t max_bytes = 65536);

}  // namespace e3

#endif  // E3_LAUNCHER_CHILD_PROCESS_H_
