// The draft's head and TTT loss over every step at once, for the fast TTT
// step: norm -> lm_head -> soft cross-entropy against the target
// distribution, with each step's trained positions gathered into row
// chunks, so the head's GEMMs run over all steps' rows together instead of
// once per step, and positions no step trains (prompt tokens of chat data)
// cost nothing.
//
// The loss is the graph's end, so its gradient is computed in the forward,
// chunk by chunk: the cross-entropy kernel overwrites each chunk's bf16
// logits with their gradient, which then goes through lm_head and the norm
// at once. No logits outlive their chunk, none is copied to fp32, and the
// backward only scales the stored gradients by the incoming one.
#ifndef E3_STUDENT_TRAINER_OPS_DRAFT_HEAD_LOSS_H_
#define E3_STUDENT_TRAINER_OPS_DRAFT_HEAD_LOSS_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace e3::ops {

// What one TTT step trains.
struct HeadStepRows {
  at::Tensor rows;         // int64 [n]: positions whose logits are computed (device)
  at::Tensor target_rows;  // int64 [n]: each position's row of the target distribution
  at::Tensor row_weight;   // fp32 [n]: 1 where the position mask is set, else 0
  double step_weight = 1;  // the step's weight in the loss (step_weight^j)
};

// The target distribution, built once per batch: logits over the draft
// vocab (fp32 [T, N]), their log-sum-exp [T] and argmax [T] (int64).
struct TargetDistribution {
  at::Tensor logits, lse, top;
};

struct DraftHeadWeights {
  at::Tensor norm, norm_grad;        // [H]
  at::Tensor lm_head, lm_head_grad;  // [N, H]
  at::Tensor anchor;                 // see ops::LinearAccumulate
  double eps = 1e-6;
};

struct DraftHeadOptions {
  int64_t chunk_rows = 8192;  // rows of logits alive at a time
  bool keep_logits =
      false;  // also return every step's logits (fp32 [T, N], zero where not computed)
  bool keep_token_losses = false;
};

struct DraftHeadLossOutput {
  at::Tensor loss;                 // scalar, differentiable: sum_j step_weight_j * ploss_j
  at::Tensor step_loss;            // [L] ploss_j = sum of the step's token losses / T (no grad)
  at::Tensor step_hits;            // int64 [L]: trained positions whose argmax is the target's
  std::vector<at::Tensor> logits;  // keep_logits
  std::vector<at::Tensor> token_losses;  // keep_token_losses: [T] per step
};

// hiddens[j] is step j's layer output [T, H]; `tokens` (T) normalises the
// losses as SpecForge's mean over all packed positions.
DraftHeadLossOutput DraftHeadLoss(const std::vector<at::Tensor>& hiddens,
                                  const std::vector<HeadStepRows>& steps,
                                  const TargetDistribution& target, const DraftHeadWeights& weights,
                                  int64_t tokens, const DraftHeadOptions& options);

// Soft cross-entropy rows in place, as student_kernels::SoftCrossEntropy
// (the kernel on the GPU, ATen elsewhere): returns {loss [rows] in the
// target's float type, argmax [rows] int64} and overwrites logits with
// row_grad_scale * row_weight * dloss/dlogits.
std::pair<at::Tensor, at::Tensor> SoftCrossEntropyInPlace(at::Tensor& logits,
                                                          const TargetDistribution& target,
                                                          const at::Tensor& target_rows,
                                                          const at::Tensor& row_weight,
                                                          const at::Tensor& row_grad_scale);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_DRAFT_HEAD_LOSS_H_
