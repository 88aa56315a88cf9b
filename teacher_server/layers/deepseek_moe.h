// DeepSeekMoE (DeepSeek-V2/V3, Kimi-K2): routed experts chosen by a router
// that limits each token to its best expert groups, plus shared experts
// every token passes through, as transformers 5.17 computes it:
//   V3: scores = sigmoid(x W^T) in fp32; the choice ranks scores +
//       e_score_correction_bias; groups ranked by the sum of their best two
//       biased scores, the topk_group best kept (others masked to -inf);
//       weights = the unbiased scores of the chosen, renormalised when
//       norm_topk_prob (sum + 1e-20), times routed_scaling_factor.
//   V2: scores = softmax(x W^T) in fp32; top-k ("greedy"), or within the
//       groups whose best score ranks in the topk_group best
//       ("group_limited_greedy", others masked to 0); times
//       routed_scaling_factor; never renormalised (transformers reads no
//       norm_topk_prob for V2).
// The experts are SwiGLU MLPs (moe.h: WeightedExpertsSum's loop, or the
// grouped GEMMs of GroupedExpertsSum where they are stacked, the sgl
// backend); the output is routed + shared. Under EP/TP a rank holds some experts (or slices) and
// a slice of the shared experts; its output is a partial sum.
#ifndef E3_TEACHER_SERVER_LAYERS_DEEPSEEK_MOE_H_
#define E3_TEACHER_SERVER_LAYERS_DEEPSEEK_MOE_H_

#include <cstdint>
#include <utility>

#include "common/model/model_config.h"
#include "common/torch/torch_core.h"
#include "teacher_server/layers/mlp.h"
#include "teacher_server/layers/moe.h"

namespace e3 {

struct DeepseekRouting {
  DeepseekConfig::Scoring scoring = DeepseekConfig::Scoring::kSigmoid;
  bool group_limited = true;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 1;
  bool normalize = false;  // V3's norm_topk_prob
  double routed_scaling_factor = 1.0;

  static DeepseekRouting FromConfig(const ModelConfig& config);
};

struct DeepseekMoeWeights {
  MoeWeights routed;           // router = mlp.gate.weight [E, H] (compute dtype), this rank's experts
  at::Tensor score_bias;       // V3's e_score_correction_bias [E], fp32; undefined for V2
  MlpWeights shared;           // this rank's slice of the shared experts; undefined without them
};

// The chosen experts [T, k] (int64) and their weights [T, k] (fp32).
std::pair<at::Tensor, at::Tensor> DeepseekRoute(const at::Tensor& x, const at::Tensor& router,
                                                const at::Tensor& score_bias, const DeepseekRouting& routing);

// x [T, H] -> [T, H]. `fused_activation` and `gemm` as SwiGluMlp takes
// them (the sgl backend's SiLU-mul kernel and cuBLASLt projections).
at::Tensor DeepseekMoe(const at::Tensor& x, const DeepseekMoeWeights& w, const DeepseekRouting& routing,
                       bool fused_activation = false, GemmPath gemm = GemmPath::kAten);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_DEEPSEEK_MOE_H_
