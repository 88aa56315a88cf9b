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

#include "common/run_config.h"

namespace e3 {

// One line per flag of `teachers.args` or `students.args` that the
// launcher sets itself, or that is a deprecated spelling (a service
// applies those only from its command line, so in a config's args they
// would be ignored as well); empty when there is none.
std::vector<std::string> OwnedFlagErrors(const RunConfig& config);

}  // namespace e3

#endif  // E3_LAUNCHER_OWNED_FLAGS_H_
