// The student's GetWeights assembly: honest chunks make whole tensors;
// a teacher whose chunks disagree with its own model dims, overrun a
// tensor, skip or repeat bytes, or pass the total cap is refused before
// anything is allocated for it. tests/student_trainer/feed/teacher_client_test.cc
// shows the client applies it to a real stream.
#include "proto/weight_download.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace e3 {
namespace {

using ::testing::HasSubstr;

v1::ModelInfo Model(int64_t V = 16, int64_t N = 4, int32_t H = 8) {
  v1::ModelInfo m;
  m.set_vocab_size(V);
  m.set_draft_vocab_size(N);
  m.set_hidden_size(H);
  return m;
}

v1::WeightChunk Chunk(const std::string& name, std::vector<int64_t> shape, v1::DType dtype,
                      uint64_t total, uint64_t offset, size_t n) {
  v1::WeightChunk c;
  c.mutable_tensor()->set_name(name);
  for (int64_t d : shape) c.mutable_tensor()->add_shape(d);
  c.mutable_tensor()->set_dtype(dtype);
  std::string data(n, '\0');
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>((offset + i) & 0xff);
  c.mutable_tensor()->set_inline_data(data);
  c.set_offset(offset);
  c.set_total_bytes(total);
  return c;
}

WeightDownload Download(uint64_t cap = 1 << 20) {
  return WeightDownload(ExpectedWeightsOf(Model()).value(), cap, "GetWeights from t:1");
}

TEST(WeightDownloadTest, ExpectedShapesFollowTheModelDims) {
  auto w = ExpectedWeightsOf(Model(16, 4, 8));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->at("embed_tokens").shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(w->at("target_head").shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(w->at("target_head_rest").shape, (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(w->at("d2t").shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(w->at("t2d").shape, (std::vector<int64_t>{16}));
  auto bad = ExpectedWeightsOf(Model(4, 16, 8));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("draft_vocab_size <= vocab_size"));
  EXPECT_FALSE(ExpectedWeightsOf(Model(16, 4, 0)).ok());
  EXPECT_FALSE(ExpectedWeightsOf(Model(-1, 4, 8)).ok());
}

TEST(WeightDownloadTest, AssemblesChunksInOrder) {
  WeightDownload d = Download();
  const uint64_t total = 16 * 8 * 4;
  ASSERT_TRUE(d.Add(Chunk("embed_tokens", {16, 8}, v1::DTYPE_F32, total, 0, 300)).ok());
  EXPECT_FALSE(d.Get("embed_tokens").ok());  // incomplete
  ASSERT_TRUE(d.Add(Chunk("embed_tokens", {16, 8}, v1::DTYPE_F32, total, 300, total - 300)).ok());
  auto t = d.Get("embed_tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nbytes, total);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{16, 8}));
  for (size_t i = 0; i < total; ++i) ASSERT_EQ(t->data[i], static_cast<uint8_t>(i & 0xff)) << i;
  ASSERT_TRUE(d.Add(Chunk("t2d", {16}, v1::DTYPE_BOOL, 16, 0, 16)).ok());
  EXPECT_TRUE(d.Get("t2d").ok());
  EXPECT_EQ(d.total_bytes(), total + 16);
  auto missing = d.Get("d2t");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("GetWeights from t:1: no complete weight \"d2t\""));
}

TEST(WeightDownloadTest, RefusesWhatTheModelDimsDoNotAllow) {
  const struct {
    v1::WeightChunk chunk;
    const char* message;
  } cases[] = {
      {Chunk("lm_head", {16, 8}, v1::DTYPE_F32, 512, 0, 8),
       "\"lm_head\": not a weight this student uses"},
      {Chunk("embed_tokens", {1000000, 8}, v1::DTYPE_F32, 32000000, 0, 8),
       "tensor.shape is [1000000, 8]; the model's dims need [16, 8]"},
      {Chunk("embed_tokens", {16, 8}, v1::DTYPE_I64, 1024, 0, 8),
       "tensor.dtype is DTYPE_I64; not expected here"},
      {Chunk("d2t", {4}, v1::DTYPE_F32, 16, 0, 8), "tensor.dtype is DTYPE_F32"},
      {Chunk("embed_tokens", {16, 8}, v1::DTYPE_F32, uint64_t{1} << 62, 0, 8),
       "total_bytes is 4611686018427387904; shape and dtype need 512"},
      {Chunk("embed_tokens", {16, 8}, v1::DTYPE_F32, 512, 8, 8),
       "offset is 8; expected 0 (chunks come in order)"},
      {Chunk("embed_tokens", {16, 8}, v1::DTYPE_F32, 512, 0, 600),
       "600 bytes at offset 0 run past total_bytes 512"},
  };
  for (const auto& c : cases) {
    WeightDownload d = Download();
    absl::Status s = d.Add(c.chunk);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
    EXPECT_EQ(d.total_bytes(), 0u) << "allocated for a refused chunk";
  }
}

TEST(WeightDownloadTest, LaterChunksMustMatchTheFirst) {
  WeightDownload d = Download();
  ASSERT_TRUE(d.Add(Chunk("target_head", {4, 8}, v1::DTYPE_BF16, 64, 0, 32)).ok());
  absl::Status repeat = d.Add(Chunk("target_head", {4, 8}, v1::DTYPE_BF16, 64, 0, 32));
  EXPECT_THAT(repeat.message(), HasSubstr("offset is 0; expected 32"));
  absl::Status other_size = d.Add(Chunk("target_head", {4, 8}, v1::DTYPE_BF16, 128, 32, 32));
  EXPECT_THAT(other_size.message(), HasSubstr("differ from the tensor's first chunk"));
  ASSERT_TRUE(d.Add(Chunk("target_head", {4, 8}, v1::DTYPE_BF16, 64, 32, 32)).ok());
  EXPECT_TRUE(d.Get("target_head").ok());
  absl::Status past = d.Add(Chunk("target_head", {4, 8}, v1::DTYPE_BF16, 64, 64, 1));
  EXPECT_THAT(past.message(), HasSubstr("1 bytes at offset 64 run past total_bytes 64"));
}

TEST(WeightDownloadTest, TheTotalIsCapped) {
  // 512 + 128 bytes fit a cap of 600 only in part.
  WeightDownload d = Download(600);
  ASSERT_TRUE(d.Add(Chunk("embed_tokens", {16, 8}, v1::DTYPE_F32, 512, 0, 512)).ok());
  absl::Status s = d.Add(Chunk("target_head", {4, 8}, v1::DTYPE_F32, 128, 0, 128));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      s.message(),
      HasSubstr("weight \"target_head\" needs 128 bytes, which with the 512 already received "
                "exceeds the cap of 600 (--max_weights_bytes)"));
  EXPECT_EQ(d.total_bytes(), 512u);
}

TEST(WeightDownloadTest, AnEmptyTensorIsOneEmptyChunk) {
  WeightDownload d(ExpectedWeightsOf(Model(4, 4, 8)).value(), 1 << 20, "t");
  ASSERT_TRUE(d.Add(Chunk("target_head_rest", {0, 8}, v1::DTYPE_F32, 0, 0, 0)).ok());
  auto t = d.Get("target_head_rest");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nbytes, 0u);
}

}  // namespace
}  // namespace e3
