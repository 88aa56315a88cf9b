// The LK losses' per-step factors (ttt_step.h): the gradient weights of
// the soft CE and of the acceptance terms, and kLkLambda's w_j, which
// needs each step's expected acceptance before the gradient pass.
#ifndef E3_STUDENT_TRAINER_OPS_LK_FACTORS_H_
#define E3_STUDENT_TRAINER_OPS_LK_FACTORS_H_

#include <vector>

#include "common/torch/torch_core.h"
#include "student_trainer/ops/draft_head_loss.h"
#include "student_trainer/ops/head_row_chunks.h"

namespace e3::ops {

// What the factors read of one head call.
struct LkInputs {
  const std::vector<HeadStepRows>* steps;
  const TargetDistribution* target;
  const DraftHeadWeights* weights;
  const DraftHeadOptions* options;
};

// Per step, on the device: the factors of the soft CE's and the
// acceptance terms' gradients, and kLkLambda's weight w_j.
struct StepFactors {
  at::Tensor ce, acc, kl_weight;  // [L]
};

// sum over each step's trained rows of alpha_t, from the draft's logits
// as they are before any update: kLkLambda's weights need abar_j before
// the gradient pass (one more forward of the head, no gradient written).
at::Tensor AcceptanceSums(const std::vector<Chunk>& chunks, const std::vector<at::Tensor>& hiddens,
                          const LkInputs& in, const at::TensorOptions& fopts, const StepRowConstants& constants);

StepFactors LkFactors(const std::vector<Chunk>& chunks, const std::vector<at::Tensor>& hiddens,
                      const LkInputs& in, const at::TensorOptions& fopts, const at::Tensor& acc_norm,
                      const StepRowConstants& constants);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_LK_FACTORS_H_
