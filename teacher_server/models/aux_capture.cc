#include "teacher_server/models/aux_capture.h"

namespace e3 {

void AuxCapture::Capture(int64_t layer, const at::Tensor& h) {
  for (size_t k = 0; k < ids_.size(); ++k) {
    if (ids_[k] == layer) states_[k] = h;
  }
}

at::Tensor AuxCapture::Concatenated() const { return states_.empty() ? at::Tensor() : torch::cat(states_, -1); }

}  // namespace e3
