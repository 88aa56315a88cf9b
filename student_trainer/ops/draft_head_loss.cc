#include "student_trainer/ops/draft_head_loss.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>

#include "student_trainer/kernels/student_kernels.h"
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

// One chunk of the head's rows: runs of steps' rows, concatenated.
struct Chunk {
  std::vector<Segment> segments;
  // One segment per step, from the same row index of range steps (so their
  // i-th rows read target rows t + j + 1, neighbours): the soft CE visits
  // them interleaved.
  bool interleaved = false;
  std::vector<int64_t> RowRuns() const {
    std::vector<int64_t> runs;
    if (interleaved) {
      for (const Segment& s : segments) runs.push_back(s.length);
    }
    return runs;
  }
};

// The steps to interleave, where every step with rows is a range step and
// at least two of them fit a chunk together; else none.
std::vector<int64_t> InterleavedSteps(const std::vector<HeadStepRows>& steps, int64_t chunk_rows) {
  std::vector<int64_t> runs;
  for (int64_t j = 0; j < static_cast<int64_t>(steps.size()); ++j) {
    if (steps[j].rows.numel() == 0) continue;
    if (steps[j].first_row < 0) return {};
    runs.push_back(j);
  }
  const auto k = static_cast<int64_t>(runs.size());
  return k >= 2 && k <= chunk_rows && k <= student_kernels::kMaxRowRuns ? runs : std::vector<int64_t>{};
}

// Splits the steps' rows into chunks of about `chunk_rows` rows.
// Range steps (long single samples, every position trained) go in
// interleaved chunks: each chunk the same row indices of every step, so
// the steps' soft CE rows that read one target row run together and read
// it from memory once (the target, fp32, has twice the logits' bytes).
// Their rows are gathered into the chunk and their gradient scattered
// back. Other batches: a range step's rows get chunks of their own, of
// near-equal size, so that each chunk is a view of the step's hidden
// states and its gradient is written in place; other steps share chunks
// (a step may span chunks, a chunk several steps).
std::vector<Chunk> Chunks(const std::vector<HeadStepRows>& steps, int64_t chunk_rows) {
  std::vector<Chunk> chunks;
  const std::vector<int64_t> runs = InterleavedSteps(steps, chunk_rows);
  if (!runs.empty()) {
    // Each chunk takes up to ceil(longest / pieces) rows of every step: at
    // most chunk_rows + k rows (the steps of a long sample differ by a row).
    int64_t longest = 0;
    for (int64_t j : runs) longest = std::max(longest, steps[j].rows.numel());
    const auto k = static_cast<int64_t>(runs.size());
    const int64_t pieces = (k * longest + chunk_rows - 1) / chunk_rows;
    for (int64_t p = 0; p < pieces; ++p) {
      Chunk c{{}, true};
      for (int64_t j : runs) {
        const int64_t n = steps[j].rows.numel();
        const int64_t begin = std::min(n, longest * p / pieces), end = std::min(n, longest * (p + 1) / pieces);
        c.segments.push_back({j, begin, end - begin});
      }
      chunks.push_back(std::move(c));
    }
    return chunks;
  }
  int64_t filled = chunk_rows;  // the last chunk is closed
  for (int64_t j = 0; j < static_cast<int64_t>(steps.size()); ++j) {
    const int64_t n = steps[j].rows.numel();
    if (n > 0 && steps[j].first_row >= 0) {
      const int64_t pieces = (n + chunk_rows - 1) / chunk_rows;
      for (int64_t p = 0, begin = 0; p < pieces; ++p) {
        const int64_t end = n * (p + 1) / pieces;
        chunks.push_back({{{j, begin, end - begin}}});
        begin = end;
      }
      filled = chunk_rows;
      continue;
    }
    for (int64_t begin = 0; begin < n;) {
      if (filled == chunk_rows) {
        chunks.emplace_back();
        filled = 0;
      }
      const int64_t take = std::min(n - begin, chunk_rows - filled);
      chunks.back().segments.push_back({j, begin, take});
      begin += take;
      filled += take;
    }
  }
  return chunks;
}

// The gradient buffer of a step's hidden states: zeros, except that a step
// whose rows are a range leaves those rows unset (every chunk writes them).
at::Tensor StepGradient(const at::Tensor& h, const HeadStepRows& st) {
  if (st.first_row < 0) return at::zeros_like(h);
  at::Tensor g = at::empty(h.sizes(), h.options());
  const int64_t end = st.first_row + st.rows.numel();
  if (st.first_row > 0) g.narrow(0, 0, st.first_row).zero_();
  if (end < h.size(0)) g.narrow(0, end, h.size(0) - end).zero_();
  return g;
}

// A chunk's rows of its step's gradient buffer as a view, where the chunk
// is one segment of a range step; else undefined.
at::Tensor ChunkGradientView(const std::vector<Segment>& chunk,
                             const std::vector<HeadStepRows>& steps,
                             const std::vector<at::Tensor>& dh) {
  if (chunk.size() != 1 || steps[chunk[0].step].first_row < 0) return {};
  const Segment& seg = chunk[0];
  return dh[seg.step].narrow(0, steps[seg.step].first_row + seg.begin, seg.length);
}

// x *= g in place, g the loss's 0-dim output gradient: on the GPU a kernel
// reads g where it lies (ATen's broadcast of a 0-dim CUDA tensor takes its
// slow unvectorised path), else ATen.
void ScaleInPlace(at::Tensor& x, const at::Tensor& g) {
#ifdef E3_HAS_CUDA
  student_kernels::Dtype dt;
  if (StudentKernelDtype(x, &dt) && x.is_contiguous() && g.numel() == 1 &&
      g.scalar_type() == at::kFloat && g.device() == x.device()) {
    const at::Tensor gc = g.contiguous();
    if (student_kernels::ScaleByDeviceScalar(dt, x.data_ptr(), x.numel(), gc.data_ptr<float>(),
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
  student_kernels::Dtype dt;
  if (StudentKernelDtype(y, &dt) && x.scalar_type() == y.scalar_type() && x.sizes() == y.sizes() &&
      x.is_contiguous() && y.is_contiguous() && g.numel() == 1 && g.scalar_type() == at::kFloat &&
      g.device() == y.device()) {
    const at::Tensor gc = g.contiguous();
    if (student_kernels::AddScaledByDeviceScalar(dt, y.data_ptr(), x.data_ptr(), y.numel(),
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

// One chunk's rows gathered from the steps' tensors, with their per-row
// data: grad_scale = step_weight / T (the soft CE's), acc_scale =
// step_weight / trained positions (the LK losses' acceptance terms).
struct ChunkRows {
  at::Tensor x, target_rows, row_weight, grad_scale, acc_scale, step_of_row;
};

// The LK losses' normaliser of a step: SpecForge's masked mean clamps the
// count at 1e-8.
double AcceptanceNorm(const HeadStepRows& step) {
  return 1.0 / std::max(static_cast<double>(step.trained_positions), 1e-8);
}

// A segment's rows of a step's [T, ...] tensor: a view where they are a
// range, else gathered.
at::Tensor SegmentRows(const at::Tensor& values, const HeadStepRows& st, const Segment& seg) {
  if (st.first_row >= 0) return values.narrow(0, st.first_row + seg.begin, seg.length);
  return values.index_select(0, st.rows.narrow(0, seg.begin, seg.length));
}

// Concatenates; one tensor stays as it is (a view, when its rows were).
at::Tensor CatRows(const std::vector<at::Tensor>& parts) { return parts.size() == 1 ? parts[0] : at::cat(parts, 0); }

// Each step's per-row constants over all its rows, made once per call (a
// chunk takes views of them, or one concatenation where it spans steps).
struct StepRowConstants {
  std::vector<at::Tensor> grad_scale, acc_scale, step;
};

StepRowConstants RowConstants(const std::vector<HeadStepRows>& steps, int64_t tokens) {
  StepRowConstants k;
  for (int64_t j = 0; j < static_cast<int64_t>(steps.size()); ++j) {
    const HeadStepRows& st = steps[j];
    const int64_t n = st.rows.numel();
    k.grad_scale.push_back(at::full({n}, st.step_weight / static_cast<double>(tokens), st.row_weight.options()));
    k.acc_scale.push_back(at::full({n}, st.step_weight * AcceptanceNorm(st), st.row_weight.options()));
    k.step.push_back(at::full({n}, j, st.target_rows.options()));
  }
  return k;
}

ChunkRows Gather(const std::vector<Segment>& chunk, const std::vector<at::Tensor>& hiddens,
                 const std::vector<HeadStepRows>& steps, const StepRowConstants& k) {
  std::vector<at::Tensor> x, tr, w, s, a, j;
  for (const Segment& seg : chunk) {
    const HeadStepRows& st = steps[seg.step];
    x.push_back(SegmentRows(hiddens[seg.step], st, seg));
    tr.push_back(st.target_rows.narrow(0, seg.begin, seg.length));
    w.push_back(st.row_weight.narrow(0, seg.begin, seg.length));
    s.push_back(k.grad_scale[seg.step].narrow(0, seg.begin, seg.length));
    a.push_back(k.acc_scale[seg.step].narrow(0, seg.begin, seg.length));
    j.push_back(k.step[seg.step].narrow(0, seg.begin, seg.length));
  }
  return {CatRows(x), CatRows(tr), CatRows(w), CatRows(s), CatRows(a), CatRows(j)};
}

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

// Per step, on the device: the factors of the soft CE's and the
// acceptance terms' gradients, and kLkLambda's weight w_j.
struct StepFactors {
  at::Tensor ce, acc, kl_weight;  // [L]
};

// sum over each step's trained rows of alpha_t, from the draft's logits
// as they are before any update: kLkLambda's weights need abar_j before
// the gradient pass (one more forward of the head, no gradient written).
at::Tensor AcceptanceSums(const std::vector<Chunk>& chunks,
                          const std::vector<at::Tensor>& hiddens, const HeadCall& call,
                          const at::TensorOptions& fopts, const StepRowConstants& constants) {
  const auto& steps = *call.steps;
  const auto& wts = *call.weights;
  at::Tensor sums = at::zeros({static_cast<int64_t>(steps.size())}, fopts);
  AcceptanceRows only_alpha;
  only_alpha.write_grad = false;
  for (const Chunk& chunk : chunks) {
    const ChunkRows c = Gather(chunk.segments, hiddens, steps, constants);
    at::Tensor logits = at::mm(RmsNormForward(c.x, wts.norm, wts.eps).y, wts.lm_head.t());
    const SoftCrossEntropyResult r = SoftCrossEntropyInPlace(
        logits, *call.target, c.target_rows, c.row_weight, c.grad_scale, &only_alpha, chunk.RowRuns());
    sums.index_add_(0, c.step_of_row, r.alpha.to(sums.scalar_type()) * c.row_weight.to(sums.scalar_type()));
  }
  return sums;
}

StepFactors LkFactors(const std::vector<Chunk>& chunks,
                      const std::vector<at::Tensor>& hiddens, const HeadCall& call,
                      const at::TensorOptions& fopts, const at::Tensor& acc_norm,
                      const StepRowConstants& constants) {
  const auto& opt = *call.options;
  const int64_t num_steps = static_cast<int64_t>(call.steps->size());
  StepFactors f;
  if (opt.loss == HeadLossKind::kLkAlpha) {
    f.ce = at::zeros({num_steps}, fopts);
    f.acc = at::full({num_steps}, -1.0, fopts);
    return f;
  }
  const at::Tensor abar = AcceptanceSums(chunks, hiddens, call, fopts, constants) * acc_norm;
  f.kl_weight = opt.kl_scale * at::exp(-opt.kl_decay * abar);
  f.ce = f.kl_weight;
  f.acc = f.kl_weight - 1.0;  // d(1 - abar_j) = -d abar_j, weighted 1 - w_j
  return f;
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
    if (lk) factors = LkFactors(chunks, hiddens, call, fopts, acc_norm, constants);
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
      RmsNormResult nr = RmsNormForward(c.x, wts.norm, wts.eps);
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
    ctx->saved_data["norm_acc"] = norm_acc.defined() ? norm_acc : at::zeros_like(wts.norm, fopts);
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
      ctx->saved_data["norm_grad"].toTensor().add_(ctx->saved_data["norm_acc"].toTensor() * g);
    }
    out.push_back(at::Tensor());  // anchor
    out.push_back(at::Tensor());  // the call (not a tensor)
    return out;
  }

 private:
  // Writes v into a segment's rows of dst (the inverse of SegmentRows).
  static void PutRows(at::Tensor& dst, const HeadStepRows& st, const Segment& seg, const at::Tensor& v) {
    if (st.first_row >= 0) {
      dst.narrow(0, st.first_row + seg.begin, seg.length).copy_(v);
    } else {
      dst.index_copy_(0, st.rows.narrow(0, seg.begin, seg.length), v);
    }
  }
  // Copies a chunk's rows of `values` into the steps' [T, ...] tensors.
  static void KeepRows(const std::vector<Segment>& chunk, const std::vector<HeadStepRows>& steps,
                       const at::Tensor& values, std::vector<at::Tensor>* into) {
    int64_t offset = 0;
    for (const Segment& seg : chunk) {
      at::Tensor& dst = (*into)[seg.step];
      const at::Tensor v = values.narrow(0, offset, seg.length);
      PutRows(dst, steps[seg.step], seg, dst.dim() == 1 ? v.squeeze(1) : v);
      offset += seg.length;
    }
  }
  static void ScatterRows(const std::vector<Segment>& chunk, const std::vector<HeadStepRows>& steps,
                          const at::Tensor& dx, std::vector<at::Tensor>* dh) {
    int64_t offset = 0;
    for (const Segment& seg : chunk) {
      PutRows((*dh)[seg.step], steps[seg.step], seg, dx.narrow(0, offset, seg.length));
      offset += seg.length;
    }
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
  student_kernels::Dtype dt;
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
  student_kernels::RowRuns runs;
  if (row_runs.size() <= static_cast<size_t>(student_kernels::kMaxRowRuns)) {  // else rows in order
    runs.count = static_cast<int>(row_runs.size());
    std::copy(row_runs.begin(), row_runs.end(), runs.length);
  }
  student_kernels::AcceptanceArgs args;
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
  if (!student_kernels::SoftCrossEntropy(
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
  if (!student_kernels::RowLogSumExpArgmax(x.data_ptr<float>(), x.size(0), x.size(1), t.lse.data_ptr<float>(),
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
