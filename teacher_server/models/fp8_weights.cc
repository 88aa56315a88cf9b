#include "teacher_server/models/fp8_weights.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/dtype.h"
#include "common/model/model_dir.h"
#include "common/torch/tensor_convert.h"

namespace e3 {
namespace {

at::Tensor Fp8Table() {
  std::vector<float> values(256);
  for (int code = 0; code < 256; ++code) values[code] = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
  return torch::tensor(values, at::kFloat);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Each index in [begin, begin + length) of a weight dimension mapped to its
// block's index in the scale tensor.
at::Tensor BlockOf(int64_t begin, int64_t length, int64_t block, const at::Device& device) {
  return torch::arange(begin, begin + length, torch::TensorOptions().dtype(at::kLong).device(device))
      .div(block, "floor");
}

}  // namespace

at::Tensor DecodeFp8E4M3(const at::Tensor& codes) {
  static const at::Tensor table = Fp8Table();
  return table.to(codes.device()).index_select(0, codes.flatten().to(at::kLong)).view(codes.sizes());
}

absl::StatusOr<at::Tensor> DequantizeFp8Block(const TensorView& weight, const TensorView& scale,
                                              const QuantizationConfig& quantization, int64_t dim, int64_t begin,
                                              int64_t length, at::ScalarType dtype, const at::Device& device) {
  const std::string where = absl::StrCat(weight.file, ": tensor \"", weight.name, "\"");
  if (weight.dtype != DType::kF8E4M3 || weight.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a 2-D F8_E4M3 weight, got ",
                                                   std::string(DTypeName(weight.dtype)), " ", ShapeString(weight.shape)));
  }
  if (!quantization.fp8_block) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is F8_E4M3, but config.json has no quantization_config "
                                                   "{\"quant_method\": \"fp8\", \"weight_block_size\": [..]}"));
  }
  const int64_t out = weight.shape[0], in = weight.shape[1];
  const int64_t b0 = quantization.block_rows, b1 = quantization.block_cols;
  const std::vector<int64_t> want = {CeilDiv(out, b0), CeilDiv(in, b1)};
  if (scale.shape != want || (scale.dtype != DType::kF32 && scale.dtype != DType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        scale.file, ": tensor \"", scale.name, "\": expected F32 ", ShapeString(want), " (one scale per ", b0, "x",
        b1, " block of ", ShapeString(weight.shape), "), got ", std::string(DTypeName(scale.dtype)), " ",
        ShapeString(scale.shape)));
  }
  if (dim < 0 || dim > 1 || begin < 0 || length < 0 || begin + length > weight.shape[dim]) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": slice [", begin, ", ", begin + length,
                                                   ") of dimension ", dim, " is out of range"));
  }
  E3_ASSIGN_OR_RETURN(at::Tensor scales, ViewToTensor(scale, at::kFloat, device));
  try {
    at::Tensor codes = torch::from_blob(const_cast<uint8_t*>(weight.data), weight.shape,
                                        torch::TensorOptions().dtype(at::kByte));
    codes = codes.narrow(dim, begin, length).to(device, /*non_blocking=*/false, /*copy=*/true);
    const int64_t r0 = dim == 0 ? begin : 0, rows = dim == 0 ? length : out;
    const int64_t c0 = dim == 1 ? begin : 0, cols = dim == 1 ? length : in;
    scales = scales.index_select(0, BlockOf(r0, rows, b0, device)).index_select(1, BlockOf(c0, cols, b1, device));
    return (DecodeFp8E4M3(codes) * scales).to(dtype).contiguous();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(where, ": FP8 dequantization failed: ", e.what_without_backtrace()));
  }
}

}  // namespace e3
