// The aux layers' outputs (ForwardOptions::aux_layer_ids), collected as a
// forward passes them: the student's fc input is their concatenation in
// id order (DESIGN.md, "Data flow", step 2). Every architecture's forward
// fills one; a tensor-parallel micro-batch keeps its own.
#ifndef E3_TEACHER_SERVER_MODELS_AUX_CAPTURE_H_
#define E3_TEACHER_SERVER_MODELS_AUX_CAPTURE_H_

#include <cstdint>
#include <vector>

#include "common/torch/torch_core.h"

namespace e3 {

class AuxCapture {
 public:
  // `ids` must outlive the capture (it is the forward's options' list).
  explicit AuxCapture(const std::vector<int32_t>& ids) : ids_(ids), states_(ids.size()) {}

  // Keeps layer `layer`'s output h when `layer` is an aux id (once per
  // place it holds in the list, so repeated ids repeat the state).
  void Capture(int64_t layer, const at::Tensor& h);
  // [T, k * H] in id order, or undefined when no aux layer was asked for.
  at::Tensor Concatenated() const;

 private:
  const std::vector<int32_t>& ids_;
  std::vector<at::Tensor> states_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_AUX_CAPTURE_H_
