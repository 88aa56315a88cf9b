// Block-scaled FP8 weights as DeepSeek-V3/R1, Kimi-K2 and the Qwen3-FP8
// checkpoints ship them: `W.weight` in float8_e4m3fn [out, in] and
// `W.weight_scale_inv` in fp32 [ceil(out / b0), ceil(in / b1)], one scale
// per b0 x b1 block (config.json's quantization_config.weight_block_size),
// the last block of a row or column partial. Despite its name the scale
// multiplies: W = fp8 * scale_inv (DeepSeek-V3's weight_dequant, and
// transformers' FP8 dequantization).
//
// The teacher dequantizes at load to its compute dtype
// (docs/decisions/0040-fp8-checkpoints-dequantized-at-load.md). The bytes
// are decoded through a 256-entry table, so that LibTorch 1.13, which has
// no float8 type, reads them too.
#ifndef E3_TEACHER_SERVER_MODELS_FP8_WEIGHTS_H_
#define E3_TEACHER_SERVER_MODELS_FP8_WEIGHTS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/torch/torch_core.h"

namespace e3 {

// fp32 values of float8_e4m3fn codes (a uint8 tensor of any shape).
at::Tensor DecodeFp8E4M3(const at::Tensor& codes);

// Rows or columns [begin, begin + length) of dimension `dim` of the
// dequantized weight, in `dtype` on `device`: fp8 * scale in fp32, then one
// rounding to `dtype`. Errors name the file, the tensor and the shape or
// dtype expected.
absl::StatusOr<at::Tensor> DequantizeFp8Block(const TensorView& weight, const TensorView& scale,
                                              const QuantizationConfig& quantization, int64_t dim, int64_t begin,
                                              int64_t length, at::ScalarType dtype, const at::Device& device);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_FP8_WEIGHTS_H_
