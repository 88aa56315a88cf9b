#include "teacher_server/layers/moe.h"

namespace e3 {

at::Tensor SparseMoe(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing, bool fused_activation) {
  at::Tensor probs = at::softmax(at::linear(x, w.router), -1, at::kFloat);
  auto [weights, chosen] = probs.topk(routing.top_k, -1);
  if (routing.normalize) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type());

  at::Tensor out = torch::zeros_like(x);
  // Which (token, slot) pairs chose each local expert: one pass over the
  // [T, k] choices instead of one comparison per expert.
  const int64_t num_local = static_cast<int64_t>(w.experts.size());
  at::Tensor local = chosen - w.first_expert;
  at::Tensor mine = (local >= 0).logical_and(local < num_local);
  at::Tensor pairs = mine.nonzero();  // [n, 2]: token, slot
  if (pairs.size(0) == 0) return out;
  at::Tensor tokens = pairs.select(1, 0), slots = pairs.select(1, 1);
  at::Tensor expert_of_pair = local.index({tokens, slots});
  // Group the pairs by expert (stable, so tokens stay in order within one).
  at::Tensor order = std::get<1>(expert_of_pair.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  tokens = tokens.index_select(0, order);
  slots = slots.index_select(0, order);
  at::Tensor counts = at::bincount(expert_of_pair, /*weights=*/{}, num_local).cpu();
  const int64_t* n = counts.data_ptr<int64_t>();
  int64_t begin = 0;
  for (int64_t e = 0; e < num_local; ++e) {
    if (n[e] == 0) continue;
    at::Tensor tok = tokens.narrow(0, begin, n[e]);
    at::Tensor y = SwiGluMlp(x.index_select(0, tok), w.experts[e], fused_activation) *
                   weights.index({tok, slots.narrow(0, begin, n[e])}).unsqueeze(-1);
    out.index_add_(0, tok, y);
    begin += n[e];
  }
  return out;
}

}  // namespace e3
