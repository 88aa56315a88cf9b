// Keeps a C++ object alive in an autograd Function's saved_data, which
// holds only IValues: the object is owned by the deleter of a one-byte CPU
// tensor (saved_data keeps the tensor, the graph keeps saved_data), so it
// lives exactly as long as the graph that needs it.
#ifndef E3_STUDENT_TRAINER_OPS_AUTOGRAD_CAPSULE_H_
#define E3_STUDENT_TRAINER_OPS_AUTOGRAD_CAPSULE_H_

#include <memory>

#include "common/torch/torch_core.h"

namespace e3::ops {

template <typename T>
at::Tensor ToCapsule(std::shared_ptr<T> object) {
  auto* holder = new std::shared_ptr<T>(std::move(object));
  return torch::from_blob(
      holder, {1}, [holder](void*) { delete holder; }, torch::TensorOptions().dtype(at::kByte));
}

template <typename T>
std::shared_ptr<T> FromCapsule(const at::Tensor& capsule) {
  return *static_cast<std::shared_ptr<T>*>(capsule.data_ptr());
}

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_AUTOGRAD_CAPSULE_H_
