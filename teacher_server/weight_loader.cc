#include "teacher_server/weight_loader.h"

#include "common/status_macros.h"
#include "common/torch/tensor_convert.h"

namespace e3 {

absl::StatusOr<at::Tensor> WeightLoader::Load(const std::string& name, const std::vector<int64_t>& shape) {
  E3_ASSIGN_OR_RETURN(TensorView view, dir_.Get(name, shape));
  E3_ASSIGN_OR_RETURN(at::Tensor t, ViewToTensor(view, dtype_, device_));
  ++loaded_;
  if (on_progress_) on_progress_(loaded_, expected_total_);
  return t;
}

absl::StatusOr<at::Tensor> WeightLoader::LoadSlice(const std::string& name, const std::vector<int64_t>& shape,
                                                   int64_t dim, int64_t begin, int64_t length) {
  E3_ASSIGN_OR_RETURN(TensorView view, dir_.Get(name, shape));
  E3_ASSIGN_OR_RETURN(at::Tensor t, ViewSliceToTensor(view, dim, begin, length, dtype_, device_));
  ++loaded_;
  if (on_progress_) on_progress_(loaded_, expected_total_);
  return t;
}

absl::StatusOr<at::Tensor> WeightLoader::LoadOptional(const std::string& name, const std::vector<int64_t>& shape) {
  if (!dir_.Contains(name)) return at::Tensor();
  return Load(name, shape);
}

}  // namespace e3
