// y = x W^T (+ b), with W in nn.Linear's [out, in] layout; b may be undefined.
#ifndef E3_TEACHER_SERVER_LAYERS_LINEAR_H_
#define E3_TEACHER_SERVER_LAYERS_LINEAR_H_

#include <torch/torch.h>

namespace e3 {

inline at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_LINEAR_H_
