// The safetensors reader must turn every kind of damage into an error that
// names the file (and the tensor, where there is one), never a crash. Runs
// under ASan+UBSan in CI.
#include "common/model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

std::string TempPath(const std::string& name) {
  return testing::ScratchPath("st_" + name);
}

std::vector<uint8_t> Floats(std::initializer_list<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string ReadRaw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A file with the given header JSON followed by `data_bytes` zero bytes.
std::string WithHeader(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  const std::string path = TempPath("ok.safetensors");
  std::vector<TensorToWrite> tensors = {
      {"b", DType::kF32, {2, 2}, Floats({1, 2, 3, 4})},
      {"a", DType::kI64, {1}, std::vector<uint8_t>(8, 0)},
      {"empty", DType::kBF16, {0, 3}, {}},
  };
  tensors[1].data[0] = 7;
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Names(), (std::vector<std::string>{"a", "b", "empty"}));
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  auto b = (*file)->Get("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, DType::kF32);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 2}));
  float v[4];
  std::memcpy(v, b->data, 16);
  EXPECT_EQ(v[3], 4.0f);
  EXPECT_EQ((*file)->Get("a")->data[0], 7);
  EXPECT_EQ((*file)->Get("empty")->nbytes, 0u);
  // The data section starts 8-byte aligned, as the reference writer does.
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*file)->Get("a")->data) % 8, 0u);
}

TEST(SafetensorsTest, MissingTensorNamesFileAndTensor) {
  const std::string path = TempPath("missing.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kF32, {1}, Floats({1})}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto got = (*file)->Get("model.norm.weight");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find(path), std::string::npos);
  EXPECT_NE(got.status().message().find("model.norm.weight"), std::string::npos);
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  auto file = SafetensorsFile::Open(TempPath("does_not_exist.safetensors"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, WriterRejectsWrongByteCount) {
  auto st = WriteSafetensors(TempPath("bad.safetensors"), {{"x", DType::kF32, {3}, Floats({1, 2})}});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("\"x\""), std::string::npos);
}

struct CorruptCase {
  const char* name;
  std::string bytes;
  const char* expect;  // a fragment the message must contain
};

TEST(SafetensorsTest, CorruptHeadersAreErrorsNamingTheProblem) {
  const std::string good = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<CorruptCase> cases = {
      {"empty_file", "", "shorter than the 8-byte header length"},
      {"short_file", std::string(5, '\1'), "shorter than the 8-byte header length"},
      {"huge_header_len", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds"},
      {"header_past_eof", WithHeader(good, 8).substr(0, 20), "runs past the end"},
      {"not_json", WithHeader("{not json", 0), "not a JSON object"},
      {"json_array", WithHeader("[1,2]", 0), "not a JSON object"},
      {"entry_not_object", WithHeader(R"({"w":3})", 0), "\"w\": entry is not an object"},
      {"missing_dtype", WithHeader(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8), "\"dtype\""},
      {"unknown_dtype", WithHeader(R"({"w":{"dtype":"F8_Q","shape":[2],"data_offsets":[0,8]}})", 8),
       "unsupported dtype \"F8_Q\""},
      {"negative_dim", WithHeader(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "non-negative integer"},
      {"float_dim", WithHeader(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
       "non-negative integer"},
      {"offsets_reversed", WithHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
       "reversed"},
      {"offsets_one_value", WithHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
       "two non-negative integers"},
      {"offsets_negative", WithHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8),
       "two non-negative integers"},
      {"offsets_lie_past_end", WithHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
       "past the 4-byte data section"},
      {"size_mismatch", WithHeader(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "need 12 bytes but data_offsets span 8"},
      {"shape_overflow",
       WithHeader(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8),
       "overflow"},
      {"metadata_not_strings", WithHeader(R"({"__metadata__":{"a":1}})", 0), "__metadata__.a"},
  };
  for (const auto& c : cases) {
    const std::string path = TempPath(c.name);
    WriteRaw(path, c.bytes);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << c.name;
    EXPECT_NE(file.status().message().find(path), std::string::npos) << c.name << ": " << file.status();
    EXPECT_NE(file.status().message().find(c.expect), std::string::npos) << c.name << ": " << file.status();
  }
}

TEST(SafetensorsTest, EveryTruncationOfARealFileIsAnError) {
  const std::string path = TempPath("trunc_src.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kF32, {4}, Floats({1, 2, 3, 4})},
                                      {"b", DType::kF16, {3}, std::vector<uint8_t>(6, 1)}})
                  .ok());
  const std::string whole = ReadRaw(path);
  for (size_t cut = 0; cut < whole.size(); ++cut) {
    const std::string p = TempPath("trunc");
    WriteRaw(p, whole.substr(0, cut));
    auto file = SafetensorsFile::Open(p);
    EXPECT_FALSE(file.ok()) << "a file cut to " << cut << " of " << whole.size() << " bytes was accepted";
  }
}

// Random damage to a valid header: whatever comes back must be a status,
// and any file that still opens must only hand out in-bounds views.
TEST(SafetensorsTest, RandomHeaderDamageNeverCrashes) {
  const std::string path = TempPath("fuzz_src.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kF32, {4}, Floats({1, 2, 3, 4})},
                                      {"bb", DType::kBF16, {2, 3}, std::vector<uint8_t>(12, 1)}})
                  .ok());
  const std::string whole = ReadRaw(path);
  std::mt19937 rng(7);
  int opened = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string damaged = whole;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      size_t pos = rng() % std::min<size_t>(damaged.size(), 120);
      damaged[pos] = static_cast<char>(rng() % 256);
    }
    const std::string p = TempPath("fuzz");
    WriteRaw(p, damaged);
    auto file = SafetensorsFile::Open(p);
    if (!file.ok()) continue;
    ++opened;
    for (const auto& name : (*file)->Names()) {
      auto view = (*file)->Get(name);
      ASSERT_TRUE(view.ok());
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < view->nbytes; ++i) sink ^= view->data[i];  // ASan checks bounds
      (void)sink;
    }
  }
  RecordProperty("opened_after_damage", opened);
}

}  // namespace
}  // namespace e3
