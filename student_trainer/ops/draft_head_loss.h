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

#include <cstdint>
#include <vector>

#include "common/torch/torch_core.h"

namespace e3::ops {

// What one TTT step trains.
struct HeadStepRows {
  at::Tensor rows;         // int64 [n]: positions whose logits are computed (device)
  at::Tensor target_rows;  // int64 [n]: each position's row of the target distribution
  at::Tensor row_weight;   // fp32 [n]: 1 where the position mask is set, else 0
  double step_weight = 1;  // the step's weight in the loss (step_weight^j)
  int64_t trained_positions = 0;  // sum of the position mask: the LK losses' normaliser
  // >= 0 where `rows` is the range [first_row, first_row + n) (a known host
  // fact: every position trained, as in long single samples): the head
  // then reads and writes those rows as views instead of gathering them.
  int64_t first_row = -1;
};

// The target distribution, built once per batch: logits over the draft
// vocab (fp32 [T, N]), their log-sum-exp [T] and argmax [T] (int64); for
// the LK losses also log_mass [T], the log of the target's probability
// mass on the draft vocab (full-vocabulary P = softmax(logits) * exp(log_mass)).
struct TargetDistribution {
  at::Tensor logits, lse, top;
  at::Tensor log_mass;
};

// logits with their log-sum-exp and argmax, read once by one kernel on the
// GPU (ATen's logsumexp and argmax read them four times), else by ATen.
TargetDistribution TargetFromLogits(at::Tensor logits);

// Each step's loss (student_trainer/step/ttt_step.h gives the formulas).
enum class HeadLossKind { kSoftCe, kLkAlpha, kLkLambda };

struct DraftHeadWeights {
  // [H]. Undefined: the hidden states come normalised (EAGLE-3.1's
  // norm_output), and the head is lm_head alone.
  at::Tensor norm, norm_grad;
  at::Tensor lm_head, lm_head_grad;  // [N, H]
  at::Tensor anchor;                 // see ops::LinearAccumulate
  double eps = 1e-6;
};

struct DraftHeadOptions {
  // Rows of logits alive at a time (chunks that interleave the steps' rows
  // may hold one row per step more).
  int64_t chunk_rows = 8192;
  bool keep_logits =
      false;  // also return every step's logits (fp32 [T, N], zero where not computed)
  bool keep_token_losses = false;
  HeadLossKind loss = HeadLossKind::kSoftCe;
  double kl_scale = 1.0, kl_decay = 1.0;  // kLkLambda's weight of the soft CE
};

struct DraftHeadLossOutput {
  at::Tensor loss;                 // scalar, differentiable: sum_j step_weight_j * ploss_j
  at::Tensor step_loss;            // [L] ploss_j, the step's loss (soft CE: token losses / T; no grad)
  at::Tensor step_hits;            // int64 [L]: trained positions whose argmax is the target's
  at::Tensor step_acceptance;      // [L] abar_j (the LK losses; undefined otherwise)
  std::vector<at::Tensor> logits;  // keep_logits
  std::vector<at::Tensor> token_losses;  // keep_token_losses: [T] per step
};

// hiddens[j] is step j's layer output [T, H]; `tokens` (T) normalises the
// losses as SpecForge's mean over all packed positions.
DraftHeadLossOutput DraftHeadLoss(const std::vector<at::Tensor>& hiddens,
                                  const std::vector<HeadStepRows>& steps,
                                  const TargetDistribution& target, const DraftHeadWeights& weights,
                                  int64_t tokens, const DraftHeadOptions& options);

// The expected-acceptance terms of a soft cross-entropy call (the LK
// losses; see kernels::AcceptanceArgs): target.log_mass must be set.
struct AcceptanceRows {
  at::Tensor grad_scale;  // [rows]: coefficient of d alpha / d logits (with write_grad)
  bool log_form = false;  // the gradient of log alpha instead
  bool write_grad = true;  // false: only alpha; the logits are left as they are
};

struct SoftCrossEntropyResult {
  at::Tensor loss;    // [rows] in the target's float type
  at::Tensor argmax;  // [rows] int64
  at::Tensor alpha;   // [rows] expected acceptance (with AcceptanceRows; 0 in rows of weight 0)
};

// Soft cross-entropy rows in place, as kernels::SoftCrossEntropy
// (the kernel on the GPU, ATen elsewhere): overwrites logits with
// row_grad_scale * row_weight * dloss/dlogits, plus the acceptance terms'
// gradient when `acceptance` is given. `row_runs`, when given, are the
// lengths of the rows' runs, one per TTT step, whose i-th rows read
// neighbouring target rows: the GPU kernel visits them interleaved
// (kernels::RowRuns; results do not depend on it).
SoftCrossEntropyResult SoftCrossEntropyInPlace(at::Tensor& logits, const TargetDistribution& target,
                                               const at::Tensor& target_rows,
                                               const at::Tensor& row_weight,
                                               const at::Tensor& row_grad_scale,
                                               const AcceptanceRows* acceptance = nullptr,
                                               const std::vector<int64_t>& row_runs = {});

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_DRAFT_HEAD_LOSS_H_
