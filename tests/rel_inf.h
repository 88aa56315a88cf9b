// The relative max-norm error of `a` against the reference `b`, computed
// in fp64 on the CPU: max |a - b| / max |b| (a zero reference divides by
// 1e-300, so any difference from it is huge).
#ifndef E3_TESTS_REL_INF_H_
#define E3_TESTS_REL_INF_H_

#include <algorithm>

#include "common/torch/torch_core.h"

namespace e3::testing {

inline double RelInf(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.detach().to(at::kCPU, at::kDouble);
  const at::Tensor y = b.detach().to(at::kCPU, at::kDouble);
  return (x - y).abs().max().item<double>() / std::max(y.abs().max().item<double>(), 1e-300);
}

}  // namespace e3::testing

#endif  // E3_TESTS_REL_INF_H_
