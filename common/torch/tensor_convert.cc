#include "common/torch/tensor_convert.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace e3 {

absl::StatusOr<at::Device> ParseUsableDevice(const std::string& name, const std::string& flag) {
  at::Device device(at::kCPU);
  try {
    device = at::Device(name);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", name, ": expected cpu or cuda:N (", e.what_without_backtrace(), ")"));
  }
  if (!device.is_cuda()) return device;
  // Asked before any tensor goes there: LibTorch without CUDA throws from
  // deep inside the first copy instead.
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, "=", name, ": this build's LibTorch has no CUDA, or no GPU is visible; use ", flag, "=cpu"));
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (device.has_index() && device.index() >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", name, ": only ", count, " GPU(s) are visible (cuda:0 to cuda:", count - 1, ")"));
  }
  return device;
}

absl::StatusOr<at::ScalarType> ParseComputeScalarType(std::string_view name) {
  auto dtype = ParseComputeDType(name);
  if (!dtype.ok()) return dtype.status();
  return ToScalarType(*dtype);
}

absl::StatusOr<at::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return at::kFloat;
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kF64: return at::kDouble;
    case DType::kI64: return at::kLong;
    case DType::kI32: return at::kInt;
    case DType::kI16: return at::kShort;
    case DType::kI8: return at::kChar;
    case DType::kU8: return at::kByte;
    case DType::kBool: return at::kBool;
    case DType::kF8E4M3:
      // LibTorch 1.13 has no float8 type, and an FP8 weight means nothing
      // without its block scales: teacher_server/models/fp8_weights.h decodes it.
      return absl::InvalidArgumentError("F8_E4M3 tensors are decoded with their block scales (fp8_weights.h)");
  }
  return absl::InvalidArgumentError("unknown DType");
}

absl::StatusOr<DType> FromScalarType(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::kF32;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kDouble: return DType::kF64;
    case at::kLong: return DType::kI64;
    case at::kInt: return DType::kI32;
    case at::kShort: return DType::kI16;
    case at::kChar: return DType::kI8;
    case at::kByte: return DType::kU8;
    case at::kBool: return DType::kBool;
    default:
      return absl::InvalidArgumentError(absl::StrCat("no wire dtype for ", c10::toString(type)));
  }
}

absl::StatusOr<at::Tensor> ViewToTensor(const TensorView& view, at::ScalarType dtype,
                                        const at::Device& device) {
  return ViewSliceToTensor(view, 0, 0, view.shape.empty() ? 0 : view.shape[0], dtype, device);
}

absl::StatusOr<at::Tensor> ViewSliceToTensor(const TensorView& view, int64_t dim, int64_t begin, int64_t length,
                                             at::ScalarType dtype, const at::Device& device) {
  auto src_type = ToScalarType(view.dtype);
  if (!src_type.ok()) return src_type.status();
  const int64_t rank = static_cast<int64_t>(view.shape.size());
  if (rank > 0 && (dim < 0 || dim >= rank || begin < 0 || length < 0 || begin + length > view.shape[dim])) {
    return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor \"", view.name, "\": slice [", begin, ", ",
                                                   begin + length, ") of dimension ", dim, " is out of range"));
  }
  try {
    // from_blob does not own the mmap'd bytes; the conversion below copies.
    at::Tensor src = torch::from_blob(const_cast<uint8_t*>(view.data), view.shape,
                                      torch::TensorOptions().dtype(*src_type));
    if (rank > 0 && length != view.shape[dim]) src = src.narrow(dim, begin, length);
    return src.to(device, dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(view.file, ": tensor \"", view.name,
                                            "\": conversion failed: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<TensorToWrite> TensorToWritable(const std::string& name, const at::Tensor& tensor) {
  auto dtype = FromScalarType(tensor.scalar_type());
  if (!dtype.ok()) return dtype.status();
  at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
  TensorToWrite out;
  out.name = name;
  out.dtype = *dtype;
  out.shape.assign(cpu.sizes().begin(), cpu.sizes().end());
  out.data.resize(cpu.numel() * cpu.element_size());
  if (!out.data.empty()) std::memcpy(out.data.data(), cpu.data_ptr(), out.data.size());
  return out;
}

}  // namespace e3
