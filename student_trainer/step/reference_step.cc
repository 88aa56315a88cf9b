#include "student_trainer/step/reference_step.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "student_trainer/step/batch_checks.h"

namespace e3 {
namespace {

// Soft cross-entropy per position, -w[t] * sum_v p[rows[t], v] * log_softmax(logits[t])_v,
// as an autograd function so that each step keeps only its logits (and a
// [T] logsumexp) for backward: the [T, N] target rows are gathered from
// the one shared target_p again in backward instead of being saved per
// step, which halves the activation memory of the loss (N is the draft
// vocab, 32k for Llama-3 drafts). SpecForge's LogSoftmaxLoss kernel saves
// the same things for the same reason.
class MaskedSoftCrossEntropy : public torch::autograd::Function<MaskedSoftCrossEntropy> {
 public:
  // logits [T, N] (requires grad), target_p [T, N], rows [T] int64 (which
  // target row each position learns), weight [T] (0 where masked).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor logits,
                            at::Tensor target_p, at::Tensor rows, at::Tensor weight) {
    at::Tensor lse = at::logsumexp(logits, -1, /*keepdim=*/true);
    at::Tensor p = target_p.index_select(0, rows);
    at::Tensor loss = -(p * (logits - lse)).sum(-1) * weight;
    ctx->save_for_backward({logits, lse, target_p, rows, weight});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_output) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& lse = saved[1];
    at::Tensor p = saved[2].index_select(0, saved[3]);
    at::Tensor coef = (grad_output[0] * saved[4]).unsqueeze(1);
    // d/dz of -sum_v p_v (z_v - lse(z)) = softmax(z) * sum_v p_v - p.
    at::Tensor grad = coef * ((logits - lse).exp() * p.sum(-1, /*keepdim=*/true) - p);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Step j's LK loss (ttt_step.h) and its expected acceptance rate abar_j
// (detached): alpha_t = sum_v min(P, q) with P = p * mass the target's
// full-vocabulary probabilities on the draft vocab, as SpecForge HEAD's
// compute_acceptance_rate / compute_lk_loss.
std::pair<at::Tensor, at::Tensor> LkStepLoss(const at::Tensor& logits, const at::Tensor& target_p,
                                             const at::Tensor& mass, const at::Tensor& rows,
                                             const at::Tensor& position_mask, const at::Tensor& ce,
                                             const TttOptions& options) {
  at::Tensor p_full;
  {
    torch::NoGradGuard no_grad;
    p_full = target_p.index_select(0, rows) * mass.index_select(0, rows).unsqueeze(1);
  }
  const at::Tensor alpha = at::minimum(p_full, at::softmax(logits, -1)).sum(-1);
  const at::Tensor trained = position_mask.sum().clamp_min(1e-8);
  const at::Tensor abar = (alpha * position_mask).sum() / trained;
  if (options.loss == TttLoss::kLkAlpha) {
    // log alpha_t where alpha_t > 0, else 0; the inner where keeps log's
    // gradient finite where alpha_t is 0.
    const at::Tensor positive = alpha > 0;
    const at::Tensor log_alpha =
        at::where(positive, at::where(positive, alpha, at::ones_like(alpha)).log(), at::zeros_like(alpha));
    return {-(log_alpha * position_mask).sum() / trained, abar.detach()};
  }
  const at::Tensor w = options.kl_scale * at::exp(-options.kl_decay * abar.detach());
  return {w * ce + (1 - w) * (1 - abar), abar.detach()};
}

// Shifts within samples: Shift(x, k)[t] = x[t + k] when t + k is in t's
// sample, else zero (false, id 0). `end[t]` is the end of t's sample.
class SampleShifter {
 public:
  SampleShifter(const std::vector<int64_t>& cu_seqlens, const at::Device& device) {
    const int64_t total = cu_seqlens.back();
    std::vector<int64_t> end(static_cast<size_t>(total));
    for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
      std::fill(end.begin() + cu_seqlens[s], end.begin() + cu_seqlens[s + 1], cu_seqlens[s + 1]);
    }
    end_ = torch::tensor(end, torch::kLong).to(device);
    arange_ = torch::arange(total, torch::TensorOptions().dtype(torch::kLong).device(device));
  }

  // Index of the element that lands at t after a shift by k (t itself
  // where it would leave the sample), and whether it stays in the sample.
  std::pair<at::Tensor, at::Tensor> Index(int64_t k) const {
    at::Tensor next = arange_ + k;
    at::Tensor valid = next < end_;
    return {torch::where(valid, next, arange_), valid};
  }

  at::Tensor Shift(const at::Tensor& x, int64_t k) const {
    if (k == 0) return x;
    auto [idx, valid] = Index(k);
    at::Tensor moved = x.index_select(0, idx);
    return torch::where(valid, moved, torch::zeros_like(moved));
  }

 private:
  at::Tensor end_;
  at::Tensor arange_;
};

}  // namespace

absl::StatusOr<TttOutput> RunTttReference(Eagle3DraftImpl& draft, const TeacherBatch& batch, const TttOptions& options) {
  const Eagle3DraftConfig& c = draft.config();
  E3_RETURN_IF_ERROR(ValidateTttOptions(options));
  E3_ASSIGN_OR_RETURN(std::vector<int64_t> cu, ValidateTttBatch(c, batch));
  const int64_t total = cu.back();

  const at::Device device = draft.options().device;
  const at::ScalarType loss_type = AtLeastFloat(draft.options().dtype);
  at::Tensor ids = batch.input_ids.to(device, at::kLong);
  at::Tensor target_argmax = batch.target_argmax.to(device, at::kLong);
  E3_RETURN_IF_ERROR(CheckIdRange("input_ids", ids, c.vocab_size));
  E3_RETURN_IF_ERROR(CheckIdRange("target_argmax", target_argmax, c.vocab_size));

  SampleShifter shifter(cu, device);
  TttOutput out;
  out.num_tokens = total;
  out.midlayer_rows = total * options.length;

  // Step-0 masks and targets (no autograd).
  at::Tensor loss_mask0, position_mask0, target_p, target_top, target_mass;
  const bool lk = options.loss != TttLoss::kSoftCe;
  {
    torch::NoGradGuard no_grad;
    at::Tensor loss_mask = batch.loss_mask.to(device) != 0;
    // A sample's last position has no next token to learn.
    loss_mask0 = loss_mask.logical_and(shifter.Index(1).second);
    at::Tensor in_draft = draft.t2d.index_select(0, target_argmax);
    position_mask0 = loss_mask0.logical_and(shifter.Shift(in_draft, 1));
    // Unshifted here: step j reads row t + j + 1 through its row index.
    const at::Tensor target_logits = draft.TargetLogits(batch.last_hidden).to(loss_type);
    target_p = at::softmax(target_logits, -1);
    target_top = target_p.argmax(-1);
    if (lk) {
      target_mass =
          draft.TargetDraftLogMass(batch.last_hidden, at::logsumexp(target_logits, -1)).exp();
    }
  }

  PackedRope rope = draft.MakePackedRope(cu);
  TttKvCache cache;
  at::Tensor hidden = draft.ProjectAux(batch.aux_hidden);
  std::vector<at::Tensor> host_rows;  // ploss, correct, loss tokens, position tokens per step
  double weight = 1.0;
  for (int64_t j = 0; j < options.length; ++j) {
    at::Tensor rows, loss_mask_j, position_mask_j, ids_j;
    {
      torch::NoGradGuard no_grad;
      rows = shifter.Index(j + 1).first;
      ids_j = shifter.Shift(ids, j + 1);
      loss_mask_j = shifter.Shift(loss_mask0, j);
      position_mask_j = shifter.Shift(position_mask0, j);
    }
    if (j > 0 && options.positions == TttPositions::kAdvancing) rope = draft.MakePackedRope(cu, j);
    Eagle3DraftImpl::HeadOutput head = draft.Head(draft.Step(draft.Embed(ids_j), hidden, rope, &cache));
    hidden = head.next_hidden;
    at::Tensor logits = head.logits.to(loss_type);
    at::Tensor token_loss =
        MaskedSoftCrossEntropy::apply(logits, target_p, rows, position_mask_j.to(loss_type));
    at::Tensor step_loss = token_loss.sum() / static_cast<double>(total);
    at::Tensor acceptance = torch::full({}, -1.0, step_loss.options());  // not measured
    if (lk) {
      std::tie(step_loss, acceptance) = LkStepLoss(logits, target_p, target_mass, rows,
                                                   position_mask_j.to(loss_type), step_loss, options);
    }
    out.loss = j == 0 ? step_loss : out.loss + step_loss * weight;
    out.step_losses.push_back(step_loss);
    weight *= options.step_weight;

    torch::NoGradGuard no_grad;
    at::Tensor hit =
        logits.argmax(-1).eq(target_top.index_select(0, rows)).logical_and(position_mask_j);
    host_rows.push_back(
        torch::stack({step_loss.detach().to(at::kDouble), hit.sum().to(at::kDouble),
                      loss_mask_j.sum().to(at::kDouble), position_mask_j.sum().to(at::kDouble),
                      acceptance.to(at::kDouble)}));
    if (options.keep_logits) out.logits.push_back(logits.detach());
    if (options.keep_token_losses) out.token_losses.push_back(token_loss.detach());
  }

  out.pending_metrics = torch::cat({torch::stack(host_rows).reshape({-1}), out.loss.detach().to(at::kDouble).reshape({1})});
  if (!options.defer_metrics) ResolveTttMetrics(&out);
  return out;
}

}  // namespace e3
