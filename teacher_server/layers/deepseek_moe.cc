#include "teacher_server/layers/deepseek_moe.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace e3 {
namespace {

// Keeps the scores of the topk_group best groups (ranked by group_score of
// each [T, groups, per_group] block) and sets the others to `masked`.
at::Tensor MaskToBestGroups(const at::Tensor& scores, const at::Tensor& group_scores, int64_t n_group,
                            int64_t topk_group, double masked) {
  const int64_t T = scores.size(0), E = scores.size(1);
  const at::Tensor best = std::get<1>(group_scores.topk(topk_group, -1, /*largest=*/true, /*sorted=*/false));
  const at::Tensor keep = at::zeros_like(group_scores).scatter_(1, best, 1.0).to(at::kBool);
  const at::Tensor expert_keep = keep.unsqueeze(-1).expand({T, n_group, E / n_group}).reshape({T, E});
  return scores.masked_fill(expert_keep.logical_not(), masked);
}

}  // namespace

DeepseekRouting DeepseekRouting::FromConfig(const ModelConfig& c) {
  DeepseekRouting r;
  r.scoring = c.deepseek.scoring;
  r.group_limited = c.deepseek.group_limited;
  r.n_group = c.deepseek.n_group;
  r.topk_group = c.deepseek.topk_group;
  r.top_k = c.moe.top_k;
  r.normalize = c.architecture == Architecture::kDeepseekV3 && c.moe.norm_topk_prob;
  r.routed_scaling_factor = c.deepseek.routed_scaling_factor;
  return r;
}

std::pair<at::Tensor, at::Tensor> DeepseekRoute(const at::Tensor& x, const at::Tensor& router,
                                                const at::Tensor& score_bias, const DeepseekRouting& r) {
  const at::Tensor logits = at::linear(x.to(at::kFloat), router.to(at::kFloat));
  const int64_t T = logits.size(0), E = logits.size(1), per_group = E / r.n_group;
  at::Tensor ids, weights;
  if (r.scoring == DeepseekConfig::Scoring::kSigmoid) {
    const at::Tensor scores = logits.sigmoid();
    at::Tensor choice = score_bias.defined() ? scores + score_bias : scores;
    if (r.group_limited) {
      const at::Tensor group_scores =
          std::get<0>(choice.view({T, r.n_group, per_group}).topk(std::min<int64_t>(2, per_group), -1)).sum(-1);
      choice = MaskToBestGroups(choice, group_scores, r.n_group, r.topk_group,
                                -std::numeric_limits<double>::infinity());
    }
    ids = std::get<1>(choice.topk(r.top_k, -1, /*largest=*/true, /*sorted=*/false));
    weights = scores.gather(1, ids);
  } else {
    at::Tensor scores = at::softmax(logits, -1, at::kFloat);
    if (r.group_limited) {
      const at::Tensor group_scores = std::get<0>(scores.view({T, r.n_group, per_group}).max(-1));
      scores = MaskToBestGroups(scores, group_scores, r.n_group, r.topk_group, 0.0);
    }
    std::tie(weights, ids) = scores.topk(r.top_k, -1, /*largest=*/true, /*sorted=*/false);
  }
  if (r.normalize) weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
  return {ids, weights * r.routed_scaling_factor};
}

at::Tensor DeepseekMoe(const at::Tensor& x, const DeepseekMoeWeights& w, const DeepseekRouting& routing,
                       bool fused_activation, GemmPath gemm) {
  auto [ids, weights] = DeepseekRoute(x, w.routed.router, w.score_bias, routing);
  at::Tensor out = RoutedExpertsSum(x, w.routed, weights, ids, fused_activation);
  if (w.shared.down_proj.defined()) out = out + SwiGluMlp(x, w.shared, fused_activation, gemm);
  return out;
}

}  // namespace e3
