#include "student_trainer/ops/draft_head_loss.h"

#include <algorithm>

#include "student_trainer/ops/kernel_switch.h"
#include "student_trainer/ops/rms_norm.h"

namespace e3::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A run of one step's trained rows inside a chunk.
struct Segment {
  int64_t step, begin, length;
};

// Splits the steps' rows, in step order, into chunks of at most
// `chunk_rows` rows (a step may span chunks, a chunk several steps).
std::vector<std::vector<Segment>> Chunks(const std::vector<HeadStepRows>& steps,
                                         int64_t chunk_rows) {
  std::vector<std::vector<Segment>> chunks(1);
  int64_t filled = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(steps.size()); ++j) {
    const int64_t n = steps[j].rows.numel();
    for (int64_t begin = 0; begin < n;) {
      if (filled == chunk_rows) {
        chunks.emplace_back();
        filled = 0;
      }
      const int64_t take = std::min(n - begin, chunk_rows - filled);
      chunks.back().push_back({j, begin, take});
      begin += take;
      filled += take;
    }
  }
  if (chunks.back().empty()) chunks.pop_back();
  return chunks;
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

// One chunk's rows gathered from the steps' tensors, with their per-row data.
struct ChunkRows {
  at::Tensor x, target_rows, row_weight, grad_scale, step_of_row;
};

ChunkRows Gather(const std::vector<Segment>& chunk, const std::vector<at::Tensor>& hiddens,
                 const std::vector<HeadStepRows>& steps, int64_t tokens) {
  std::vector<at::Tensor> x, tr, w, s, j;
  for (const Segment& seg : chunk) {
    const HeadStepRows& st = steps[seg.step];
    x.push_back(hiddens[seg.step].index_select(0, st.rows.narrow(0, seg.begin, seg.length)));
    tr.push_back(st.target_rows.narrow(0, seg.begin, seg.length));
    w.push_back(st.row_weight.narrow(0, seg.begin, seg.length));
    s.push_back(
        at::full({seg.length}, st.step_weight / static_cast<double>(tokens), w.back().options()));
    j.push_back(at::full({seg.length}, seg.step, tr.back().options()));
  }
  return {at::cat(x, 0), at::cat(tr, 0), at::cat(w, 0), at::cat(s, 0), at::cat(j, 0)};
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
    at::Tensor step_loss = at::zeros({num_steps}, fopts);
    at::Tensor step_hits = at::zeros({num_steps}, fopts.dtype(at::kLong));
    at::Tensor loss = at::zeros({}, fopts);
    at::Tensor lm_acc = at::zeros_like(wts.lm_head);
    at::Tensor norm_acc;
    std::vector<at::Tensor> dh;
    for (const at::Tensor& h : hiddens) dh.push_back(at::zeros_like(h));
    DraftHeadLossOutput& out = *call.out;
    for (int64_t j = 0; j < num_steps && opt.keep_logits; ++j) {
      out.logits.push_back(at::zeros({call.tokens, wts.lm_head.size(0)}, fopts));
    }
    for (int64_t j = 0; j < num_steps && opt.keep_token_losses; ++j) {
      out.token_losses.push_back(at::zeros({call.tokens}, fopts));
    }

    for (const std::vector<Segment>& chunk : Chunks(steps, opt.chunk_rows)) {
      ChunkRows c = Gather(chunk, hiddens, steps, call.tokens);
      RmsNormResult nr = RmsNormForward(c.x, wts.norm, wts.eps);
      at::Tensor logits = at::mm(nr.y, wts.lm_head.t());
      if (opt.keep_logits) KeepRows(chunk, steps, logits.to(f), &out.logits);
      auto [row_loss, argmax] =
          SoftCrossEntropyInPlace(logits, *call.target, c.target_rows, c.row_weight, c.grad_scale);
      if (opt.keep_token_losses) KeepRows(chunk, steps, row_loss.unsqueeze(1), &out.token_losses);
      step_loss.index_add_(0, c.step_of_row, row_loss.to(f));
      loss.add_((row_loss.to(f) * c.grad_scale.to(f)).sum());
      const at::Tensor hit =
          argmax.eq(call.target->top.index_select(0, c.target_rows)).logical_and(c.row_weight != 0);
      step_hits.index_add_(0, c.step_of_row, hit.to(at::kLong));
      // `logits` now holds dloss/dlogits.
      const at::Tensor dy = at::mm(logits, wts.lm_head);
      lm_acc.addmm_(logits.t(), nr.y);
      auto [dx, dw] = RmsNormBackward(dy, c.x, nr.rstd, wts.norm);
      norm_acc = norm_acc.defined() ? norm_acc.add_(dw) : dw;
      ScatterRows(chunk, steps, dx, &dh);
    }
    step_loss.div_(static_cast<double>(call.tokens));
    out.step_loss = step_loss;
    out.step_hits = step_hits;

    for (int64_t j = 0; j < num_steps; ++j) ctx->saved_data["dh" + std::to_string(j)] = dh[j];
    ctx->saved_data["steps"] = num_steps;
    ctx->saved_data["lm_acc"] = lm_acc;
    ctx->saved_data["norm_acc"] = norm_acc.defined() ? norm_acc : at::zeros_like(wts.norm, fopts);
    ctx->saved_data["lm_head_grad"] = wts.lm_head_grad;
    ctx->saved_data["norm_grad"] = wts.norm_grad;
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const int64_t num_steps = ctx->saved_data["steps"].toInt();
    variable_list out;
    for (int64_t j = 0; j < num_steps; ++j) {
      const at::Tensor dh = ctx->saved_data["dh" + std::to_string(j)].toTensor();
      out.push_back(ctx->needs_input_grad(j) ? dh * g.to(dh.scalar_type()) : at::Tensor());
    }
    if (ctx->needs_input_grad(num_steps)) {
      const at::Tensor lm_acc = ctx->saved_data["lm_acc"].toTensor();
      ctx->saved_data["lm_head_grad"].toTensor().add_(lm_acc * g.to(lm_acc.scalar_type()));
      ctx->saved_data["norm_grad"].toTensor().add_(ctx->saved_data["norm_acc"].toTensor() * g);
    }
    out.push_back(at::Tensor());  // anchor
    out.push_back(at::Tensor());  // the call (not a tensor)
    return out;
  }

 private:
  // Copies a chunk's rows of `values` into the steps' [T, ...] tensors.
  static void KeepRows(const std::vector<Segment>& chunk, const std::vector<HeadStepRows>& steps,
                       const at::Tensor& values, std::vector<at::Tensor>* into) {
    int64_t offset = 0;
    for (const Segment& seg : chunk) {
      at::Tensor& dst = (*into)[seg.step];
      const at::Tensor v = values.narrow(0, offset, seg.length);
      dst.index_copy_(0, steps[seg.step].rows.narrow(0, seg.begin, seg.length),
                      dst.dim() == 1 ? v.squeeze(1) : v);
      offset += seg.length;
    }
  }
  static void ScatterRows(const std::vector<Segment>& chunk, const std::vector<HeadStepRows>& steps,
                          const at::Tensor& dx, std::vector<at::Tensor>* dh) {
    int64_t offset = 0;
    for (const Segment& seg : chunk) {
      (*dh)[seg.step].index_copy_(0, steps[seg.step].rows.narrow(0, seg.begin, seg.length),
                                  dx.narrow(0, offset, seg.length));
      offset += seg.length;
    }
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> SoftCrossEntropyInPlace(at::Tensor& logits,
                                                          const TargetDistribution& target,
                                                          const at::Tensor& target_rows,
                                                          const at::Tensor& row_weight,
                                                          const at::Tensor& row_grad_scale) {
#ifdef E3_HAS_CUDA
  const int64_t rows = logits.size(0), cols = logits.size(1);
  student_kernels::Dtype dt;
  if (StudentKernelDtype(logits, &dt) && logits.is_contiguous() &&
      target.logits.scalar_type() == at::kFloat && target.logits.is_contiguous() &&
      row_weight.scalar_type() == at::kFloat && row_grad_scale.scalar_type() == at::kFloat) {
    at::Tensor loss = at::empty({rows}, row_weight.options());
    at::Tensor argmax = at::empty({rows}, target_rows.options());
    const at::Tensor w = row_weight.contiguous(), s = row_grad_scale.contiguous(),
                     tr = target_rows.contiguous();
    if (student_kernels::SoftCrossEntropy(
            dt, logits.data_ptr(), rows, cols, target.logits.data_ptr<float>(),
            target.lse.data_ptr<float>(), tr.data_ptr<int64_t>(), w.data_ptr<float>(),
            s.data_ptr<float>(), loss.data_ptr<float>(), argmax.data_ptr<int64_t>(),
            StudentKernelStream(logits))) {
      CheckStudentKernelLaunch("SoftCrossEntropy");
      return {loss, argmax};
    }
  }
#endif
  const at::ScalarType f = target.logits.scalar_type();
  const at::Tensor z = logits.to(f);
  const at::Tensor log_q = z - at::logsumexp(z, -1, /*keepdim=*/true);
  const at::Tensor p = (target.logits.index_select(0, target_rows) -
                        target.lse.index_select(0, target_rows).unsqueeze(1))
                           .exp();
  const at::Tensor w = row_weight.to(f).unsqueeze(1);
  const at::Tensor loss = -(p * log_q).sum(-1) * w.squeeze(1);
  const at::Tensor argmax = z.argmax(-1);
  const at::Tensor grad =
      (row_grad_scale.to(f).unsqueeze(1) * w) * (log_q.exp() * p.sum(-1, true) - p);
  logits.copy_(grad);
  return {loss, argmax};
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
