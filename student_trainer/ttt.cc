#include "student_trainer/ttt.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

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

absl::Status FieldError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("TTT batch: ", field, ": ", what));
}

std::string ShapeOf(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes().vec(), ", "), "]");
}

absl::Status CheckShape(const std::string& field, const at::Tensor& t,
                        const std::vector<int64_t>& shape, bool integer) {
  if (!t.defined()) return FieldError(field, "missing");
  if (t.sizes().vec() != shape) {
    return FieldError(
        field, absl::StrCat("expected shape [", absl::StrJoin(shape, ", "), "], got ", ShapeOf(t)));
  }
  if (integer && (t.is_floating_point() || t.is_complex() || t.scalar_type() == at::kBool)) {
    return FieldError(
        field, absl::StrCat("expected an integer dtype, got ", c10::toString(t.scalar_type())));
  }
  if (!integer && !t.is_floating_point()) {
    return FieldError(
        field, absl::StrCat("expected a floating dtype, got ", c10::toString(t.scalar_type())));
  }
  return absl::OkStatus();
}

absl::Status CheckIdRange(const std::string& field, const at::Tensor& ids, int64_t vocab) {
  const int64_t lo = ids.min().item<int64_t>();
  const int64_t hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    return FieldError(field,
                      absl::StrCat("ids must lie in [0, ", vocab, "), got min ", lo, ", max ", hi));
  }
  return absl::OkStatus();
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

absl::StatusOr<TttOutput> RunTttImpl(Eagle3DraftImpl& draft, const TttBatch& batch,
                                     const TttOptions& options) {
  const Eagle3DraftConfig& c = draft.config();
  if (options.length < 1)
    return absl::InvalidArgumentError("TTT options: length must be at least 1");
  if (!std::isfinite(options.step_weight))
    return absl::InvalidArgumentError("TTT options: step_weight must be finite");

  if (!batch.input_ids.defined() || batch.input_ids.dim() != 1 || batch.input_ids.size(0) == 0) {
    return FieldError("input_ids", "expected a non-empty 1-D tensor");
  }
  const int64_t total = batch.input_ids.size(0);
  E3_RETURN_IF_ERROR(CheckShape("input_ids", batch.input_ids, {total}, /*integer=*/true));
  if (!batch.cu_seqlens.defined() || batch.cu_seqlens.dim() != 1 || batch.cu_seqlens.size(0) < 2) {
    return FieldError("cu_seqlens", "expected a 1-D tensor of at least 2 offsets");
  }
  E3_RETURN_IF_ERROR(
      CheckShape("cu_seqlens", batch.cu_seqlens, {batch.cu_seqlens.size(0)}, /*integer=*/true));
  at::Tensor cu_cpu = batch.cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> cu(cu_cpu.data_ptr<int64_t>(), cu_cpu.data_ptr<int64_t>() + cu_cpu.numel());
  if (cu.front() != 0 || cu.back() != total) {
    return FieldError("cu_seqlens", absl::StrCat("must start at 0 and end at T = ", total,
                                                 ", got [", absl::StrJoin(cu, ", "), "]"));
  }
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) return FieldError("cu_seqlens", absl::StrCat("decreases at index ", i));
  }
  if (!batch.loss_mask.defined() || batch.loss_mask.sizes().vec() != std::vector<int64_t>{total}) {
    return FieldError("loss_mask", absl::StrCat("expected shape [", total, "]"));
  }
  E3_RETURN_IF_ERROR(CheckShape("aux_hidden", batch.aux_hidden,
                                {total, c.num_aux * c.target_hidden_size},
                                /*integer=*/false));
  E3_RETURN_IF_ERROR(CheckShape("last_hidden", batch.last_hidden, {total, c.target_hidden_size},
                                /*integer=*/false));
  E3_RETURN_IF_ERROR(CheckShape("target_argmax", batch.target_argmax, {total}, /*integer=*/true));

  const at::Device device = draft.options().device;
  const at::ScalarType loss_type = AtLeastFloat(draft.options().dtype);
  at::Tensor ids = batch.input_ids.to(device, at::kLong);
  at::Tensor target_argmax = batch.target_argmax.to(device, at::kLong);
  E3_RETURN_IF_ERROR(CheckIdRange("input_ids", ids, c.vocab_size));
  E3_RETURN_IF_ERROR(CheckIdRange("target_argmax", target_argmax, c.vocab_size));

  SampleShifter shifter(cu, device);
  TttOutput out;
  out.num_tokens = total;

  // Step-0 masks and targets (no autograd).
  at::Tensor loss_mask0, position_mask0, target_p, target_top;
  {
    torch::NoGradGuard no_grad;
    at::Tensor loss_mask = batch.loss_mask.to(device) != 0;
    // A sample's last position has no next token to learn.
    loss_mask0 = loss_mask.logical_and(shifter.Index(1).second);
    at::Tensor in_draft = draft.t2d.index_select(0, target_argmax);
    position_mask0 = loss_mask0.logical_and(shifter.Shift(in_draft, 1));
    // Unshifted here: step j reads row t + j + 1 through its row index.
    target_p = at::softmax(draft.TargetLogits(batch.last_hidden), -1, loss_type);
    target_top = target_p.argmax(-1);
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
    hidden = draft.Step(draft.Embed(ids_j), hidden, rope, &cache);
    at::Tensor logits = draft.Logits(hidden).to(loss_type);
    at::Tensor token_loss =
        MaskedSoftCrossEntropy::apply(logits, target_p, rows, position_mask_j.to(loss_type));
    at::Tensor step_loss = token_loss.sum() / static_cast<double>(total);
    out.loss = j == 0 ? step_loss : out.loss + step_loss * weight;
    out.step_losses.push_back(step_loss);
    weight *= options.step_weight;

    torch::NoGradGuard no_grad;
    at::Tensor hit =
        logits.argmax(-1).eq(target_top.index_select(0, rows)).logical_and(position_mask_j);
    host_rows.push_back(
        torch::stack({step_loss.detach().to(at::kDouble), hit.sum().to(at::kDouble),
                      loss_mask_j.sum().to(at::kDouble), position_mask_j.sum().to(at::kDouble)}));
    if (options.keep_logits) out.logits.push_back(logits.detach());
    if (options.keep_token_losses) out.token_losses.push_back(token_loss.detach());
  }

  // One device-to-host copy for all metrics.
  at::Tensor metrics = torch::stack(host_rows).to(at::kCPU).contiguous();
  auto m = metrics.accessor<double, 2>();
  for (int64_t j = 0; j < options.length; ++j) {
    out.ploss.push_back(m[j][0]);
    out.correct.push_back(static_cast<int64_t>(m[j][1]));
    out.loss_tokens.push_back(static_cast<int64_t>(m[j][2]));
    out.position_tokens.push_back(static_cast<int64_t>(m[j][3]));
    out.acc.push_back(m[j][1] / std::max(m[j][2], 1e-6));
  }
  out.tau = SimulatedAcceptanceLength(out.acc);
  return out;
}

}  // namespace

double SimulatedAcceptanceLength(const std::vector<double>& acc) {
  double tau = 1.0;
  double prod = 1.0;
  for (double a : acc) {
    prod *= a;
    tau += prod;
  }
  return tau;
}

absl::StatusOr<TttOutput> RunTtt(Eagle3DraftImpl& draft, const TttBatch& batch,
                                 const TttOptions& options) {
  try {
    return RunTttImpl(draft, batch, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("TTT forward: ", e.what_without_backtrace()));
  }
}

}  // namespace e3
