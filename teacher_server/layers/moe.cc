#include "teacher_server/layers/moe.h"

#include <limits>
#include <tuple>

#include "common/gpu/cuda_runtime.h"
#include "common/torch/torch_compat.h"
#include "teacher_server/layers/fused_ops.h"

namespace e3 {
namespace {

// Whether LibTorch's grouped GEMM kernel takes a product by w [G, N, K]:
// bf16, 16-byte rows, and Hopper or Blackwell (compute capability 9.x or
// 10.x; on other GPUs LibTorch's op falls back to a loop that reads the
// offsets on the host).
bool GroupedGemmApplies(const at::Tensor& w, at::ScalarType dtype, at::Device device) {
  const int cc = device.is_cuda() ? CudaComputeCapability(device.index()) : 0;
  return compat::kHasGroupedMm && dtype == at::kBFloat16 && w.size(2) % 8 == 0 && w.size(1) % 8 == 0 &&
         (cc / 10 == 9 || cc / 10 == 10);
}

// Rows [offs[g-1], offs[g]) of a times w[g]^T, for w [G, N, K]. Without the
// grouped GEMM (CPU, LibTorch before 2.8, fp16 or fp32, other GPUs), one
// GEMM per group as SparseMoe's loop runs them (the offsets then go to the
// host). Rows past the last group belong to no group: the grouped GEMM
// leaves them unwritten, and the loop fills them with NaN, so that a caller
// that reads them fails its tests on the CPU too.
at::Tensor GroupedLinear(const at::Tensor& a, const at::Tensor& w, const at::Tensor& offs) {
  if (GroupedGemmApplies(w, a.scalar_type(), a.device())) return compat::GroupedMm(a, w, offs);
  at::Tensor out = at::full({a.size(0), w.size(1)}, std::numeric_limits<float>::quiet_NaN(), a.options());
  const at::Tensor ends = offs.to(at::kCPU, at::kLong);
  int64_t begin = 0;
  for (int64_t g = 0; g < w.size(0); ++g) {
    const int64_t end = ends[g].item<int64_t>();
    if (end > begin) out.narrow(0, begin, end - begin).copy_(at::linear(a.narrow(0, begin, end - begin), w[g]));
    begin = end;
  }
  return out;
}

// The router's choice for each token: the top-k experts' ids and their
// weights in x's dtype. Mixtral and Qwen3-MoE: logits in x's dtype,
// softmax in fp32, top-k, optional renormalisation. GPT-OSS: logits with
// the router's bias, top-k, softmax over those k in the logits' dtype.
std::tuple<at::Tensor, at::Tensor> Route(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing) {
  const at::Tensor logits = at::linear(x, w.router, w.router_bias);
  if (routing.topk_then_softmax) {
    auto [top, chosen] = logits.topk(routing.top_k, -1);
    return {at::softmax(top, -1, top.scalar_type()).to(x.scalar_type()), chosen};
  }
  const at::Tensor probs = at::softmax(logits, -1, at::kFloat);
  auto [weights, chosen] = probs.topk(routing.top_k, -1);
  if (routing.normalize) weights = weights / weights.sum(-1, /*keepdim=*/true);
  return {weights.to(x.scalar_type()), chosen};
}

// One expert's output for the rows x routed to it.
at::Tensor ExpertMlp(const at::Tensor& x, const MlpWeights& w, const std::optional<ClampedSwiGlu>& clamped_swiglu,
                     bool fused_activation) {
  return clamped_swiglu ? ClampedSwiGluMlp(x, w, *clamped_swiglu) : SwiGluMlp(x, w, fused_activation);
}

}  // namespace

at::Tensor SparseMoe(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing, bool fused_activation) {
  auto [weights, chosen] = Route(x, w, routing);
  return WeightedExpertsSum(x, w, weights, chosen, fused_activation, routing.clamped_swiglu);
}

at::Tensor WeightedExpertsSum(const at::Tensor& x, const MoeWeights& w, const at::Tensor& weights,
                              const at::Tensor& chosen, bool fused_activation,
                              const std::optional<ClampedSwiGlu>& clamped_swiglu) {
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
    at::Tensor y = ExpertMlp(x.index_select(0, tok), w.experts[e], clamped_swiglu, fused_activation) *
                   weights.index({tok, slots.narrow(0, begin, n[e])}).unsqueeze(-1);
    out.index_add_(0, tok, y.to(x.scalar_type()));
    begin += n[e];
  }
  return out;
}

bool ExpertsStackable(const MoeWeights& w) {
  if (w.experts.empty()) return false;
  const MlpWeights& first = w.experts.front();
  for (const MlpWeights& e : w.experts) {
    if (!e.gate_up_proj.defined() || e.gate_up_bias.defined() != first.gate_up_bias.defined() ||
        e.down_bias.defined() != first.down_bias.defined()) {
      return false;
    }
  }
  return true;
}

void StackExperts(MoeWeights* w) {
  std::vector<at::Tensor> gate_up, down, gate_up_bias, down_bias;
  for (const MlpWeights& e : w->experts) {
    gate_up.push_back(e.gate_up_proj);
    down.push_back(e.down_proj);
    if (e.gate_up_bias.defined()) gate_up_bias.push_back(e.gate_up_bias);
    if (e.down_bias.defined()) down_bias.push_back(e.down_bias);
  }
  w->stacked_gate_up = torch::stack(gate_up);
  w->stacked_down = torch::stack(down);
  if (!gate_up_bias.empty()) w->stacked_gate_up_bias = torch::stack(gate_up_bias);
  if (!down_bias.empty()) w->stacked_down_bias = torch::stack(down_bias);
  for (size_t i = 0; i < w->experts.size(); ++i) {
    const int64_t e = static_cast<int64_t>(i);
    MlpWeights& m = w->experts[i];
    m.gate_up_proj = w->stacked_gate_up[e];
    m.down_proj = w->stacked_down[e];
    if (m.gate_up_bias.defined()) m.gate_up_bias = w->stacked_gate_up_bias[e];
    if (m.down_bias.defined()) m.down_bias = w->stacked_down_bias[e];
  }
}

bool GroupedMoeStaysOnDevice(const MoeWeights& w, at::ScalarType dtype, at::Device device) {
  return w.stacked_gate_up.defined() && GroupedGemmApplies(w.stacked_gate_up, dtype, device) &&
         GroupedGemmApplies(w.stacked_down, dtype, device);
}

at::Tensor GroupedMoe(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing, bool fused_activation) {
  auto [weights, chosen] = Route(x, w, routing);
  return GroupedExpertsSum(x, w, weights, chosen, fused_activation, routing.clamped_swiglu, routing.rank_rows_only);
}

at::Tensor GroupedExpertsSum(const at::Tensor& x, const MoeWeights& w, const at::Tensor& weights_in,
                             const at::Tensor& chosen, bool fused_activation,
                             const std::optional<ClampedSwiGlu>& clamped_swiglu, bool rank_rows_only) {
  TORCH_CHECK(w.stacked_gate_up.defined(), "GroupedExpertsSum needs StackExperts");
  const int64_t T = x.size(0), k = chosen.size(1), E = static_cast<int64_t>(w.experts.size());
  // Each token's choices in expert-id order: the order SparseMoe adds them.
  at::Tensor ids, by_id;
  std::tie(ids, by_id) = chosen.sort(-1);
  const at::Tensor weights = weights_in.gather(-1, by_id);
  const at::Tensor local = ids - w.first_expert;
  const at::Tensor valid = (local >= 0).logical_and(local < E);
  const bool all_local = w.first_expert == 0 && E == w.router.size(0);
  // The T k pairs grouped by local expert (stable: tokens ascending within
  // one, as SparseMoe gathers them); other ranks' experts sort last.
  const at::Tensor key = at::where(valid, local, at::full({}, E, local.options())).flatten();
  at::Tensor sorted_key, order;
  std::tie(sorted_key, order) = key.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor counts = at::zeros({E + 1}, key.options()).index_add_(0, key, at::ones_like(key));
  const at::Tensor offs = counts.narrow(0, 0, E).cumsum(0).to(at::kInt);
  // Under EP only this rank's pairs (the first offs[E-1]) are gathered and
  // activated: the grouped GEMMs never read the rows past them, and the
  // count stays on the device.
  const at::Tensor limit = all_local || !rank_rows_only ? at::Tensor() : offs.narrow(0, E - 1, 1);
  // The expert of each row of the grouped products, for their biases (rows
  // past this rank's pairs take the last expert's: they are never read).
  const bool biased = w.stacked_gate_up_bias.defined() || w.stacked_down_bias.defined();
  const at::Tensor row_expert = biased ? sorted_key.clamp_max(E - 1) : at::Tensor();
  auto plus_bias = [&](at::Tensor y, const at::Tensor& bias) {
    // As the loop: the product rounded, then the bias added.
    return bias.defined() ? y + bias.index_select(0, row_expert) : y;
  };
  // Each pair's token row, gathered in pair order (freed after the GEMM).
  at::Tensor gate_up =
      GroupedLinear(GatherRows(x, order.div(k, "floor"), limit, fused_activation), w.stacked_gate_up, offs);
  // GPT-OSS: its gate/up bias and clamped activation in one kernel pass.
  const at::Tensor act =
      clamped_swiglu
          ? BiasClampedSwiGlu(gate_up, w.stacked_gate_up_bias, row_expert, *clamped_swiglu, fused_activation, limit)
          : SiluMul(plus_bias(gate_up, w.stacked_gate_up_bias), fused_activation, limit);
  gate_up = at::Tensor();
  const at::Tensor y = plus_bias(GroupedLinear(act, w.stacked_down, offs), w.stacked_down_bias);
  // Where each pair's output row landed in y.
  const at::Tensor row_of_pair =
      at::empty_like(order).index_copy_(0, order, at::arange(order.numel(), order.options())).view({T, k});
  // Other ranks' experts add nothing (their rows of y were not computed).
  return MoeCombine(y, row_of_pair, weights.contiguous(), all_local ? at::Tensor() : valid.contiguous(),
                    fused_activation);
}

at::Tensor RoutedExperts(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing, bool fused_activation) {
  return w.stacked_gate_up.defined() ? GroupedMoe(x, w, routing, fused_activation)
                                     : SparseMoe(x, w, routing, fused_activation);
}

at::Tensor RoutedExpertsSum(const at::Tensor& x, const MoeWeights& w, const at::Tensor& weights,
                            const at::Tensor& chosen, bool fused_activation,
                            const std::optional<ClampedSwiGlu>& clamped_swiglu) {
  return w.stacked_gate_up.defined()
             ? GroupedExpertsSum(x, w, weights, chosen, fused_activation, clamped_swiglu)
             : WeightedExpertsSum(x, w, weights, chosen, fused_activation, clamped_swiglu);
}

}  // namespace e3
