// The flags e3_launch gives its teachers and students itself: devices,
// ranks, shards, addresses, ports, rendezvous, the token and the paths
// under run.out. It passes them on each process's command line, where
// they win over the run config, so the same flag in `teachers.args` or
// `students.args` would be ignored without a word; planning refuses it
// instead, naming the key, the flag and what to set in its place.
#ifndef E3_LAUNCHER_OWNED_FLAGS_H_
#define E3_LAUNCHER_OWNED_FLAGS_H_

#include <string>
#include <vector>

#include "common/config/run_config.h"

namespace e3 {

// One line per argument of `teachers.args` or `students.args` that is a
// flag the launcher sets itself (in any spelling), or no flag of that
// service at all; empty when there is none.
std::vector<std::string> OwnedFlagErrors(const RunConfig& config);

}  // namespace e3

#endif  // E3_LAUNCHER_OWNED_FLAGS_H_
