// The student's data parallelism around the optimizer's gradient
// reduction (draft_optimizer.h): the c10d group the ranks meet on, the
// broadcast that starts every rank from rank 0's weights, and the
// agreement on rank 0's checkpoint after it writes one.
#ifndef E3_STUDENT_TRAINER_OPTIM_DATA_PARALLEL_H_
#define E3_STUDENT_TRAINER_OPTIM_DATA_PARALLEL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/base/launch_env.h"
#include "common/torch/process_group.h"
#include "student_trainer/draft/draft_model.h"
#include "student_trainer/optim/draft_optimizer.h"

namespace e3 {

// The group of `launch` (Gloo on the CPU, NCCL on a GPU); null for one
// rank.
absl::StatusOr<std::unique_ptr<ProcessGroup>> JoinDataParallelGroup(const LaunchEnv& launch,
                                                                    const at::Device& device);

// Every rank takes rank 0's trained weights, then the optimizer re-rounds
// its working copy (also on one rank: after a resume).
absl::Status BroadcastTrainedWeights(ProcessGroup* group, DraftModel& trained,
                                     DraftOptimizer& optimizer);

// Rank 0's `value` on every rank, once every rank is here (`value` itself
// on one rank): rank 0 says whether its checkpoint was written, so that all
// ranks commit, go on or stop together.
absl::StatusOr<bool> AgreeWithRank0(ProcessGroup* group, const at::Device& device, bool value);

// True on every rank when `local` is true on any: ranks stop together, so
// none is left inside a collective the others never join (each rank sees
// its SIGTERM at its own moment).
absl::StatusOr<bool> AnyRank(ProcessGroup* group, bool local, const at::Device& device);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_OPTIM_DATA_PARALLEL_H_
