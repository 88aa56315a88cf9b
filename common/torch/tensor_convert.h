// Conversions between on-disk/wire tensors (TensorView, DType) and
// at::Tensor.
#ifndef E3_COMMON_TORCH_TENSOR_CONVERT_H_
#define E3_COMMON_TORCH_TENSOR_CONVERT_H_

#include "absl/status/statusor.h"
#include "common/model/dtype.h"
#include "common/model/safetensors.h"
#include "common/torch/torch_core.h"

namespace e3 {

absl::StatusOr<at::ScalarType> ToScalarType(DType dtype);
absl::StatusOr<DType> FromScalarType(at::ScalarType type);
// A compute dtype flag ("bfloat16", "fp32", ...; see ParseComputeDType) as
// the LibTorch scalar type.
absl::StatusOr<at::ScalarType> ParseComputeScalarType(std::string_view name);

// A device flag ("cpu", "cuda", "cuda:N") as a device this process can
// use: a CUDA device needs a LibTorch built with CUDA and a visible GPU of
// that index. Errors name `flag`.
absl::StatusOr<at::Device> ParseUsableDevice(const std::string& name, const std::string& flag);

// Copies a view's bytes into a new tensor of `dtype` on `device`
// (bf16/fp16/fp32 on disk convert to the compute dtype).
absl::StatusOr<at::Tensor> ViewToTensor(const TensorView& view, at::ScalarType dtype,
                                        const at::Device& device = at::kCPU);

// The same for the slice [begin, begin + length) of dimension `dim` (a
// tensor-parallel shard): only the slice's bytes are converted and copied.
absl::StatusOr<at::Tensor> ViewSliceToTensor(const TensorView& view, int64_t dim, int64_t begin, int64_t length,
                                             at::ScalarType dtype, const at::Device& device = at::kCPU);

// Contiguous CPU copy of `tensor` as a TensorToWrite (for safetensors).
absl::StatusOr<TensorToWrite> TensorToWritable(const std::string& name, const at::Tensor& tensor);

}  // namespace e3

#endif  // E3_COMMON_TORCH_TENSOR_CONVERT_H_
