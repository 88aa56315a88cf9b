// Loads named weights from a ModelDir into tensors of the compute dtype,
// checking each shape against what the config implies. Block-scaled FP8
// weights (fp8_weights.h) are dequantized on the way.
#ifndef E3_TEACHER_SERVER_MODELS_WEIGHT_LOADER_H_
#define E3_TEACHER_SERVER_MODELS_WEIGHT_LOADER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_dir.h"
#include "common/torch/torch_core.h"

namespace e3 {

class WeightLoader {
 public:
  WeightLoader(const ModelDir& dir, at::ScalarType dtype, at::Device device,
               std::function<void(int64_t, int64_t)> on_progress = nullptr, int64_t expected_total = 0)
      : dir_(dir), dtype_(dtype), device_(device), on_progress_(std::move(on_progress)),
        expected_total_(expected_total) {}

  // Required tensor with an exact shape.
  absl::StatusOr<at::Tensor> Load(const std::string& name, const std::vector<int64_t>& shape);
  // Optional tensor: undefined when absent, shape-checked when present.
  absl::StatusOr<at::Tensor> LoadOptional(const std::string& name, const std::vector<int64_t>& shape);

  // Rows or columns [begin, begin + length) of dimension `dim` of a tensor
  // whose full shape is `shape` (a tensor-parallel shard).
  absl::StatusOr<at::Tensor> LoadSlice(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                       int64_t begin, int64_t length);

  // As Load and LoadSlice, into `dtype` instead of the loader's (GPT-OSS's
  // fp32 norms). With kByte the stored tensor must be uint8 (MXFP4 blocks
  // and scales), which is then loaded as stored.
  absl::StatusOr<at::Tensor> LoadAs(const std::string& name, const std::vector<int64_t>& shape, at::ScalarType dtype);
  absl::StatusOr<at::Tensor> LoadSliceAs(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                         int64_t begin, int64_t length, at::ScalarType dtype);

  int64_t loaded() const { return loaded_; }

 private:
  // The slice [begin, begin + length) of `dim` of `view` in `dtype`
  // (dequantized first when it is block-scaled FP8), counted as loaded.
  absl::StatusOr<at::Tensor> Convert(const TensorView& view, int64_t dim, int64_t begin, int64_t length,
                                     at::ScalarType dtype);

  const ModelDir& dir_;
  at::ScalarType dtype_;
  at::Device device_;
  std::function<void(int64_t, int64_t)> on_progress_;
  int64_t expected_total_;
  int64_t loaded_ = 0;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_WEIGHT_LOADER_H_
