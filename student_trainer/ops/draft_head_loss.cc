#include "student_trainer/ops/draft_head_loss.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>

#include "kernels/student_ops.h"
#include "student_trainer/ops/head_row_chunks.h"
#include "student_trainer/ops/kernel_switch.h"
#include "student_trainer/ops/lk_factors.h"
#include "student_trainer/ops/rms_norm.h"

namespace e3::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x *= g in place, g the loss's 0-dim output gradient: on the GPU a kernel
// reads g where it lies (ATen's broadcast of a 0-dim CUDA tensor takes its
// slow unvectorised path), else ATen.
void ScaleInPlace(at::Tensor& x, const at::Tensor& g) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (StudentKernelDtype(x, &dt) && x.is_contiguous() && g.numel() == 1 &&
      g.scalar_type() == at::kFloat && g.device() == x.device()) {
    const at::Tensor gc = g.contiguous();
    if (kernels::ScaleByDeviceScalar(dt, x.data_ptr(), x.numel(), gc.data_ptr<float>(),
                                             StudentKernelStream(x))) {
      CheckStudentKernelLaunch("ScaleByDeviceScalar");
      return;
    }
  }
#endif
  x.mul_(g.to(x.scalar_type()));
}

// y += x * g in place (the accumulated lm_head gradient into the
// parameter's), as ScaleInPlace: one kernel on the GPU, else ATen.
void AddScaledInPlace(at::Tensor& y, const at::Tensor& x, const at::Tensor& g) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (StudentKernelDtype(y, &dt) && x.scalar_type() == y.scalar_type() && x.sizes() == y.sizes() &&
      x.is_contiguous() && y.is_contiguous() && g.numel() == 1 && g.scalar_type() == at::kFloat &&
      g.device() == y.device()) {
    const at::Tensor gc = g.contiguous();
    if (kernels::AddScaledByDeviceScalar(dt, y.data_ptr(), x.data_ptr(), y.numel(),
                                                 gc.data_ptr<float>(), StudentKernelStream(y))) {
      CheckStudentKernelLaunch("AddScaledByDeviceScalar");
      return;
    }
  }
#endif
  y.add_(x * g.to(x.scalar_type()));
}

// The inputs and side outputs of one call, kept off the autograd signature.
struct HeadCall {
  const std::vector<HeadStepRows>* steps;
  const TargetDistribution* target;
  const DraftHeadWeights* weights;
  const DraftHeadOptions* options;
  int64_t tokens;
  DraftHeadLossOutput* out;
};

// Host values as a device vector without a copy from pageable memory (a
// synchronisation that would leave the GPU idle while the host queues the
// chunks' work): one fill per value.
at::Tensor DeviceVector(const std::vector<double>& values, const at::TensorOptions& opts) {
  std::vector<at::Tensor> parts;
  for (double v : values) parts.push_back(at::full({1}, v, opts));
  return at::cat(parts);
}

// log(a) where a > 0, else 0 (SpecForge's log acceptance rate).
at::Tensor LogWherePositive(const at::Tensor& a) {
  const at::Tensor positive = a > 0;
  return at::where(positive, at::where(positive, a, at::ones_like(a)).log(), at::zeros_like(a));
}

class DraftHeadLossFunction : public torch::autograd::Function<DraftHeadLossFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::TensorList hiddens_in,
                            const at::Tensor& anchor, HeadCall call) {
    (void)anchor;
    const std::vector<at::Tensor> hiddens = hiddens_in.vec();
    const auto& steps = *call.steps;
    const auto& wts = *call.weights;
    const auto& opt = *call.options;
    const int64_t num_steps = static_cast<int64_t>(hiddens.size());
    const at::ScalarType f = call.target->logits.scalar_type();
    const auto fopts = hiddens[0].options().dtype(f);
    const bool lk = opt.loss != HeadLossKind::kSoftCe;
    TORCH_CHECK(!lk || call.target->log_mass.defined(),
                "DraftHeadLoss: the LK losses need the target's log mass on the draft vocab");
    const std::vector<Chunk> chunks = Chunks(steps, opt.chunk_rows);
    std::vector<double> norms, step_weights;
    for (const HeadStepRows& st : steps) {
      norms.push_back(AcceptanceNorm(st));
      step_weights.push_back(st.step_weight);
    }
    // Only the LK losses read these.
    const at::Tensor acc_norm = lk ? DeviceVector(norms, fopts) : at::Tensor();
    StepFactors factors;
    const StepRowConstants constants = RowConstants(steps, call.tokens);
    if (lk) factors = LkFactors(chunks, hiddens, {&steps, call.target, call.weights, call.options}, fopts, acc_norm, constants);
    at::Tensor alpha_sum = at::zeros({num_steps}, fopts), log_alpha_sum = at::zeros({num_steps}, fopts);
    at::Tensor step_loss = at::zeros({num_steps}, fopts);
    at::Tensor step_hits = at::zeros({num_steps}, fopts.dtype(at::kLong));
    at::Tensor loss = at::zeros({}, fopts);
    at::Tensor lm_acc = at::zeros_like(wts.lm_head);
    at::Tensor norm_acc;
    std::vector<at::Tensor> dh;
    for (int64_t j = 0; j < num_steps; ++j) dh.push_back(StepGradient(hiddens[j], steps[j]));
    DraftHeadLossOutput& out = *call.out;
    for (int64_t j = 0; j < num_steps && opt.keep_logits; ++j) {
      out.logits.push_back(at::zeros({call.tokens, wts.lm_head.size(0)}, fopts));
    }
    for (int64_t j = 0; j < num_steps && opt.keep_token_losses; ++j) {
      out.token_losses.push_back(at::zeros({call.tokens}, fopts));
    }

    for (const Chunk& chunk_plan : chunks) {
      const std::vector<Segment>& chunk = chunk_plan.segments;
      ChunkRows c = Gather(chunk, hiddens, steps, constants);
      const bool normed_inputs = !wts.norm.defined();
      RmsNormResult nr = normed_inputs ? RmsNormResult{c.x, at::Tensor()} : RmsNormForward(c.x, wts.norm, wts.eps);
      at::Tensor logits = at::mm(nr.y, wts.lm_head.t());
      if (opt.keep_logits) KeepRows(chunk, steps, logits.to(f), &out.logits);
      SoftCrossEntropyResult r;
      if (!lk) {
        r = SoftCrossEntropyInPlace(logits, *call.target, c.target_rows, c.row_weight, c.grad_scale, nullptr,
                                    chunk_plan.RowRuns());
        loss.add_((r.loss.to(f) * c.grad_scale.to(f)).sum());
      } else {
        AcceptanceRows terms;
        terms.grad_scale = c.acc_scale * factors.acc.index_select(0, c.step_of_row).to(c.acc_scale.scalar_type());
        terms.log_form = opt.loss == HeadLossKind::kLkAlpha;
        const at::Tensor ce_scale =
            c.grad_scale * factors.ce.index_select(0, c.step_of_row).to(c.grad_scale.scalar_type());
        r = SoftCrossEntropyInPlace(logits, *call.target, c.target_rows, c.row_weight, ce_scale, &terms,
                                    chunk_plan.RowRuns());
        const at::Tensor w = c.row_weight.to(f), alpha = r.alpha.to(f);
        alpha_sum.index_add_(0, c.step_of_row, alpha * w);
        log_alpha_sum.index_add_(0, c.step_of_row, LogWherePositive(alpha) * w);
      }
      const at::Tensor& row_loss = r.loss;
      if (opt.keep_token_losses) KeepRows(chunk, steps, row_loss.unsqueeze(1), &out.token_losses);
      step_loss.index_add_(0, c.step_of_row, row_loss.to(f));
      const at::Tensor hit =
          r.argmax.eq(call.target->top.index_select(0, c.target_rows)).logical_and(c.row_weight != 0);
      step_hits.index_add_(0, c.step_of_row, hit.to(at::kLong));
      // `logits` now holds dloss/dlogits.
      const at::Tensor dy = at::mm(logits, wts.lm_head);
      lm_acc.addmm_(logits.t(), nr.y);
      at::Tensor dw;
      const at::Tensor dx_view = ChunkGradientView(chunk, steps, dh);
      if (normed_inputs) {
        if (dx_view.defined()) {
          dx_view.copy_(dy);
        } else {
          ScatterRows(chunk, steps, dy, &dh);
        }
        continue;
      }
      if (dx_view.defined()) {
        dw = RmsNormBackwardInto(dy, c.x, nr.rstd, wts.norm, dx_view);
      } else {
        at::Tensor dx;
        std::tie(dx, dw) = RmsNormBackward(dy, c.x, nr.rstd, wts.norm);
        ScatterRows(chunk, steps, dx, &dh);
      }
      norm_acc = norm_acc.defined() ? norm_acc.add_(dw) : dw;
    }
    step_loss.div_(static_cast<double>(call.tokens));
    if (lk) {
      out.step_acceptance = alpha_sum * acc_norm;
      step_loss = opt.loss == HeadLossKind::kLkAlpha
                      ? -log_alpha_sum * acc_norm
                      : factors.kl_weight * step_loss + (1.0 - factors.kl_weight) * (1.0 - out.step_acceptance);
      loss = (step_loss * DeviceVector(step_weights, fopts)).sum();
    }
    out.step_loss = step_loss;
    out.step_hits = step_hits;

    for (int64_t j = 0; j < num_steps; ++j) ctx->saved_data["dh" + std::to_string(j)] = dh[j];
    ctx->saved_data["steps"] = num_steps;
    ctx->saved_data["lm_acc"] = lm_acc;
    if (wts.norm.defined()) {
      ctx->saved_data["norm_acc"] = norm_acc.defined() ? norm_acc : at::zeros_like(wts.norm, fopts);
    }
    ctx->saved_data["lm_head_grad"] = wts.lm_head_grad;
    ctx->saved_data["norm_grad"] = wts.norm_grad;
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const int64_t num_steps = ctx->saved_data["steps"].toInt();
    TORCH_CHECK(ctx->saved_data.count("dh0") == 1,
                "DraftHeadLoss: backward ran twice; the hidden states' gradients are scaled in "
                "place and released by the first (retain_graph is not supported)");
    variable_list out;
    for (int64_t j = 0; j < num_steps; ++j) {
      const std::string key = "dh" + std::to_string(j);
      at::Tensor dh = ctx->saved_data[key].toTensor();
      ctx->saved_data.erase(key);
      if (ctx->needs_input_grad(j)) ScaleInPlace(dh, g);
      out.push_back(ctx->needs_input_grad(j) ? dh : at::Tensor());
    }
    if (ctx->needs_input_grad(num_steps)) {
      const at::Tensor lm_acc = ctx->saved_data["lm_acc"].toTensor();
      at::Tensor lm_head_grad = ctx->saved_data["lm_head_grad"].toTensor();
      AddScaledInPlace(lm_head_grad, lm_acc, g);
      if (ctx->saved_data.count("norm_acc") == 1) {
        ctx->saved_data["norm_grad"].toTensor().add_(ctx->saved_data["norm_acc"].toTensor() * g);
      }
    }
    out.push_back(at::Tensor());  // anchor
    out.push_back(at::Tensor());  // the call (not a tensor)
    return out;
  }

};

}  // namespace

namespace {

#ifdef E3_HAS_CUDA
// The kernel's call, or nullopt where it declines (the ATen path then runs).
std::optional<SoftCrossEntropyResult> SoftCrossEntropyKernel(at::Tensor& logits,
                                                             const TargetDistribution& target,
                                                             const at::Tensor& target_rows,
                                                             const at::Tensor& row_weight,
                                                             const at::Tensor& row_grad_scale,
                                                             const AcceptanceRows* acceptance,
                                                             const std::vector<int64_t>& row_runs) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  kernels::Dtype dt;
  auto fp32 = [](const at::Tensor& t) { return !t.defined() || t.scalar_type() == at::kFloat; };
  if (!StudentKernelDtype(logits, &dt) || !logits.is_contiguous() ||
      target.logits.scalar_type() != at::kFloat || !target.logits.is_contiguous() ||
      !fp32(row_weight) || !fp32(row_grad_scale) ||
      (acceptance != nullptr && (!fp32(target.log_mass) || !fp32(acceptance->grad_scale)))) {
    return std::nullopt;
  }
  SoftCrossEntropyResult r;
  r.loss = at::empty({rows}, row_weight.options());
  r.argmax = at::empty({rows}, target_rows.options());
  const at::Tensor w = row_weight.contiguous(), s = row_grad_scale.contiguous(),
                   tr = target_rows.contiguous();
  kernels::RowRuns runs;
  if (row_runs.size() <= static_cast<size_t>(kernels::kMaxRowRuns)) {  // else rows in order
    runs.count = static_cast<int>(row_runs.size());
    std::copy(row_runs.begin(), row_runs.end(), runs.length);
  }
  kernels::AcceptanceArgs args;
  at::Tensor log_mass, acc_scale;
  if (acceptance != nullptr) {
    r.alpha = at::empty({rows}, row_weight.options());
    log_mass = target.log_mass.contiguous();
    args.target_log_mass = log_mass.data_ptr<float>();
    if (acceptance->grad_scale.defined()) {
      acc_scale = acceptance->grad_scale.contiguous();
      args.acc_grad_scale = acc_scale.data_ptr<float>();
    }
    args.log_form = acceptance->log_form;
    args.write_grad = acceptance->write_grad;
    args.alpha = r.alpha.data_ptr<float>();
  }
  if (!kernels::SoftCrossEntropy(
          dt, logits.data_ptr(), rows, cols, target.logits.data_ptr<float>(),
          target.lse.data_ptr<float>(), tr.data_ptr<int64_t>(), w.data_ptr<float>(),
          s.data_ptr<float>(), r.loss.data_ptr<float>(), r.argmax.data_ptr<int64_t>(),
          acceptance != nullptr ? &args : nullptr, runs.count > 0 ? &runs : nullptr, StudentKernelStream(logits))) {
    return std::nullopt;
  }
  CheckStudentKernelLaunch("SoftCrossEntropy");
  return r;
}
#endif

#ifdef E3_HAS_CUDA
bool RowStatsKernel(TargetDistribution& t) {
  const at::Tensor& x = t.logits;
  if (!StudentKernelTakesFloat(x) || x.dim() != 2 || !x.is_contiguous()) return false;
  t.lse = at::empty({x.size(0)}, x.options());
  t.top = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  if (!kernels::RowLogSumExpArgmax(x.data_ptr<float>(), x.size(0), x.size(1), t.lse.data_ptr<float>(),
                                           t.top.data_ptr<int64_t>(), StudentKernelStream(x))) {
    return false;
  }
  CheckStudentKernelLaunch("RowLogSumExpArgmax");
  return true;
}
#endif

// min(P, q) follows q where q < P, half of it at a tie (at::minimum's gradient).
at::Tensor FollowsQ(const at::Tensor& q, const at::Tensor& p_full) {
  return at::where(q < p_full, at::ones_like(q), at::where(q == p_full, at::full_like(q, 0.5), at::zeros_like(q)));
}

}  // namespace

TargetDistribution TargetFromLogits(at::Tensor logits) {
  TargetDistribution t;
  t.logits = std::move(logits);
#ifdef E3_HAS_CUDA
  if (RowStatsKernel(t)) return t;
#endif
  t.lse = at::logsumexp(t.logits, -1);
  t.top = t.logits.argmax(-1);
  return t;
}

SoftCrossEntropyResult SoftCrossEntropyInPlace(at::Tensor& logits, const TargetDistribution& target,
                                               const at::Tensor& target_rows,
                                               const at::Tensor& row_weight,
                                               const at::Tensor& row_grad_scale,
                                               const AcceptanceRows* acceptance,
                                               const std::vector<int64_t>& row_runs) {
  TORCH_CHECK(acceptance == nullptr || target.log_mass.defined(),
              "SoftCrossEntropyInPlace: the acceptance terms need target.log_mass");
  TORCH_CHECK(std::accumulate(row_runs.begin(), row_runs.end(), int64_t{0}) == (row_runs.empty() ? 0 : logits.size(0)),
              "SoftCrossEntropyInPlace: row runs of ", c10::IntArrayRef(row_runs), " do not cover ", logits.size(0),
              " rows");
#ifdef E3_HAS_CUDA
  if (auto r = SoftCrossEntropyKernel(logits, target, target_rows, row_weight, row_grad_scale, acceptance,
                                      row_runs)) {
    return *r;
  }
#endif
  const at::ScalarType f = target.logits.scalar_type();
  const at::Tensor z = logits.to(f);
  const at::Tensor log_q = z - at::logsumexp(z, -1, /*keepdim=*/true);
  const at::Tensor target_z = target.logits.index_select(0, target_rows) -
                              target.lse.index_select(0, target_rows).unsqueeze(1);
  const at::Tensor p = target_z.exp();
  const at::Tensor w = row_weight.to(f).unsqueeze(1);
  SoftCrossEntropyResult r;
  r.loss = -(p * log_q).sum(-1) * w.squeeze(1);
  r.argmax = z.argmax(-1);
  at::Tensor grad = (row_grad_scale.to(f).unsqueeze(1) * w) * (log_q.exp() * p.sum(-1, true) - p);
  if (acceptance != nullptr) {
    const at::Tensor q = log_q.exp();
    const at::Tensor p_full =
        (target_z + target.log_mass.to(f).index_select(0, target_rows).unsqueeze(1)).exp();
    const at::Tensor trained = w.squeeze(1) != 0;
    r.alpha = at::where(trained, at::minimum(q, p_full).sum(-1), at::zeros_like(r.loss));
    if (!acceptance->write_grad) return r;
    const at::Tensor follows = FollowsQ(q, p_full);
    at::Tensor a = acceptance->grad_scale.to(f) * w.squeeze(1);
    if (acceptance->log_form) {
      a = at::where(r.alpha > 0, a / at::where(r.alpha > 0, r.alpha, at::ones_like(r.alpha)), at::zeros_like(a));
    }
    grad = grad + a.unsqueeze(1) * q * (follows - (follows * q).sum(-1, true));
  }
  logits.copy_(grad);
  return r;
}

DraftHeadLossOutput DraftHeadLoss(const std::vector<at::Tensor>& hiddens,
                                  const std::vector<HeadStepRows>& steps,
                                  const TargetDistribution& target, const DraftHeadWeights& weights,
                                  int64_t tokens, const DraftHeadOptions& options) {
  TORCH_CHECK(!hiddens.empty() && hiddens.size() == steps.size(), "DraftHeadLoss: ", hiddens.size(),
              " hidden states for ", steps.size(), " steps");
  TORCH_CHECK(options.chunk_rows > 0, "DraftHeadLoss: chunk_rows must be positive");
  DraftHeadLossOutput out;
  HeadCall call{&steps, &target, &weights, &options, tokens, &out};
  // As a TensorList, so that autograd sees every hidden state as an input.
  out.loss = DraftHeadLossFunction::apply(at::TensorList(hiddens), weights.anchor, call);
  return out;
}

}  // namespace e3::ops
