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

// True when `positions` are all `num_layers` captured layers in order.
bool EveryAuxLayer(const std::vector<int64_t>& positions, int64_t num_layers);

// The states of the layers at `positions` (indices into the `num_layers`
// layers that `aux` [T, num_layers * H] concatenates), concatenated in
// that order: what one subscriber asked for out of what was captured
// (common/stream/feature_request.h). One gather on aux's device, or `aux`
// itself when `positions` are every layer in order.
at::Tensor SelectAuxStates(const at::Tensor& aux, int64_t num_layers, const std::vector<int64_t>& positions);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_AUX_CAPTURE_H_
