// Training-time test (TTT): the EAGLE-3 training forward and loss over one
// packed batch, with SpecForge v0.2's semantics (specforge/core/eagle3.py,
// OnlineEagle3Model.forward; DESIGN.md "Numerics"):
//
// - fc is applied once to aux_hidden; step j feeds step j-1's layer output.
// - input_ids and the target distribution are shifted left by one, within
//   each sample; a sample's last position has no next token, so it gets id
//   0 and loss mask 0 (SpecForge pads rows instead; packing must not leak
//   the next sample's first token into this one).
// - Target: softmax(last_hidden @ target_head^T) over the draft vocab, in
//   fp32, computed here from the frozen target head rows.
// - position mask = loss_mask x [target_argmax in draft vocab].
// - At step j the query at t attends to step-0 keys at positions <= t of
//   its sample and to the keys of steps 1..j at t. Position ids restart per
//   sample; step j rotates its queries and keys at position t + j, as a
//   serving engine does when each draft step advances the position by one
//   (SpecForge's PR #424 made its training do the same). SpecForge v0.2
//   kept position t at every step: TttPositions::kFixed.
// - Between steps ids, loss mask and position mask shift left by one more
//   (again within samples).
// - ploss_j = sum_t pmask_j[t] * (-sum_v p[t,v] log q_j[t,v]) / T, i.e. the
//   mean over all T packed positions as SpecForge's `.mean()` over
//   (batch, seq); loss = sum_j 0.8^j ploss_j.
// - The LK losses (TttLoss::kLkAlpha / kLkLambda) train the expected
//   acceptance rate instead, as SpecForge HEAD's specforge/core/lk_loss.py
//   and algorithms/eagle3/model.py do: alpha_t = sum_v min(P[t,v], q_j[t,v])
//   over the draft vocab, where P is the target's full-vocabulary
//   distribution (p times the target's mass on the draft vocab), is the
//   probability that a draft token sampled from q_j is accepted.
//   abar_j = sum_t pmask_j[t] alpha_t / sum_t pmask_j[t]. kLkAlpha:
//   ploss_j = -(sum_t pmask_j[t] log alpha_t) / sum_t pmask_j[t];
//   kLkLambda: ploss_j = w_j ce_j + (1 - w_j)(1 - abar_j) with ce_j the
//   soft cross-entropy above and w_j = kl_scale exp(-kl_decay abar_j)
//   (abar_j not differentiated). Steps are weighted 0.8^j as before.
// - acc_j = #{t : pmask_j[t] and argmax q_j[t] == argmax p[t]} /
//   max(sum_t loss_mask_j[t], 1e-6) (SpecForge's _compute_metric_acc);
//   tau = 1 + sum_k prod_{i<=k} acc_i.
#ifndef E3_STUDENT_TRAINER_STEP_TTT_STEP_H_
#define E3_STUDENT_TRAINER_STEP_TTT_STEP_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/feed/teacher_batch.h"

namespace e3 {

// Which implementation runs the step (same semantics; see fast_step.h).
enum class TttKernels {
  kReference,  // the plain LibTorch op sequence below
  kFast,       // fused kernels, flash attention, one head over all steps
};

// "reference" or "fast"; InvalidArgument naming the flag otherwise.
absl::StatusOr<TttKernels> ParseTttKernels(std::string_view name);

// The rope positions of TTT step j (see above).
enum class TttPositions {
  kAdvancing,  // t + j, as at inference
  kFixed,      // t at every step (SpecForge v0.2)
};
// "advancing" or "fixed"; InvalidArgument naming the flag otherwise.
absl::StatusOr<TttPositions> ParseTttPositions(std::string_view name);

// What each TTT step's loss is (see above).
enum class TttLoss {
  kSoftCe,    // soft cross-entropy against the target distribution
  kLkAlpha,   // -log of the expected acceptance rate
  kLkLambda,  // soft CE blended into 1 - acceptance rate as acceptance grows
};
// "soft_ce", "lk_alpha" or "lk_lambda"; InvalidArgument naming the flag otherwise.
absl::StatusOr<TttLoss> ParseTttLoss(std::string_view name);
// The LK losses need the target's full-vocabulary normaliser: the draft
// must keep the target head's other rows (Eagle3DraftOptions::keep_full_target_head).
inline bool NeedsFullTargetHead(TttLoss loss) { return loss != TttLoss::kSoftCe; }

struct TttOptions {
  int64_t length = 7;              // steps unrolled
  double step_weight = 0.8;        // step j's loss is weighted step_weight^j
  bool keep_logits = false;        // return each step's draft logits (detached)
  bool keep_token_losses = false;  // return each step's masked per-position loss
  TttKernels kernels = TttKernels::kReference;
  TttPositions positions = TttPositions::kAdvancing;
  TttLoss loss = TttLoss::kSoftCe;
  double kl_scale = 1.0, kl_decay = 1.0;  // kLkLambda's weight of the soft CE
  // Leave the metrics on the device (TttOutput::pending_metrics) until
  // ResolveTttMetrics: a trainer reads them after the optimizer step, so
  // the host never waits for the forward before enqueuing the backward.
  bool defer_metrics = false;
  // Fast path: rows of head logits alive at a time (memory against GEMM
  // size); 0 picks T clamped to [2048, 8192], so the buffer stays small
  // against the step's per-token memory at any T.
  int64_t head_chunk_rows = 0;
  // Fast path: from step 1 on, run the midlayer only over positions that
  // some step from this one on still trains (a row at step j >= 1 feeds
  // only its own row at later steps), when that leaves out at least 5% of
  // the rows. Gradients are unchanged; prompt tokens of chat data cost
  // one step instead of `length`. Off for A/B measurement.
  bool skip_untrained_rows = true;
};

struct TttOutput {
  at::Tensor loss;                      // scalar, differentiable: sum_j w^j ploss_j
  std::vector<at::Tensor> step_losses;  // reference path: differentiable ploss_j (scalars)
  // On the device until resolved: per step (ploss, hits, loss tokens,
  // position tokens, expected acceptance rate), then the loss; float64
  // [kTttMetricsPerStep * length + 1].
  at::Tensor pending_metrics;
  // Host copies for logging and metrics (filled by ResolveTttMetrics).
  double loss_value = 0;
  std::vector<double> ploss;
  std::vector<double> acc;
  // acc_j's numerator and denominator, for summing over ranks or batches.
  std::vector<int64_t> correct;
  std::vector<int64_t> loss_tokens;      // sum of the step's loss mask
  std::vector<int64_t> position_tokens;  // sum of the step's position mask
  // The LK losses' abar_j (the expected acceptance rate over the step's
  // trained positions); empty under the soft CE.
  std::vector<double> acceptance_rate;
  double tau = 1.0;
  int64_t num_tokens = 0;                // T, the loss normaliser
  std::vector<at::Tensor> logits;        // [T, N] fp32 per step, when keep_logits
  std::vector<at::Tensor> token_losses;  // [T] per step (before / T), when keep_token_losses
  // Rows the midlayer ran over, summed over steps (length * T unless the
  // fast path skipped untrained rows).
  int64_t midlayer_rows = 0;
};

// Runs the TTT forward for `batch` and returns the loss with its autograd
// graph (call loss.backward()) plus the metrics. InvalidArgument names the
// first batch field with a wrong shape, dtype or value; LibTorch errors
// become Internal.
absl::StatusOr<TttOutput> RunTtt(Eagle3DraftImpl& draft, const TeacherBatch& batch,
                                 const TttOptions& options = {});

inline constexpr int64_t kTttMetricsPerStep = 5;

// Copies pending_metrics to the host (one synchronisation) and fills
// loss_value, ploss, acc, correct, the token counts and tau. A no-op once
// resolved.
void ResolveTttMetrics(TttOutput* out);

// Simulated acceptance length 1 + sum_k prod_{i<=k} acc_i.
double SimulatedAcceptanceLength(const std::vector<double>& acc);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STEP_TTT_STEP_H_
