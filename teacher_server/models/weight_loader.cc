#include "teacher_server/models/weight_loader.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "teacher_server/models/fp8_weights.h"

namespace e3 {

namespace {

// Raw bytes are loaded only from raw bytes: a float tensor cast to uint8
// would be garbage, not an error.
absl::Status CheckRaw(const TensorView& view, at::ScalarType dtype) {
  if (dtype != at::kByte || view.dtype == DType::kU8) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor \"", view.name, "\": expected dtype U8"));
}

}  // namespace

absl::StatusOr<at::Tensor> WeightLoader::Convert(const TensorView& view, int64_t dim, int64_t begin,
                                                 int64_t length, at::ScalarType dtype) {
  E3_RETURN_IF_ERROR(CheckRaw(view, dtype));
  at::Tensor t;
  if (view.dtype == DType::kF8E4M3) {
    // A block-scaled FP8 weight: its scales sit beside it.
    if (!absl::EndsWith(view.name, ".weight")) {
      return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor \"", view.name,
                                                     "\" is F8_E4M3 but not a \".weight\" with block scales"));
    }
    E3_ASSIGN_OR_RETURN(TensorView scale, dir_.Get(view.name + "_scale_inv"));
    E3_ASSIGN_OR_RETURN(t, DequantizeFp8Block(view, scale, dir_.config().quantization, dim, begin, length, dtype,
                                              device_));
  } else {
    E3_ASSIGN_OR_RETURN(t, ViewSliceToTensor(view, dim, begin, length, dtype, device_));
  }
  ++loaded_;
  if (on_progress_) on_progress_(loaded_, expected_total_);
  return t;
}

absl::StatusOr<at::Tensor> WeightLoader::Load(const std::string& name, const std::vector<int64_t>& shape) {
  return LoadAs(name, shape, dtype_);
}

absl::StatusOr<at::Tensor> WeightLoader::LoadSlice(const std::string& name, const std::vector<int64_t>& shape,
                                                   int64_t dim, int64_t begin, int64_t length) {
  return LoadSliceAs(name, shape, dim, begin, length, dtype_);
}

absl::StatusOr<at::Tensor> WeightLoader::LoadAs(const std::string& name, const std::vector<int64_t>& shape,
                                                at::ScalarType dtype) {
  E3_ASSIGN_OR_RETURN(TensorView view, dir_.Get(name, shape));
  return Convert(view, 0, 0, view.shape.empty() ? 0 : view.shape[0], dtype);
}

absl::StatusOr<at::Tensor> WeightLoader::LoadSliceAs(const std::string& name, const std::vector<int64_t>& shape,
                                                     int64_t dim, int64_t begin, int64_t length,
                                                     at::ScalarType dtype) {
  E3_ASSIGN_OR_RETURN(TensorView view, dir_.Get(name, shape));
  return Convert(view, dim, begin, length, dtype);
}

absl::StatusOr<at::Tensor> WeightLoader::LoadOptional(const std::string& name, const std::vector<int64_t>& shape) {
  if (!dir_.Contains(name)) return at::Tensor();
  return Load(name, shape);
}

}  // namespace e3
