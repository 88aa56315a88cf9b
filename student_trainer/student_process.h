// What one student process is, resolved once from the run config and its
// environment: its place among the data-parallel ranks, its device, the
// teachers it trains from and how it reaches them. These are facts about
// the process, not settings: the settings stay in their sections, which
// each component reads itself.
#ifndef E3_STUDENT_TRAINER_STUDENT_PROCESS_H_
#define E3_STUDENT_TRAINER_STUDENT_PROCESS_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/launch_env.h"
#include "common/base/parallel_layout.h"
#include "common/config/run_config.h"
#include "common/transport/transport.h"

namespace e3 {

struct StudentProcess {
  // Where the data-parallel group meets (torchrun's variables, explicit
  // settings first), and this rank's place in it.
  LaunchEnv launch;
  ParallelLayout layout;
  std::string device;                  // "cpu" or "cuda:N"
  std::vector<std::string> teachers;   // each serving a shard; batches round-robin
  std::string subscriber_id;           // this rank's name at the teachers
  std::vector<TransportKind> transports;  // offered to the teachers, in order
  std::string host;                    // this machine's name (shm and CUDA IPC need the same host)
  // Set by SIGTERM (null: never): checkpoint and return.
  const std::atomic<bool>* stop = nullptr;
};

// Errors name the setting and what was expected.
absl::StatusOr<StudentProcess> ResolveStudentProcess(const RunConfig& config, const EnvLookup& env,
                                                     const std::atomic<bool>* stop);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STUDENT_PROCESS_H_
