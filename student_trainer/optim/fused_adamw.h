// AdamW over the draft's flat buffers (flat_parameters.h), with
// global-norm clipping folded in: on the GPU one kernel reads the grad
// norm, learning rate and step from device memory, updates the fp32
// master weights and moments and writes the rounded working weights, so
// the step needs no host synchronisation and no per-parameter launches.
// Elsewhere the same update runs as ATen ops over the flat tensors. The
// arithmetic is torch.optim.AdamW's (decoupled weight decay, bias
// corrections) after clip_grad_norm_'s scaling by max_norm / (norm + 1e-6).
#ifndef E3_STUDENT_TRAINER_OPTIM_FUSED_ADAMW_H_
#define E3_STUDENT_TRAINER_OPTIM_FUSED_ADAMW_H_

#include <cstdint>

#include "common/torch/torch_core.h"
#include "student_trainer/optim/adamw_state_file.h"
#include "student_trainer/optim/draft_optimizer.h"

namespace e3 {

class FusedAdamW : public DraftOptimizer {
 public:
  FusedAdamW(DraftModel& work, DraftModel* master, ProcessGroup* group,
             const DraftOptimizerOptions& options);

  void BeginStep() override;
  absl::Status FinishStep(double lr) override;
  void SyncWorkingWeights() override;
  absl::Status Save(const std::string& dir) override;
  absl::Status Load(const std::string& dir) override;
  const char* name() const override { return "fused"; }

  int64_t steps_taken() const { return step_; }
  // The global gradient norm of the last step (before clipping), on the
  // device; undefined before the first step.
  const at::Tensor& last_grad_norm() const { return grad_norm_; }

 private:
  // The gradients the update reads: the working draft's flat gradients,
  // averaged over the ranks (in fp32) under data parallelism.
  absl::StatusOr<at::Tensor> ReducedGradients();
  at::Tensor GradNorm(const at::Tensor& grad);
  bool UpdateWithKernel(const at::Tensor& grad, double lr);
  void UpdateWithAten(const at::Tensor& grad, double lr);
  // Views of the moments per trained parameter, for the checkpoint file.
  std::vector<NamedMoments> Moments() const;

  DraftModel& work_;
  DraftModel& trained_;  // the master, or work itself
  ProcessGroup* group_;
  DraftOptimizerOptions options_;
  at::Tensor exp_avg_, exp_avg_sq_;  // fp32, the flat layout
  at::Tensor lr_dev_, step_dev_;     // fp32 scalars on the device
  at::Tensor grad_norm_;
  int64_t step_ = 0;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_OPTIM_FUSED_ADAMW_H_
