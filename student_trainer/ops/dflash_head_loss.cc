#include "student_trainer/ops/dflash_head_loss.h"

#include <algorithm>
#include <cmath>

namespace e3::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Passed beside the tensors: autograd's inputs must be defined tensors,
// and target_hidden is optional (it takes no gradient either way).
struct LossCall {
  const DFlashHeadLossOptions* options;
  const at::Tensor* target_hidden;
  DFlashHeadLossOutput* out;
};

// What the row passes share: the inputs, the compute dtype and, for
// distillation, the head in it (the target's logits are taken there).
struct LossInputs {
  at::Tensor hidden, head, labels, target_hidden, head_f;
  at::ScalarType f = at::kFloat;
  int64_t chunk_rows = 2048;
};

// Drafted rows that carry a loss: a label, and not the block's anchor.
at::Tensor SupervisedRows(const at::Tensor& labels, int64_t block_size) {
  const at::Tensor k = torch::arange(labels.size(0), labels.options()).remainder(block_size);
  return labels.ge(0).logical_and(k.gt(0));
}

// One pass over the row chunks: each row's loss, its hit and the
// gradient of its own loss with respect to its state (into `dh`).
void RowPass(const LossInputs& in, at::Tensor* row_loss, at::Tensor* hits, at::Tensor* dh) {
  const int64_t rows = in.hidden.size(0);
  for (int64_t begin = 0; begin < rows; begin += in.chunk_rows) {
    const int64_t n = std::min(in.chunk_rows, rows - begin);
    const at::Tensor logits = at::matmul(in.hidden.narrow(0, begin, n), in.head.t()).to(in.f);
    const at::Tensor lse = at::logsumexp(logits, -1);
    const at::Tensor labels = in.labels.narrow(0, begin, n);
    const at::Tensor label_col = labels.clamp_min(0).unsqueeze(1);
    at::Tensor target;  // the target's distribution [n, V] (distillation), else undefined
    if (in.target_hidden.defined()) {
      target = at::softmax(at::matmul(in.target_hidden.narrow(0, begin, n).to(in.f), in.head_f.t()), -1);
      row_loss->narrow(0, begin, n).copy_(lse - (target * logits).sum(-1));
    } else {
      row_loss->narrow(0, begin, n).copy_(lse - logits.gather(1, label_col).squeeze(1));
    }
    hits->narrow(0, begin, n).copy_(logits.argmax(-1).eq(labels));
    at::Tensor grad = at::exp(logits - lse.unsqueeze(1));
    if (target.defined()) {
      grad.sub_(target);
    } else {
      grad.scatter_add_(1, label_col, at::full({n, 1}, -1.0, grad.options()));
    }
    dh->narrow(0, begin, n).copy_(at::matmul(grad.to(in.hidden.scalar_type()), in.head));
  }
}

// The rows' weights in the loss (no gradient flows through them).
at::Tensor DecayWeights(const at::Tensor& supervised, const DFlashHeadLossOptions& o, at::ScalarType f) {
  const at::Tensor k = torch::arange(supervised.size(0), supervised.options().dtype(at::kLong)).remainder(o.block_size);
  const at::Tensor w = at::exp(-(k - 1).clamp_min(0).to(f) / o.gamma) * supervised.to(f);
  return w / w.sum().clamp_min(1e-12);
}

at::Tensor DPaceWeights(const at::Tensor& row_loss, const at::Tensor& supervised, const DFlashHeadLossOptions& o) {
  const int64_t blocks = row_loss.size(0) / o.block_size;
  const at::Tensor sup = supervised.view({blocks, o.block_size});
  const at::Tensor mask = sup.to(row_loss.scalar_type());
  const at::Tensor smooth = at::where(sup, (1.0 - o.alpha) * at::exp(-row_loss.view({blocks, o.block_size})) + o.alpha,
                                      at::ones({}, row_loss.options()));
  const at::Tensor reach = at::cumprod(smooth, 1) * mask;
  const at::Tensor w = reach.flip({1}).cumsum(1).flip({1}) * mask;
  return w.reshape({-1}) / static_cast<double>(std::max<int64_t>(blocks, 1));
}

at::Tensor RowWeights(const at::Tensor& row_loss, const at::Tensor& supervised, const DFlashHeadLossOptions& o) {
  return o.weighting == DFlashWeighting::kDecay ? DecayWeights(supervised, o, row_loss.scalar_type())
                                                : DPaceWeights(row_loss, supervised, o);
}

class DFlashHeadLossFunction : public torch::autograd::Function<DFlashHeadLossFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& head,
                            const at::Tensor& labels, LossCall call) {
    const DFlashHeadLossOptions& o = *call.options;
    const at::Tensor& target_hidden = *call.target_hidden;
    LossInputs in{hidden, head, labels.to(hidden.device(), at::kLong), target_hidden};
    in.f = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    in.chunk_rows = std::max<int64_t>(1, o.chunk_rows);
    if (target_hidden.defined()) in.head_f = head.to(in.f);
    // Only the supervised rows reach the head: the anchors and the rows
    // without a label carry no loss. Each row's gradient is taken for its
    // own loss and scaled by its weight afterwards, so that D-PACE, whose
    // weights need every row's loss first, costs one pass too.
    const at::Tensor supervised = SupervisedRows(in.labels, o.block_size);
    const at::Tensor picked = supervised.nonzero().squeeze(1);
    const int64_t rows = hidden.size(0), n = picked.size(0);
    LossInputs sub = in;
    sub.hidden = hidden.index_select(0, picked);
    sub.labels = in.labels.index_select(0, picked);
    if (target_hidden.defined()) sub.target_hidden = target_hidden.index_select(0, picked);
    at::Tensor loss_s = at::empty({n}, hidden.options().dtype(in.f));
    at::Tensor hits_s = at::empty({n}, hidden.options().dtype(at::kBool));
    at::Tensor dh_s = at::empty({n, hidden.size(1)}, hidden.options());
    RowPass(sub, &loss_s, &hits_s, &dh_s);
    const at::Tensor row_loss = at::zeros({rows}, loss_s.options()).index_copy_(0, picked, loss_s);
    const at::Tensor hits = at::zeros({rows}, hits_s.options()).index_copy_(0, picked, hits_s);
    const at::Tensor weight = RowWeights(row_loss, supervised, o);
    dh_s.mul_(weight.index_select(0, picked).unsqueeze(1).to(dh_s.scalar_type()));
    const at::Tensor dh = at::zeros_like(hidden).index_copy_(0, picked, dh_s);
    call.out->row_loss = row_loss;
    call.out->hits = hits;
    ctx->saved_data["dh"] = dh;
    return (row_loss * weight).sum();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor dh = ctx->saved_data["dh"].toTensor();
    ctx->saved_data.erase("dh");
    return {dh.mul_(grads[0].to(dh.scalar_type())), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor DFlashRowWeights(const at::Tensor& row_loss, const at::Tensor& labels, const DFlashHeadLossOptions& options) {
  torch::NoGradGuard no_grad;
  return RowWeights(row_loss.detach(), SupervisedRows(labels.to(row_loss.device(), at::kLong), options.block_size),
                    options);
}

DFlashHeadLossOutput DFlashHeadLoss(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& labels,
                                    const at::Tensor& target_hidden, const DFlashHeadLossOptions& options) {
  TORCH_CHECK(hidden.dim() == 2 && head.dim() == 2 && hidden.size(1) == head.size(1),
              "DFlashHeadLoss: hidden [R, H] and head [V, H] expected");
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == hidden.size(0) && hidden.size(0) % options.block_size == 0,
              "DFlashHeadLoss: one label per row, whole blocks of ", options.block_size, " rows");
  TORCH_CHECK(!target_hidden.defined() || target_hidden.sizes() == hidden.sizes(),
              "DFlashHeadLoss: target_hidden must be [R, H] like hidden");
  DFlashHeadLossOutput out;
  out.loss = DFlashHeadLossFunction::apply(hidden, head.detach(), labels, LossCall{&options, &target_hidden, &out});
  return out;
}

}  // namespace e3::ops
