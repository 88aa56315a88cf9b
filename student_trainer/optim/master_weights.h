// Mixed-precision training with fp32 master weights: the draft computes in
// bf16 (or fp16) while AdamW updates fp32 copies of its parameters, so small
// updates are not rounded away and the optimizer state keeps full precision
// (the recipe SpecForge and Megatron use). The working draft's parameters
// are re-rounded from the masters after every step.
#ifndef E3_STUDENT_TRAINER_OPTIM_MASTER_WEIGHTS_H_
#define E3_STUDENT_TRAINER_OPTIM_MASTER_WEIGHTS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"

namespace e3 {

class MasterWeights {
 public:
  // `work` and `master` are the same module structure; `master` holds fp32
  // parameters on the same device. Copies master -> work.
  static absl::StatusOr<MasterWeights> Create(torch::nn::Module& work, torch::nn::Module& master);

  // master.grad = fp32(work.grad); the work gradients are then cleared.
  // A parameter without a gradient gets a zero master gradient, as AdamW
  // then still applies weight decay the way it would in fp32 training.
  void PullGradients();
  // work = round(master), after the optimizer step or a checkpoint load.
  void PushWeights();

 private:
  std::vector<at::Tensor> work_, master_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_OPTIM_MASTER_WEIGHTS_H_
