#include "teacher_server/layers/mxfp4.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace e3 {
namespace {

// The e2m1 code table: codes 0-7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6; codes
// 8-15 the same magnitudes negated (the top bit is the sign).
at::Tensor E2m1Table(const at::Device& device) {
  return torch::tensor({0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f},
                       torch::TensorOptions().dtype(at::kFloat).device(device));
}

// 2^(s - 127) for each E8M0 byte s as fp32, built from its bits so that it
// is exact: s in [1, 254] is a normal float with biased exponent s; s = 0
// is the subnormal 2^-127 (mantissa bit 22); s = 255 is NaN.
at::Tensor E8m0ToFloat(const at::Tensor& scales) {
  const at::Tensor s = scales.to(at::kInt);
  at::Tensor bits = s.bitwise_left_shift(23);
  bits = at::where(s == 0, at::full({}, 1 << 22, bits.options()), bits);
  bits = at::where(s == 255, at::full({}, 0x7fc00000, bits.options()), bits);
  return bits.view(at::kFloat);
}

std::string Shape(const at::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"); }

}  // namespace

absl::StatusOr<at::Tensor> DequantizeMxfp4(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType dtype,
                                           const std::string& what) {
  if (blocks.scalar_type() != at::kByte || scales.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": MXFP4 blocks and scales must be uint8"));
  }
  const int64_t d = blocks.dim();
  if (d < 2 || blocks.size(-1) != kMxfp4BlockBytes || scales.dim() != d - 1 ||
      scales.sizes() != blocks.sizes().slice(0, d - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": MXFP4 blocks ", Shape(blocks), " and scales ",
                                                   Shape(scales), " do not pair; expected blocks [..., ",
                                                   kMxfp4BlockBytes, "] and scales of blocks' leading dimensions"));
  }
  const at::Tensor table = E2m1Table(blocks.device());
  const at::Tensor codes = blocks.to(at::kLong);
  // [..., G, 16, 2]: low nibble (element 2j) before high nibble (2j + 1).
  const at::Tensor low = table.index({codes.bitwise_and(0x0F)});
  const at::Tensor high = table.index({codes.bitwise_right_shift(4)});
  const at::Tensor values = torch::stack({low, high}, -1);
  at::Tensor out = values.flatten(-2) * E8m0ToFloat(scales).unsqueeze(-1);
  std::vector<int64_t> shape(scales.sizes().begin(), scales.sizes().end());
  shape.back() *= kMxfp4BlockSize;
  return out.reshape(shape).to(dtype);
}

}  // namespace e3
