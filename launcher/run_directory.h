// What one launch owns in its run directory (run.out), and what a
// relaunch on the same directory (to resume a stopped or killed run) must
// not take over from the launch before it:
// - the lock, <out>/e3_launch.lock: one launcher per directory at a time.
//   It is a flock, so the lock of a launcher killed with -9 goes with it;
//   its file (holding the pid, for the message) stays and blocks nothing.
// - the processes an earlier launch started that still drain after their
//   launcher died: they append to the same ledger and checkpoints.
// - the shared token the services check (<out>/auth_token): fresh per
//   launch, so a process of an earlier launch cannot talk to this one.
// - the logs: an existing <name>.log is renamed to the next free
//   <name>.log.<k> before its process starts, never overwritten.
// - files that belong to one process start (a teacher's port file, a c10d
//   FileStore): removed before it, since a stale one names a dead port or
//   holds a dead group's keys.
#ifndef E3_LAUNCHER_RUN_DIRECTORY_H_
#define E3_LAUNCHER_RUN_DIRECTORY_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace e3 {

class RunDirectoryLock {
 public:
  // Locks <out>/e3_launch.lock (creating it) and writes this pid into it;
  // FailedPrecondition "<out> is in use by e3_launch pid N" while another
  // launcher holds it. The descriptor is close-on-exec: the processes a
  // launcher starts never hold its lock.
  static absl::StatusOr<std::unique_ptr<RunDirectoryLock>> Acquire(const std::string& out);
  ~RunDirectoryLock();  // unlocks
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

 private:
  explicit RunDirectoryLock(int fd) : fd_(fd) {}
  int fd_;
};

// `bytes` random bytes from the kernel (getrandom), as lowercase hex.
absl::StatusOr<std::string> RandomHex(size_t bytes);

// A fresh random token (32 bytes, hex) in a new file at `path`, mode 0600.
// An old file there is removed first, and the new one is created
// exclusively, so nothing is written through a file or link someone else
// left there.
absl::Status WriteAuthToken(const std::string& path);

// Renames an existing `log` to the first free `log`.<k> (k = 1, 2, ...)
// and returns that name; "" when there was no `log`. Nothing is deleted.
absl::StatusOr<std::string> RotateLog(const std::string& log);

// Removes `path` if it is there; an error only when it stays.
absl::Status RemoveStale(const std::string& path);

// Processes other than this one whose command line holds `arg` as one
// argument (from /proc/<pid>/cmdline; zombies have none).
std::vector<pid_t> ProcessesWithArgument(const std::string& arg);

}  // namespace e3

#endif  // E3_LAUNCHER_RUN_DIRECTORY_H_
