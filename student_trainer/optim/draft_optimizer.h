// The draft's optimizer step as the trainer and the bench run it:
// clearing gradients, the data-parallel reduction, global-norm clipping,
// AdamW on the trained (fp32 master) weights and re-rounding the working
// weights, behind one interface with two implementations:
// - reference: LibTorch's torch::optim::AdamW and clip_grad_norm_ over the
//   named parameters, fp32 master weights copied per parameter
//   (master_weights.h), gradients averaged by the bucketed reducer
//   (gradient_reducer.h) during backward;
// - fused: one AdamW kernel over the flat buffers (fused_adamw.h).
// Both compute torch.optim.AdamW's update with clip_grad_norm_'s scaling.
#ifndef E3_STUDENT_TRAINER_OPTIM_DRAFT_OPTIMIZER_H_
#define E3_STUDENT_TRAINER_OPTIM_DRAFT_OPTIMIZER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/torch/process_group.h"
#include "student_trainer/draft/draft_model.h"

namespace e3 {

struct DraftOptimizerOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 0.5;  // max global gradient norm; 0 disables
};

enum class DraftOptimizerKind { kReference, kFused };

class DraftOptimizer {
 public:
  virtual ~DraftOptimizer() = default;
  // Before a step's forward: clears the gradients (and arms the reducer).
  virtual void BeginStep() = 0;
  // After backward: averages the gradients over the ranks, clips, updates
  // the trained weights at `lr` and re-rounds the working ones.
  virtual absl::Status FinishStep(double lr) = 0;
  // Copies the trained weights into the working draft (after a load or a
  // broadcast of the trained weights).
  virtual void SyncWorkingWeights() = 0;
  // The optimizer state, in a checkpoint directory.
  virtual absl::Status Save(const std::string& dir) = 0;
  virtual absl::Status Load(const std::string& dir) = 0;
  virtual const char* name() const = 0;
};

// `work` is the draft the TTT step runs; `master` its fp32 copy when work
// computes below fp32 (else null: work is trained directly); `group` the
// data-parallel group, or null for one rank.
absl::StatusOr<std::unique_ptr<DraftOptimizer>> CreateDraftOptimizer(
    DraftOptimizerKind kind, DraftModel& work, DraftModel* master, ProcessGroup* group,
    const DraftOptimizerOptions& options);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_OPTIM_DRAFT_OPTIMIZER_H_
