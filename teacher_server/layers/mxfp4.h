// MXFP4 weights (OCP Microscaling FP4) as GPT-OSS's checkpoints ship its
// experts: each block of 32 consecutive inputs of an output row holds 32
// e2m1 codes (sign, 2-bit exponent, 1-bit mantissa: 0, 0.5, 1, 1.5, 2, 3,
// 4, 6 and their negatives), two codes a byte, and one shared E8M0 scale
// byte s meaning 2^(s - 127).
//
// Layout, as transformers' integrations/mxfp4.py convert_moe_packed_tensors
// reads it: blocks [..., rows, in / 32, 16] uint8 and scales [..., rows,
// in / 32] uint8; byte j of a block holds element 2j in its low nibble and
// element 2j + 1 in its high nibble. The dequantized [..., rows, in] is the
// nn.Linear layout ([out, in]); transformers transposes it to its own
// [in, out] afterwards.
#ifndef E3_TEACHER_SERVER_LAYERS_MXFP4_H_
#define E3_TEACHER_SERVER_LAYERS_MXFP4_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"

namespace e3 {

// Values per block, and packed bytes per block.
inline constexpr int64_t kMxfp4BlockSize = 32;
inline constexpr int64_t kMxfp4BlockBytes = kMxfp4BlockSize / 2;

// [..., rows, in] in `dtype` on blocks' device. Every e2m1 value times a
// power of two in fp32's range is exact in fp32 and bf16 (at most two
// significant bits, the same exponent range), so those dtypes dequantize
// exactly; a scale byte of 255 (E8M0's NaN) gives NaN. `what` names the
// tensors in errors (shapes that do not pair, wrong dtypes).
absl::StatusOr<at::Tensor> DequantizeMxfp4(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType dtype,
                                           const std::string& what);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_MXFP4_H_
