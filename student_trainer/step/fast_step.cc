#include "student_trainer/step/fast_step.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>


#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "student_trainer/ops/draft_head_loss.h"
#include "student_trainer/ops/linear.h"
#include "student_trainer/ops/rms_norm.h"
#include "student_trainer/ops/silu_mul.h"
#include "student_trainer/ops/step_rows.h"
#include "student_trainer/ops/ttt_attention.h"
#include "student_trainer/step/batch_checks.h"
#include "student_trainer/step/step_plan.h"

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
  std::vector<WeightPair> fc_norms;  // EAGLE-3.1's, one per aux state
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
  for (size_t k = 0; k < draft.fc_norms.size(); ++k) {
    w.fc_norms.push_back(pair(absl::StrCat("fc_norm.", k, ".weight").c_str()));
  }
  w.anchor = f.anchor();
  return w;
}

// x's rows placed at `positions` of a [tokens, ...] tensor of zeros.
// fc's input: the aux states, each through its fc_norm (EAGLE-3.1) where
// the draft has them.
at::Tensor FcInput(const at::Tensor& aux, const FastWeights& w, int64_t width, double eps) {
  if (w.fc_norms.empty()) return aux;
  std::vector<at::Tensor> normed;
  for (size_t k = 0; k < w.fc_norms.size(); ++k) {
    const WeightPair& n = w.fc_norms[k];
    normed.push_back(ops::RmsNorm(aux.narrow(1, static_cast<int64_t>(k) * width, width), n.w, n.grad, w.anchor, eps));
  }
  return at::cat(normed, 1);
}

at::Tensor ScatterRows(const at::Tensor& x, const at::Tensor& positions, int64_t tokens) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = tokens;
  return at::zeros(shape, x.options()).index_copy(0, positions, x);
}

ops::TargetDistribution Target(Eagle3DraftImpl& draft, const at::Tensor& last_hidden, bool log_mass) {
  torch::NoGradGuard no_grad;
  ops::TargetDistribution t = ops::TargetFromLogits(draft.TargetLogits(last_hidden));
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

absl::StatusOr<TttOutput> Run(Eagle3DraftImpl& draft, const TeacherBatch& batch,
                              const TttOptions& options) {
  const Eagle3DraftConfig& c = draft.config();
  E3_RETURN_IF_ERROR(ValidateTttOptions(options));
  E3_RETURN_IF_ERROR(CheckTttBatchShapes(c, batch));
  E3_ASSIGN_OR_RETURN(FastWeights w, GetWeights(draft));
  draft.flat().AttachGrads();
  // The plan's inputs travel to the host ahead of the work that needs no
  // plan (the target distribution and fc), and only they are waited for:
  // the host plans while the GPU runs that work.
  TttPlanInputsDownload download(batch);
  const at::Device device = draft.options().device;
  const at::ScalarType dtype = draft.options().dtype;
  const at::ScalarType f = AtLeastFloat(dtype);
  const double eps = c.rms_norm_eps;
  const ops::TargetDistribution target =
      Target(draft, batch.last_hidden, NeedsFullTargetHead(options.loss));
  at::Tensor h = ops::LinearAccumulate(FcInput(batch.aux_hidden.to(device, dtype), w, c.target_hidden_size, eps),
                                       w.fc.w, w.fc.grad, w.anchor);
  E3_ASSIGN_OR_RETURN(TttPlanInputs inputs, download.Finish(draft));
  const TttPlan plan = MakeTttPlan(draft.t2d_host(), inputs.batch, std::move(inputs.cu), options);
  const TttDevicePlan dp = UploadTttPlan(plan, device, f, options.step_weight);

  // Once per batch: the normalised embeddings of every position (and of
  // the padding id) and their product with the embedding half of q/k/v;
  // the embeddings are frozen, so input_layernorm's gradient is taken in
  // weight space (no GEMM back to the rows).
  const ops::ProjectedForSteps qkv_embed = ops::ProjectNormedForSteps(
      draft.Embed(dp.ext_ids), w.input_norm.w, w.input_norm.grad, w.qkv_embed.w, w.qkv_embed.grad, w.anchor, eps);
  at::Tensor cos, sin;
  std::tie(cos, sin) = draft.RopeTables(dp.positions);

  ops::TttAttentionConfig acfg{c.num_heads, c.num_kv_heads, c.head_dim,
                               1.0 / std::sqrt(static_cast<double>(c.head_dim))};
  auto cache = std::make_shared<ops::TttAttentionCache>(acfg, plan.cu, dp.cu_seqlens);
  std::vector<at::Tensor> hiddens;
  for (int64_t j = 0; j < options.length; ++j) {
    const bool compacted = plan.compacted(j);
    if (compacted) h = h.index_select(0, dp.mid_from_prev[j]);
    // The residual adds read h and mid through the norms' second output,
    // so each norm's backward kernel also sums the residual's gradient.
    const ops::NormedWithResidual hn =
        ops::RmsNormWithResidual(h, w.hidden_norm.w, w.hidden_norm.grad, w.anchor, eps);
    at::Tensor qkv = ops::LinearAccumulate(hn.normed, w.qkv_hidden.w, w.qkv_hidden.grad, w.anchor,
                                           ops::GatherStepRows(qkv_embed, dp.embed_rows[j], dp.embed_first_row[j]));
    if (j > 0 && options.positions == TttPositions::kAdvancing) {
      std::tie(cos, sin) = draft.RopeTables(dp.positions + j);
    }
    // Attention runs over every position; rows left out carry zero
    // projections, which no kept row reads (they are later-step diagonal
    // keys of positions no longer trained) and whose gradient is zero.
    if (compacted) qkv = ScatterRows(qkv, dp.mid_positions[j], plan.tokens);
    at::Tensor attn = ops::TttAttentionStep(cache, qkv, cos, sin);
    if (compacted) attn = attn.index_select(0, dp.mid_positions[j]);
    const at::Tensor mid = ops::LinearAccumulate(attn, w.o.w, w.o.grad, w.anchor, hn.residual);
    const ops::NormedWithResidual y =
        ops::RmsNormWithResidual(mid, w.post_norm.w, w.post_norm.grad, w.anchor, eps);
    const at::Tensor act =
        ops::SiluMul(ops::LinearAccumulate(y.normed, w.gate_up.w, w.gate_up.grad, w.anchor));
    h = ops::LinearAccumulate(act, w.down.w, w.down.grad, w.anchor, y.residual);
    // EAGLE-3.1: the next step and the head both read norm(h).
    if (c.norm_output) h = ops::RmsNorm(h, w.norm.w, w.norm.grad, w.anchor, eps);
    hiddens.push_back(h);
  }

  ops::DraftHeadWeights hw{w.norm.w, w.norm.grad, w.lm_head.w, w.lm_head.grad, w.anchor, eps};
  if (c.norm_output) hw.norm = hw.norm_grad = at::Tensor();
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

absl::StatusOr<TttOutput> RunTttFast(Eagle3DraftImpl& draft, const TeacherBatch& batch,
                                     const TttOptions& options) {
  return Run(draft, batch, options);
}

}  // namespace e3
