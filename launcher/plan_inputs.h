// Every file the processes of a plan will open that the run config names
// (the model, the data, the template, the vocab map) and the two service
// binaries, checked before anything starts: a missing one is reported by
// planning, with every other problem at once, instead of by a process that
// loaded for a minute first.
#ifndef E3_LAUNCHER_PLAN_INPUTS_H_
#define E3_LAUNCHER_PLAN_INPUTS_H_

#include <string>
#include <vector>

#include "launcher/node_plan.h"

namespace e3 {

// One line per problem, naming the key (or e3_launch's --build_dir) and
// the path; empty when every input is there.
std::vector<std::string> MissingInputs(const NodePlan& plan);

}  // namespace e3

#endif  // E3_LAUNCHER_PLAN_INPUTS_H_
