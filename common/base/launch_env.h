// A process's place in a c10d group, as torchrun describes it (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), with explicit flags
// taking precedence (DESIGN.md, "Parallelism and launch"). The student's
// data-parallel ranks and a teacher's tensor-parallel ranks resolve it the
// same way; only their default port differs.
#ifndef E3_COMMON_BASE_LAUNCH_ENV_H_
#define E3_COMMON_BASE_LAUNCH_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace e3 {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;  // -1: LOCAL_RANK is not set
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Non-empty: the ranks meet through a c10d FileStore at this path
  // instead of a TCPStore at master_addr:master_port
  // (common/torch/process_group.h).
  std::string rendezvous_file;
};

// Explicit flags; a value left unset falls back to the variable, then to
// the default.
struct LaunchFlags {
  int rank = -1;            // -1: $RANK, else 0
  int world_size = -1;      // -1: $WORLD_SIZE, else 1
  std::string master_addr;  // empty: $MASTER_ADDR, else 127.0.0.1
  int master_port = -1;     // -1: $MASTER_PORT, else default_master_port
  int default_master_port = 29500;
  std::string rendezvous_file;  // no variable: torchrun has none for it
  std::string rank_flag = "rank";  // its name, for messages (the teacher's is tp_rank)
};

// Looks up an environment variable (null when unset); std::getenv in the
// services, a table in tests.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup ProcessEnv();

// Errors name the flag or variable and what was expected.
absl::StatusOr<LaunchEnv> ResolveLaunchEnv(const LaunchFlags& flags, const EnvLookup& env);

}  // namespace e3

#endif  // E3_COMMON_BASE_LAUNCH_ENV_H_
