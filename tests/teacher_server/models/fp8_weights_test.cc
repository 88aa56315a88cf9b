// Block-scaled FP8 weights (teacher_server/models/fp8_weights.h) with the official
// checkpoints' 128 x 128 blocks: a 300 x 200 weight has 3 x 2 blocks, the
// last row and column of blocks partial. Dequantization must equal the
// definition (fp8 value times its block's scale) exactly, for the whole
// weight and for tensor-parallel slices of either dimension.
#include "teacher_server/models/fp8_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/model/dtype.h"
#include "common/model/safetensors.h"
#include "tests/e2e/subprocess.h"

namespace e3 {
namespace {

constexpr int64_t kOut = 300, kIn = 200;

class Fp8WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(7);
    codes_.resize(kOut * kIn);
    for (auto& c : codes_) {
      do {
        c = static_cast<uint8_t>(rng() & 0xff);
      } while ((c & 0x7f) == 0x7f);  // no NaN codes
    }
    scales_ = {0.5f, 2.0f, 0.001f, 3.0f, 1.0f / 448, 7.25f};  // [3, 2]
    std::vector<uint8_t> scale_bytes(scales_.size() * 4);
    std::memcpy(scale_bytes.data(), scales_.data(), scale_bytes.size());
    path_ = testing::ScratchDir("fp8_weights") + "/w.safetensors";
    ASSERT_TRUE(WriteSafetensors(path_, {{"w.weight", DType::kF8E4M3, {kOut, kIn}, codes_},
                                         {"w.weight_scale_inv", DType::kF32, {3, 2}, scale_bytes},
                                         {"bad.weight_scale_inv", DType::kF32, {2, 2}, std::vector<uint8_t>(16)}})
                    .ok());
    auto file = SafetensorsFile::Open(path_);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(file).value();
    quant_.fp8_block = true;
  }

  // The definition, element by element, in double.
  at::Tensor Expected() const {
    at::Tensor out = torch::empty({kOut, kIn}, at::kDouble);
    auto a = out.accessor<double, 2>();
    for (int64_t r = 0; r < kOut; ++r) {
      for (int64_t c = 0; c < kIn; ++c) {
        a[r][c] = static_cast<double>(Fp8E4M3ToFloat(codes_[r * kIn + c])) * scales_[(r / 128) * 2 + c / 128];
      }
    }
    return out;
  }

  std::vector<uint8_t> codes_;
  std::vector<float> scales_;
  std::string path_;
  std::unique_ptr<SafetensorsFile> file_;
  QuantizationConfig quant_;
};

TEST_F(Fp8WeightsTest, DequantizesWholeAndSlicedExactly) {
  const TensorView w = *file_->Get("w.weight"), s = *file_->Get("w.weight_scale_inv");
  EXPECT_EQ(w.dtype, DType::kF8E4M3);
  const at::Tensor want = Expected();
  auto whole = DequantizeFp8Block(w, s, quant_, 0, 0, kOut, at::kFloat, at::kCPU);
  ASSERT_TRUE(whole.ok()) << whole.status();
  // One fp32 rounding of the exact product (4 + 24 significant bits fit a
  // double exactly).
  EXPECT_TRUE(whole->equal(want.to(at::kFloat)));
  auto rows = DequantizeFp8Block(w, s, quant_, 0, 100, 160, at::kFloat, at::kCPU);  // crosses a block edge
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(rows->equal(whole->narrow(0, 100, 160)));
  auto cols = DequantizeFp8Block(w, s, quant_, 1, 120, 80, at::kFloat, at::kCPU);  // into the partial block
  ASSERT_TRUE(cols.ok()) << cols.status();
  EXPECT_TRUE(cols->equal(whole->narrow(1, 120, 80)));
  auto bf16 = DequantizeFp8Block(w, s, quant_, 0, 0, kOut, at::kBFloat16, at::kCPU);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->scalar_type(), at::kBFloat16);
  EXPECT_TRUE(bf16->equal(whole->to(at::kBFloat16)));  // one rounding, from the fp32 product
}

TEST_F(Fp8WeightsTest, DecodesEveryCodeAsTheScalarConverter) {
  const at::Tensor codes = torch::arange(256, at::kInt).to(at::kByte);
  const at::Tensor values = DecodeFp8E4M3(codes);
  for (int code = 0; code < 256; ++code) {
    const float want = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    const float got = values[code].item<float>();
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << code;
    } else {
      EXPECT_EQ(got, want) << code;
    }
  }
}

TEST_F(Fp8WeightsTest, ErrorsNameTheTensorAndTheExpectedShape) {
  const TensorView w = *file_->Get("w.weight"), s = *file_->Get("w.weight_scale_inv");
  auto wrong = DequantizeFp8Block(w, *file_->Get("bad.weight_scale_inv"), quant_, 0, 0, kOut, at::kFloat, at::kCPU);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("bad.weight_scale_inv"), std::string::npos) << wrong.status();
  EXPECT_NE(wrong.status().message().find("expected F32 [3, 2]"), std::string::npos) << wrong.status();
  EXPECT_NE(wrong.status().message().find(path_), std::string::npos) << wrong.status();
  QuantizationConfig none;
  auto unconfigured = DequantizeFp8Block(w, s, none, 0, 0, kOut, at::kFloat, at::kCPU);
  ASSERT_FALSE(unconfigured.ok());
  EXPECT_NE(unconfigured.status().message().find("quantization_config"), std::string::npos) << unconfigured.status();
  QuantizationConfig other = quant_;
  other.block_rows = 64;  // the scales would then be [5, 2]
  EXPECT_FALSE(DequantizeFp8Block(w, s, other, 0, 0, kOut, at::kFloat, at::kCPU).ok());
  EXPECT_FALSE(DequantizeFp8Block(w, s, quant_, 1, 150, 60, at::kFloat, at::kCPU).ok());  // past the end
}

}  // namespace
}  // namespace e3
