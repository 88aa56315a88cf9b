#include "student_trainer/ops/lk_factors.h"

#include "student_trainer/ops/rms_norm.h"

namespace e3::ops {

at::Tensor AcceptanceSums(const std::vector<Chunk>& chunks, const std::vector<at::Tensor>& hiddens,
                          const LkInputs& in, const at::TensorOptions& fopts, const StepRowConstants& constants) {
  const auto& steps = *in.steps;
  const auto& wts = *in.weights;
  at::Tensor sums = at::zeros({static_cast<int64_t>(steps.size())}, fopts);
  AcceptanceRows only_alpha;
  only_alpha.write_grad = false;
  for (const Chunk& chunk : chunks) {
    const ChunkRows c = Gather(chunk.segments, hiddens, steps, constants);
    const at::Tensor x = wts.norm.defined() ? RmsNormForward(c.x, wts.norm, wts.eps).y : c.x;
    at::Tensor logits = at::mm(x, wts.lm_head.t());
    const SoftCrossEntropyResult r = SoftCrossEntropyInPlace(
        logits, *in.target, c.target_rows, c.row_weight, c.grad_scale, &only_alpha, chunk.RowRuns());
    sums.index_add_(0, c.step_of_row, r.alpha.to(sums.scalar_type()) * c.row_weight.to(sums.scalar_type()));
  }
  return sums;
}

StepFactors LkFactors(const std::vector<Chunk>& chunks, const std::vector<at::Tensor>& hiddens,
                      const LkInputs& in, const at::TensorOptions& fopts, const at::Tensor& acc_norm,
                      const StepRowConstants& constants) {
  const auto& opt = *in.options;
  const int64_t num_steps = static_cast<int64_t>(in.steps->size());
  StepFactors f;
  if (opt.loss == HeadLossKind::kLkAlpha) {
    f.ce = at::zeros({num_steps}, fopts);
    f.acc = at::full({num_steps}, -1.0, fopts);
    return f;
  }
  const at::Tensor abar = AcceptanceSums(chunks, hiddens, in, fopts, constants) * acc_norm;
  f.kl_weight = opt.kl_scale * at::exp(-opt.kl_decay * abar);
  f.ce = f.kl_weight;
  f.acc = f.kl_weight - 1.0;  // d(1 - abar_j) = -d abar_j, weighted 1 - w_j
  return f;
}

}  // namespace e3::ops
