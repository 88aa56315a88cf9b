// The routed mixture-of-experts MLP of Mixtral, Qwen3-MoE and GPT-OSS (and
// the routed experts of DeepSeekMoE, layers/deepseek_moe.h): a
// router picks top-k experts per token; each expert is a SwiGLU MLP
// (GPT-OSS: the clamped variant with biases); the outputs are summed with
// the router's weights. Under expert parallelism a rank
// holds only some experts (and under TP a slice of each); it returns the
// partial sum of its experts, which the caller all-reduces.
#ifndef E3_TEACHER_SERVER_LAYERS_MOE_H_
#define E3_TEACHER_SERVER_LAYERS_MOE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "common/torch/torch_core.h"
#include "teacher_server/layers/clamped_swiglu.h"
#include "teacher_server/layers/mlp.h"

namespace e3 {

struct MoeWeights {
  at::Tensor router;                // [num_experts, H]: every expert, so every rank routes alike
  at::Tensor router_bias;           // [num_experts] (GPT-OSS); undefined when absent
  int64_t first_expert = 0;         // global id of experts[0]
  std::vector<MlpWeights> experts;  // this rank's experts, in id order
  // Set by StackExperts: every local expert's fused gate_up [E, 2I, H] and
  // down [E, H, I] in one tensor each (experts[e] then view into them), and
  // where the experts have biases (GPT-OSS) their gate_up [E, 2I] and down
  // [E, H] biases alike (down: undefined on a rank that does not add it).
  at::Tensor stacked_gate_up, stacked_down, stacked_gate_up_bias, stacked_down_bias;
};

struct MoeRouting {
  int64_t top_k = 0;
  bool normalize = true;  // renormalise the chosen k probabilities to sum to 1
  // GroupedMoe under EP: gather and activate only this rank's (token,
  // expert) pairs (false, the bench's ablation: every pair, as before).
  bool rank_rows_only = true;
  // GPT-OSS: the top-k of the router's logits, then a softmax over those k
  // in the logits' dtype (GptOssTopKRouter); else the softmax over every
  // expert in fp32, then the top-k (`normalize` then applies).
  bool topk_then_softmax = false;
  // GPT-OSS's experts (clamped_swiglu.h); else SwiGluMlp.
  std::optional<ClampedSwiGlu> clamped_swiglu = std::nullopt;
};

// x: [T, H]. Follows transformers' numerics: router logits in x's dtype,
// softmax in fp32, top-k, optional renormalisation (GPT-OSS: the router's
// bias, top-k of the logits, softmax over them in their dtype), weights
// cast to x's dtype; experts accumulated in id order with index_add.
// `fused_activation` as in SwiGluMlp.
at::Tensor SparseMoe(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing,
                     bool fused_activation = false);

// SparseMoe's experts for a routing made elsewhere (DeepSeekMoE's router,
// layers/deepseek_moe.h): chosen [T, k] expert ids, weights [T, k] in x's
// dtype or fp32. Each expert's output times its weight (in fp32 when the
// weights are, as transformers multiplies) is rounded to x's dtype and
// accumulated in expert-id order. Experts outside w's local range add
// nothing (expert parallelism). The experts are SwiGLU MLPs, or GPT-OSS's
// clamped variant when `clamped_swiglu` is set.
at::Tensor WeightedExpertsSum(const at::Tensor& x, const MoeWeights& w, const at::Tensor& weights,
                              const at::Tensor& chosen, bool fused_activation = false,
                              const std::optional<ClampedSwiGlu>& clamped_swiglu = std::nullopt);

// Whether StackExperts takes these experts: at least one, each with a
// fused gate_up (FuseGateUp), and each bias (gate_up, down) on every expert
// or on none.
bool ExpertsStackable(const MoeWeights& w);
// Stacks the experts (and their biases) for GroupedMoe without keeping a
// second copy.
void StackExperts(MoeWeights* w);

// SparseMoe through grouped GEMMs (SGLang's fused MoE): the (token,
// expert) pairs sorted by expert, and each projection of every local
// expert one grouped GEMM, with no host synchronisation (the per-expert
// loop reads the counts on the host and issues ~5 kernels per expert).
// Needs StackExperts. The same numerics as SparseMoe: each pair's output
// and its weighting rounded to x's dtype, and a token's contributions
// added in expert-id order, rounded after each add as index_add does. The
// grouped GEMM (LibTorch 2.8+, CUDA, bf16) sums in its own order; elsewhere
// the groups are looped (the counts then go to the host). GPT-OSS's
// experts (routing.clamped_swiglu) run the same way: each pair's gate_up
// row plus its expert's bias, the clamped activation as ClampedSwiGluMlp
// computes it, the down row plus its bias, each rounded where the loop
// rounds.
at::Tensor GroupedMoe(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing,
                      bool fused_activation = false);

// GroupedMoe's experts for a routing made elsewhere, as WeightedExpertsSum
// takes it (DeepSeekMoE: chosen [T, k] ids, weights [T, k] in fp32): the
// same sum, each pair's output times its weight rounded to x's dtype and a
// token's pairs added in expert-id order. Needs StackExperts.
at::Tensor GroupedExpertsSum(const at::Tensor& x, const MoeWeights& w, const at::Tensor& weights,
                             const at::Tensor& chosen, bool fused_activation = false,
                             const std::optional<ClampedSwiGlu>& clamped_swiglu = std::nullopt,
                             bool rank_rows_only = true);

// Whether GroupedMoe runs these experts on `device` in `dtype` without
// reading anything on the host (the grouped GEMM takes both projections),
// so that a CUDA graph can capture it.
bool GroupedMoeStaysOnDevice(const MoeWeights& w, at::ScalarType dtype, at::Device device);

// GroupedMoe where the experts are stacked, else SparseMoe.
at::Tensor RoutedExperts(const at::Tensor& x, const MoeWeights& w, const MoeRouting& routing,
                         bool fused_activation = false);
// GroupedExpertsSum where the experts are stacked, else WeightedExpertsSum.
at::Tensor RoutedExpertsSum(const at::Tensor& x, const MoeWeights& w, const at::Tensor& weights,
                            const at::Tensor& chosen, bool fused_activation = false,
                            const std::optional<ClampedSwiGlu>& clamped_swiglu = std::nullopt);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_MOE_H_
