#include "teacher_server/layers/gated_shared_expert.h"

namespace e3 {

at::Tensor AddGatedSharedExpert(const at::Tensor& x, const at::Tensor& routed,
                                const GatedSharedExpert& w, bool fused_activation) {
  TORCH_CHECK(
      w.gate.defined() && w.gate.dim() == 2 && w.gate.size(0) == 1 && w.gate.size(1) == x.size(-1),
      "shared expert: shared_expert_gate must be [1, ", x.size(-1), "]");
  const at::Tensor shared = SwiGluMlp(x, w.mlp, fused_activation);
  return routed + at::sigmoid(at::linear(x, w.gate)) * shared;
}

}  // namespace e3
