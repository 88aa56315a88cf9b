#include "student_trainer/ttt_fast.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <ATen/record_function.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "student_trainer/ops/draft_head_loss.h"
#include "student_trainer/ops/linear.h"
#include "student_trainer/ops/rms_norm.h"
#include "student_trainer/ops/silu_mul.h"
#include "student_trainer/ops/step_rows.h"
#include "student_trainer/ops/ttt_attention.h"
#include "student_trainer/ttt_batch.h"

namespace e3 {
namespace {

constexpr char kQ[] = "midlayer.self_attn.q_proj.weight";
constexpr char kK[] = "midlayer.self_attn.k_proj.weight";
constexpr char kV[] = "midlayer.self_attn.v_proj.weight";
constexpr char kO[] = "midlayer.self_attn.o_proj.weight";
constexpr char kGate[] = "midlayer.mlp.gate_proj.weight";
constexpr char kUp[] = "midlayer.mlp.up_proj.weight";
constexpr char kDown[] = "midlayer.mlp.down_proj.weight";

// A weight of the flat parameters and its gradient, as the ops take them.
struct WeightPair {
  at::Tensor w, grad;
};

// The draft's weights as the fast step reads them: fused q/k/v rows split
// into the embedding half and the hidden half of their input, fused
// gate/up rows.
struct FastWeights {
  WeightPair fc, qkv_embed, qkv_hidden, o, gate_up, down;
  WeightPair input_norm, hidden_norm, post_norm, norm, lm_head;
  at::Tensor anchor;
};

absl::StatusOr<FastWeights> GetWeights(Eagle3DraftImpl& draft) {
  const FlatParameters& f = draft.flat();
  const int64_t h = draft.config().hidden_size;
  auto pair = [&](const char* name) { return WeightPair{f.View(name), f.GradView(name)}; };
  FastWeights w;
  w.fc = pair("fc.weight");
  E3_ASSIGN_OR_RETURN(at::Tensor qkv, f.Rows({kQ, kK, kV}));
  E3_ASSIGN_OR_RETURN(at::Tensor qkv_grad, f.GradRows({kQ, kK, kV}));
  // q/k/v read concat(input_layernorm(embed), hidden_norm(h)): the first H
  // input columns take the embedding.
  w.qkv_embed = {qkv.narrow(1, 0, h), qkv_grad.narrow(1, 0, h)};
  w.qkv_hidden = {qkv.narrow(1, h, h), qkv_grad.narrow(1, h, h)};
  w.o = pair(kO);
  E3_ASSIGN_OR_RETURN(w.gate_up.w, f.Rows({kGate, kUp}));
  E3_ASSIGN_OR_RETURN(w.gate_up.grad, f.GradRows({kGate, kUp}));
  w.down = pair(kDown);
  w.input_norm = pair("midlayer.input_layernorm.weight");
  w.hidden_norm = pair("midlayer.hidden_norm.weight");
  w.post_norm = pair("midlayer.post_attention_layernorm.weight");
  w.norm = pair("norm.weight");
  w.lm_head = pair("lm_head.weight");
  w.anchor = f.anchor();
  return w;
}

at::Tensor HostLong(const at::Tensor& t) { return t.to(at::kCPU, at::kLong).contiguous(); }

// Everything the step needs about the batch's positions, computed on the
// host, then uploaded in one copy.
struct Plan {
  int64_t tokens = 0, length = 0, pad_rows = 0;
  std::vector<int64_t> cu;
  // int64 upload: [T + pad_rows] ids (the padding rows hold id 0); per
  // step the row of the once-normalised embeddings each midlayer row reads
  // (distinct within a step: a sample's positions past its end read
  // padding rows of their own); [T]
  // positions; per step the head rows (indices into the step's midlayer
  // rows) and their target rows; per compacted step its midlayer rows'
  // positions and their indices among the previous step's rows; per step
  // its loss and position token counts; cu_seqlens.
  std::vector<int64_t> longs;
  std::vector<double> row_weights;  // per step, one per head row
  std::vector<int64_t> head_rows;   // per step: how many
  std::vector<int64_t> mid_rows;    // per step: how many rows its midlayer runs over
  std::vector<int64_t> loss_tokens, position_tokens;
  bool compacted(int64_t step) const { return mid_rows[step] < tokens; }
};

// The positions each step's midlayer runs over. Step 0 runs over all of
// them: its keys form every later query's causal block. A row at step j >= 1
// feeds only its own row at later steps, so from step 1 on a position no
// step from j on trains can be left out, once that leaves out enough rows
// to pay for the gathers (the rows then shrink step by step, each step's a
// subset of the previous one's). A step never runs empty: one that trains
// nothing keeps the previous step's first row.
std::vector<std::vector<int64_t>> MidlayerRows(const std::vector<std::vector<char>>& trained,
                                               int64_t tokens, bool skip) {
  constexpr double kMaxKeptFraction = 0.95;
  const int64_t steps = static_cast<int64_t>(trained.size());
  std::vector<std::vector<char>> later(steps);  // some step >= j trains t
  std::vector<char> any(tokens, 0);
  for (int64_t j = steps - 1; j >= 0; --j) {
    for (int64_t t = 0; t < tokens; ++t) any[t] = any[t] || trained[j][t];
    later[j] = any;
  }
  std::vector<std::vector<int64_t>> rows(steps);
  bool compact = false;
  for (int64_t j = 0; j < steps; ++j) {
    const int64_t kept = std::count(later[j].begin(), later[j].end(), 1);
    compact = compact || (skip && j > 0 && kept <= kMaxKeptFraction * tokens);
    for (int64_t t = 0; t < tokens; ++t) {
      if (!compact || later[j][t]) rows[j].push_back(t);
    }
    if (rows[j].empty()) rows[j].push_back(rows[j - 1].front());
  }
  return rows;
}

// For each of `rows`, its index in `among` (a superset, sorted).
std::vector<int64_t> IndicesAmong(const std::vector<int64_t>& rows, const std::vector<int64_t>& among,
                                  int64_t tokens) {
  std::vector<int64_t> index_of(tokens, -1);
  for (size_t i = 0; i < among.size(); ++i) index_of[among[i]] = static_cast<int64_t>(i);
  std::vector<int64_t> out;
  out.reserve(rows.size());
  for (int64_t t : rows) out.push_back(index_of[t]);
  return out;
}

// What the plan reads of the batch, on the host.
struct HostBatch {
  at::Tensor ids, top, mask;  // int64 [T], int64 [T], bool [T]
};

// Copies them from the device first, so that the GPU can run the work that
// needs no plan (the target distribution, fc) while the host plans.
absl::StatusOr<HostBatch> DownloadPlanInputs(const Eagle3DraftImpl& draft, const TttBatch& batch) {
  HostBatch h;
  h.ids = HostLong(batch.input_ids);
  h.top = HostLong(batch.target_argmax);
  h.mask = (batch.loss_mask.to(at::kCPU) != 0).contiguous();
  E3_RETURN_IF_ERROR(CheckIdRange("input_ids", h.ids, draft.config().vocab_size));
  E3_RETURN_IF_ERROR(CheckIdRange("target_argmax", h.top, draft.config().vocab_size));
  return h;
}

Plan MakePlan(const Eagle3DraftImpl& draft, const HostBatch& batch, std::vector<int64_t> cu,
              const TttOptions& options) {
  RECORD_USER_SCOPE("e3::ttt_fast::MakePlan");  // for the profiler: host work the GPU waits for
  Plan p;
  p.tokens = cu.back();
  p.length = options.length;
  p.cu = std::move(cu);
  const int64_t T = p.tokens, L = p.length;
  p.pad_rows = static_cast<int64_t>(p.cu.size() - 1) * L;
  const int64_t* id = batch.ids.data_ptr<int64_t>();
  const int64_t* am = batch.top.data_ptr<int64_t>();
  const bool* lm = batch.mask.data_ptr<bool>();
  const std::vector<uint8_t>& t2d = draft.t2d_host();

  std::vector<int64_t> end(T), start(T), sample(T);
  for (size_t s = 0; s + 1 < p.cu.size(); ++s) {
    for (int64_t t = p.cu[s]; t < p.cu[s + 1]; ++t) {
      start[t] = p.cu[s];
      end[t] = p.cu[s + 1];
      sample[t] = static_cast<int64_t>(s);
    }
  }
  // Step 0's masks: a sample's last position has no next token, and a
  // position trains only where the target's next token is in the draft vocab.
  std::vector<char> loss0(T), pos0(T);
  for (int64_t t = 0; t < T; ++t) {
    loss0[t] = lm[t] && t + 1 < end[t];
    pos0[t] = loss0[t] && t2d[static_cast<size_t>(am[t + 1 < T ? t + 1 : t])] != 0;
  }
  auto shifted = [&](const std::vector<char>& m, int64_t t, int64_t k) {
    return t + k < end[t] && m[t + k];
  };

  std::vector<std::vector<char>> trained(L, std::vector<char>(T));
  for (int64_t j = 0; j < L; ++j) {
    for (int64_t t = 0; t < T; ++t) trained[j][t] = shifted(pos0, t, j);
  }
  const bool all_rows = options.keep_logits || options.keep_token_losses;
  const std::vector<std::vector<int64_t>> mid =
      MidlayerRows(trained, T, options.skip_untrained_rows && !all_rows);

  p.longs.insert(p.longs.end(), id, id + T);
  p.longs.insert(p.longs.end(), p.pad_rows, 0);
  // Step j's row t reads position t + j + 1's embedding; past the sample's
  // end, padding row (sample, overshoot): distinct rows, so the steps'
  // gradient sum needs no atomics (ops/step_rows.h).
  for (int64_t j = 0; j < L; ++j) {
    p.mid_rows.push_back(static_cast<int64_t>(mid[j].size()));
    for (int64_t t : mid[j]) {
      const int64_t next = t + j + 1;
      p.longs.push_back(next < end[t] ? next : T + sample[t] * L + (next - end[t]));
    }
  }
  for (int64_t t = 0; t < T; ++t) p.longs.push_back(t - start[t]);
  for (int64_t j = 0; j < L; ++j) {
    std::vector<int64_t> rows, targets;
    int64_t loss_tokens = 0, position_tokens = 0;
    for (int64_t t = 0; t < T; ++t) {
      loss_tokens += shifted(loss0, t, j);
      position_tokens += trained[j][t];
      if (!trained[j][t] && !all_rows) continue;
      rows.push_back(t);
      targets.push_back(t + j + 1 < end[t] ? t + j + 1 : t);
      p.row_weights.push_back(trained[j][t] ? 1.0 : 0.0);
    }
    if (p.compacted(j)) rows = IndicesAmong(rows, mid[j], T);
    p.head_rows.push_back(static_cast<int64_t>(rows.size()));
    p.longs.insert(p.longs.end(), rows.begin(), rows.end());
    p.longs.insert(p.longs.end(), targets.begin(), targets.end());
    p.loss_tokens.push_back(loss_tokens);
    p.position_tokens.push_back(position_tokens);
  }
  for (int64_t j = 1; j < L; ++j) {
    if (!p.compacted(j)) continue;
    const std::vector<int64_t> from_prev = IndicesAmong(mid[j], mid[j - 1], T);
    p.longs.insert(p.longs.end(), mid[j].begin(), mid[j].end());
    p.longs.insert(p.longs.end(), from_prev.begin(), from_prev.end());
  }
  for (int64_t j = 0; j < L; ++j) {
    p.longs.push_back(p.loss_tokens[j]);
    p.longs.push_back(p.position_tokens[j]);
  }
  p.longs.insert(p.longs.end(), p.cu.begin(), p.cu.end());
  return p;
}

// The plan on the device, as views of the uploaded buffers.
struct DevicePlan {
  at::Tensor ext_ids;                  // [T + pad_rows]
  std::vector<at::Tensor> embed_rows;  // per step, one per midlayer row
  at::Tensor positions;                // [T]
  std::vector<ops::HeadStepRows> head;
  // Compacted steps (undefined elsewhere): the midlayer rows' positions
  // and their indices among the previous step's rows.
  std::vector<at::Tensor> mid_positions, mid_from_prev;
  at::Tensor counts;      // [L, 2] loss and position tokens
  at::Tensor cu_seqlens;  // [B + 1]
};

at::Tensor Upload(const at::Tensor& host, const at::Device& device) {
  if (!device.is_cuda()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

DevicePlan UploadPlan(const Plan& p, const at::Device& device, at::ScalarType weight_type,
                      double step_weight) {
  RECORD_USER_SCOPE("e3::ttt_fast::UploadPlan");
  const at::Tensor longs = Upload(torch::tensor(p.longs, torch::kLong), device);
  const at::Tensor weights =
      Upload(torch::tensor(p.row_weights, torch::kDouble).to(weight_type), device);
  const int64_t T = p.tokens;
  DevicePlan d;
  int64_t at = 0;
  auto take = [&](int64_t n) {
    at::Tensor v = longs.narrow(0, at, n);
    at += n;
    return v;
  };
  d.ext_ids = take(T + p.pad_rows);
  for (int64_t j = 0; j < p.length; ++j) d.embed_rows.push_back(take(p.mid_rows[j]));
  d.positions = take(T);
  int64_t w_at = 0;
  double sw = 1.0;
  for (int64_t j = 0; j < p.length; ++j) {
    const int64_t n = p.head_rows[j];
    ops::HeadStepRows s;
    s.rows = take(n);
    s.target_rows = take(n);
    s.row_weight = weights.narrow(0, w_at, n);
    s.step_weight = sw;
    s.trained_positions = p.position_tokens[j];
    w_at += n;
    sw *= step_weight;
    d.head.push_back(std::move(s));
  }
  d.mid_positions.resize(p.length);
  d.mid_from_prev.resize(p.length);
  for (int64_t j = 1; j < p.length; ++j) {
    if (!p.compacted(j)) continue;
    d.mid_positions[j] = take(p.mid_rows[j]);
    d.mid_from_prev[j] = take(p.mid_rows[j]);
  }
  d.counts = take(2 * p.length).view({p.length, 2});
  d.cu_seqlens = take(static_cast<int64_t>(p.cu.size()));
  return d;
}

// x's rows placed at `positions` of a [tokens, ...] tensor of zeros.
at::Tensor ScatterRows(const at::Tensor& x, const at::Tensor& positions, int64_t tokens) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = tokens;
  return at::zeros(shape, x.options()).index_copy(0, positions, x);
}

ops::TargetDistribution Target(Eagle3DraftImpl& draft, const at::Tensor& last_hidden, bool log_mass) {
  torch::NoGradGuard no_grad;
  ops::TargetDistribution t;
  t.logits = draft.TargetLogits(last_hidden);
  t.lse = at::logsumexp(t.logits, -1);
  t.top = t.logits.argmax(-1);
  if (log_mass) t.log_mass = draft.TargetDraftLogMass(last_hidden, t.lse).to(t.lse.scalar_type());
  return t;
}

ops::HeadLossKind HeadLoss(TttLoss loss) {
  switch (loss) {
    case TttLoss::kLkAlpha:
      return ops::HeadLossKind::kLkAlpha;
    case TttLoss::kLkLambda:
      return ops::HeadLossKind::kLkLambda;
    case TttLoss::kSoftCe:
      break;
  }
  return ops::HeadLossKind::kSoftCe;
}

absl::StatusOr<TttOutput> Run(Eagle3DraftImpl& draft, const TttBatch& batch,
                              const TttOptions& options) {
  const Eagle3DraftConfig& c = draft.config();
  E3_RETURN_IF_ERROR(ValidateTttOptions(options));
  E3_ASSIGN_OR_RETURN(std::vector<int64_t> cu, ValidateTttBatch(c, batch));
  E3_ASSIGN_OR_RETURN(FastWeights w, GetWeights(draft));
  draft.flat().AttachGrads();
  E3_ASSIGN_OR_RETURN(HostBatch host_batch, DownloadPlanInputs(draft, batch));
  const at::Device device = draft.options().device;
  const at::ScalarType dtype = draft.options().dtype;
  const at::ScalarType f = AtLeastFloat(dtype);
  const double eps = c.rms_norm_eps;
  // Queued before the host plans, so the GPU has work meanwhile.
  const ops::TargetDistribution target =
      Target(draft, batch.last_hidden, NeedsFullTargetHead(options.loss));
  at::Tensor h =
      ops::LinearAccumulate(batch.aux_hidden.to(device, dtype), w.fc.w, w.fc.grad, w.anchor);
  const Plan plan = MakePlan(draft, host_batch, std::move(cu), options);
  const DevicePlan dp = UploadPlan(plan, device, f, options.step_weight);

  // Once per batch: the normalised embeddings of every position (and of
  // the padding id) and their product with the embedding half of q/k/v.
  const at::Tensor embeds = draft.Embed(dp.ext_ids);
  const at::Tensor embeds_n =
      ops::RmsNorm(embeds, w.input_norm.w, w.input_norm.grad, w.anchor, eps);
  const ops::ProjectedForSteps qkv_embed =
      ops::ProjectForSteps(embeds_n, w.qkv_embed.w, w.qkv_embed.grad, w.anchor);
  at::Tensor cos, sin;
  std::tie(cos, sin) = draft.RopeTables(dp.positions);

  ops::TttAttentionConfig acfg{c.num_heads, c.num_kv_heads, c.head_dim,
                               1.0 / std::sqrt(static_cast<double>(c.head_dim))};
  auto cache = std::make_shared<ops::TttAttentionCache>(acfg, plan.cu, dp.cu_seqlens);
  std::vector<at::Tensor> hiddens;
  for (int64_t j = 0; j < options.length; ++j) {
    const bool compacted = plan.compacted(j);
    if (compacted) h = h.index_select(0, dp.mid_from_prev[j]);
    const at::Tensor hn = ops::RmsNorm(h, w.hidden_norm.w, w.hidden_norm.grad, w.anchor, eps);
    at::Tensor qkv = ops::LinearAccumulate(hn, w.qkv_hidden.w, w.qkv_hidden.grad, w.anchor,
                                           ops::GatherStepRows(qkv_embed, dp.embed_rows[j]));
    if (j > 0 && options.positions == TttPositions::kAdvancing) {
      std::tie(cos, sin) = draft.RopeTables(dp.positions + j);
    }
    // Attention runs over every position; rows left out carry zero
    // projections, which no kept row reads (they are later-step diagonal
    // keys of positions no longer trained) and whose gradient is zero.
    if (compacted) qkv = ScatterRows(qkv, dp.mid_positions[j], plan.tokens);
    at::Tensor attn = ops::TttAttentionStep(cache, qkv, cos, sin);
    if (compacted) attn = attn.index_select(0, dp.mid_positions[j]);
    const at::Tensor mid = ops::LinearAccumulate(attn, w.o.w, w.o.grad, w.anchor, h);
    const at::Tensor y = ops::RmsNorm(mid, w.post_norm.w, w.post_norm.grad, w.anchor, eps);
    const at::Tensor act =
        ops::SiluMul(ops::LinearAccumulate(y, w.gate_up.w, w.gate_up.grad, w.anchor));
    h = ops::LinearAccumulate(act, w.down.w, w.down.grad, w.anchor, mid);
    hiddens.push_back(h);
  }

  ops::DraftHeadWeights hw{w.norm.w, w.norm.grad, w.lm_head.w, w.lm_head.grad, w.anchor, eps};
  ops::DraftHeadOptions ho;
  ho.chunk_rows = options.head_chunk_rows > 0 ? options.head_chunk_rows
                                              : std::clamp<int64_t>(plan.tokens, 2048, 8192);
  ho.keep_logits = options.keep_logits;
  ho.keep_token_losses = options.keep_token_losses;
  ho.loss = HeadLoss(options.loss);
  ho.kl_scale = options.kl_scale;
  ho.kl_decay = options.kl_decay;
  ops::DraftHeadLossOutput head = ops::DraftHeadLoss(hiddens, dp.head, target, hw, plan.tokens, ho);

  TttOutput out;
  out.num_tokens = plan.tokens;
  for (int64_t n : plan.mid_rows) out.midlayer_rows += n;
  out.loss = head.loss;
  out.logits = std::move(head.logits);
  out.token_losses = std::move(head.token_losses);
  {
    torch::NoGradGuard no_grad;
    // -1: the expected acceptance rate is not measured (soft CE).
    const at::Tensor acceptance = head.step_acceptance.defined()
                                      ? head.step_acceptance.to(at::kDouble)
                                      : at::full({plan.length}, -1.0, dp.counts.options().dtype(at::kDouble));
    const at::Tensor per_step =
        at::stack({head.step_loss.to(at::kDouble), head.step_hits.to(at::kDouble),
                   dp.counts.select(1, 0).to(at::kDouble), dp.counts.select(1, 1).to(at::kDouble),
                   acceptance},
                  1);
    out.pending_metrics =
        at::cat({per_step.reshape({-1}), head.loss.detach().to(at::kDouble).reshape({1})});
  }
  if (!options.defer_metrics) ResolveTttMetrics(&out);
  return out;
}

}  // namespace

absl::StatusOr<TttOutput> RunTttFast(Eagle3DraftImpl& draft, const TttBatch& batch,
                                     const TttOptions& options) {
  return Run(draft, batch, options);
}

}  // namespace e3
