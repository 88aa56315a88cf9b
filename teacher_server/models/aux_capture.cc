#include "teacher_server/models/aux_capture.h"

namespace e3 {

void AuxCapture::Capture(int64_t layer, const at::Tensor& h) {
  for (size_t k = 0; k < ids_.size(); ++k) {
    if (ids_[k] == layer) states_[k] = h;
  }
}

at::Tensor AuxCapture::Concatenated() const { return states_.empty() ? at::Tensor() : torch::cat(states_, -1); }

bool EveryAuxLayer(const std::vector<int64_t>& positions, int64_t num_layers) {
  if (static_cast<int64_t>(positions.size()) != num_layers) return false;
  for (size_t k = 0; k < positions.size(); ++k) {
    if (positions[k] != static_cast<int64_t>(k)) return false;
  }
  return true;
}

at::Tensor SelectAuxStates(const at::Tensor& aux, int64_t num_layers, const std::vector<int64_t>& positions) {
  if (EveryAuxLayer(positions, num_layers) || num_layers <= 0) return aux;
  const int64_t T = aux.size(0);
  const int64_t H = aux.size(1) / num_layers;
  const int64_t k = static_cast<int64_t>(positions.size());
  if (k == 0) return aux.new_empty({T, 0});
  const at::Tensor index = torch::tensor(positions, torch::TensorOptions().dtype(at::kLong)).to(aux.device());
  return aux.reshape({T, num_layers, H}).index_select(1, index).reshape({T, k * H});
}

}  // namespace e3
