// Random routed experts for the MoE layer tests and the MoE layer bench.
#ifndef E3_TESTS_TEACHER_SERVER_RANDOM_EXPERTS_H_
#define E3_TESTS_TEACHER_SERVER_RANDOM_EXPERTS_H_

#include <cstdint>
#include <utility>

#include "common/torch/torch_core.h"
#include "teacher_server/layers/mlp.h"
#include "teacher_server/layers/moe.h"

namespace e3::testing {

// `count` of `total` experts, starting at `first`, as an expert-parallel
// rank holds them: the router over all `total` (standard normal), each
// expert's gate, up and down normal times `scale`, drawn on the CPU (so a
// seed gives the same weights on any device), then moved to `device` in
// `dtype`. Gate and up are fused, as the sgl loader fuses them, unless
// `fuse` is false.
inline MoeWeights RandomExperts(int64_t total, int64_t first, int64_t count, int64_t H, int64_t I,
                                at::ScalarType dtype, double scale, at::Device device = at::kCPU, bool fuse = true) {
  MoeWeights w;
  w.router = torch::randn({total, H}).to(device, dtype);
  w.first_expert = first;
  for (int64_t e = 0; e < count; ++e) {
    MlpWeights m;
    m.gate_proj = (torch::randn({I, H}) * scale).to(device, dtype);
    m.up_proj = (torch::randn({I, H}) * scale).to(device, dtype);
    m.down_proj = (torch::randn({H, I}) * scale).to(device, dtype);
    if (fuse) FuseGateUp(&m);
    w.experts.push_back(std::move(m));
  }
  return w;
}

}  // namespace e3::testing

#endif  // E3_TESTS_TEACHER_SERVER_RANDOM_EXPERTS_H_
