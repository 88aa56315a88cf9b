#include "common/data/vocab_map.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace e3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Sample MakeSample(int64_t id, std::vector<int32_t> ids, std::vector<uint8_t> mask) {
  Sample s;
  s.id = id;
  s.line = id + 1;
  s.input_ids = std::move(ids);
  s.loss_mask = std::move(mask);
  return s;
}

std::vector<uint8_t> I64Bytes(const std::vector<int64_t>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(int64_t));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

class VocabMapFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("e3_vocab_map_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes d2t/t2d tensors as given, valid or not.
  std::string WriteRaw(const std::string& name, std::vector<int64_t> d2t_shape,
                       const std::vector<int64_t>& d2t, std::vector<int64_t> t2d_shape,
                       const std::vector<uint8_t>& t2d,
                       const std::map<std::string, std::string>& metadata = {},
                       DType d2t_dtype = DType::kI64) {
    TensorToWrite a{"d2t", d2t_dtype, std::move(d2t_shape), I64Bytes(d2t)};
    if (d2t_dtype == DType::kI32) {
      a.data.clear();
      for (int64_t v : d2t) {
        int32_t x = static_cast<int32_t>(v);
        const uint8_t* p = reinterpret_cast<const uint8_t*>(&x);
        a.data.insert(a.data.end(), p, p + 4);
      }
    }
    TensorToWrite b{"t2d", DType::kBool, std::move(t2d_shape), t2d};
    const std::string path = Path(name);
    absl::Status status = WriteSafetensors(path, {a, b}, metadata);
    EXPECT_TRUE(status.ok()) << status;
    return path;
  }

  std::filesystem::path dir_;
};

TEST(VocabMapTest, HandComputedExample) {
  // Trained counts: 7 x3, 5 x2, 3 x1, 9 x1; id 2 is masked out.
  std::vector<Sample> samples = {
      MakeSample(0, {5, 5, 3, 7}, {1, 1, 1, 1}),
      MakeSample(1, {7, 7, 2, 9, 2}, {1, 1, 0, 1, 0}),
  };
  auto map = CalibrateVocabMap(samples, /*target_vocab_size=*/10, /*draft_vocab_size=*/3);
  ASSERT_TRUE(map.ok()) << map.status();
  // Top 3: 7, 5, then 3 beats 9 on the tie by lower id. Sorted: 3, 5, 7.
  EXPECT_THAT(map->TargetIds(), ElementsAre(3, 5, 7));
  EXPECT_THAT(map->d2t, ElementsAre(3, 4, 5));
  EXPECT_THAT(map->t2d, ElementsAre(0, 0, 0, 1, 0, 1, 0, 1, 0, 0));
  EXPECT_EQ(map->draft_vocab_size(), 3);
  EXPECT_EQ(map->target_vocab_size, 10);
  EXPECT_EQ(map->counted_tokens, 7);
  EXPECT_EQ(map->DraftToTarget(2), 7);
  EXPECT_TRUE(map->InDraft(5));
  EXPECT_FALSE(map->InDraft(9));
  EXPECT_FALSE(map->InDraft(10));
  EXPECT_TRUE(ValidateVocabMap(*map).ok());

  auto coverage = ComputeCoverage(*map, samples);
  ASSERT_TRUE(coverage.ok());
  EXPECT_EQ(coverage->loss_tokens, 7);
  EXPECT_EQ(coverage->covered, 6);  // all but the single 9
  EXPECT_DOUBLE_EQ(coverage->fraction(), 6.0 / 7.0);
}

TEST(VocabMapTest, TiesGoToLowerIds) {
  TokenCounter counter(20);
  // Every id 0..19 once, in descending order, then 15 and 11 once more.
  std::vector<int32_t> ids;
  for (int32_t id = 19; id >= 0; --id) ids.push_back(id);
  ids.push_back(15);
  ids.push_back(11);
  ASSERT_TRUE(counter.Add(ids, std::vector<uint8_t>(ids.size(), 1)).ok());
  EXPECT_EQ(counter.total(), 22);
  auto map = BuildVocabMap(counter, 5);
  ASSERT_TRUE(map.ok());
  EXPECT_THAT(map->TargetIds(), ElementsAre(0, 1, 2, 11, 15));
  EXPECT_THAT(map->d2t, ElementsAre(0, 0, 0, 8, 11));
}

TEST(VocabMapTest, FillsWithLowestUnusedIds) {
  TokenCounter counter(8);
  ASSERT_TRUE(counter.Add(std::vector<int32_t>{6, 4, 6, 1}, std::vector<uint8_t>{1, 1, 1, 0}).ok());
  auto map = BuildVocabMap(counter, 4);
  ASSERT_TRUE(map.ok());
  // Seen: 6, 4. Padding: 0, 1 (1 appears but only at an untrained position).
  EXPECT_THAT(map->TargetIds(), ElementsAre(0, 1, 4, 6));
  EXPECT_THAT(map->d2t, ElementsAre(0, 0, 2, 3));
  EXPECT_EQ(map->counted_tokens, 3);

  // Nothing seen at all: the draft vocab is simply [0, N).
  TokenCounter empty(8);
  auto all_fill = BuildVocabMap(empty, 3);
  ASSERT_TRUE(all_fill.ok());
  EXPECT_THAT(all_fill->TargetIds(), ElementsAre(0, 1, 2));
  EXPECT_THAT(all_fill->d2t, ElementsAre(0, 0, 0));

  // N == V takes the whole vocab.
  auto whole = BuildVocabMap(counter, 8);
  ASSERT_TRUE(whole.ok());
  EXPECT_THAT(whole->d2t, ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
}

TEST(VocabMapTest, RejectsBadSizesAndIds) {
  TokenCounter counter(8);
  auto too_big = BuildVocabMap(counter, 9);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.status().message(), HasSubstr("draft vocab size is 9"));
  EXPECT_FALSE(BuildVocabMap(counter, 0).ok());

  absl::Status bad_id =
      counter.Add(std::vector<int32_t>{1, 8}, std::vector<uint8_t>{1, 1}, "row 3");
  ASSERT_FALSE(bad_id.ok());
  EXPECT_THAT(bad_id.message(), HasSubstr("row 3: token 1 has id 8"));
  EXPECT_EQ(counter.total(), 0);  // the failed sample counted nothing
  // An out-of-range id at an untrained position is not counted, so allowed.
  EXPECT_TRUE(counter.Add(std::vector<int32_t>{1, 8}, std::vector<uint8_t>{1, 0}).ok());
  absl::Status mismatch = counter.Add(std::vector<int32_t>{1, 2}, std::vector<uint8_t>{1});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(mismatch.message(), HasSubstr("2 input_ids but 1 loss_mask values"));

  auto bad_sample = CalibrateVocabMap({MakeSample(4, {1, -2}, {1, 1})}, 8, 2);
  ASSERT_FALSE(bad_sample.ok());
  EXPECT_THAT(bad_sample.status().message(), HasSubstr("sample 4 (line 5): token 1 has id -2"));
}

TEST_F(VocabMapFileTest, SaveLoadRoundTrip) {
  std::vector<Sample> samples;
  for (int64_t i = 0; i < 50; ++i) {
    std::vector<int32_t> ids;
    for (int32_t t = 0; t < 30; ++t) ids.push_back(static_cast<int32_t>((i * 7 + t * t) % 1000));
    samples.push_back(MakeSample(i, ids, std::vector<uint8_t>(ids.size(), (i % 3) ? 1 : 0)));
  }
  auto map = CalibrateVocabMap(samples, 1000, 64);
  ASSERT_TRUE(map.ok()) << map.status();
  const std::string path = Path("vocab.safetensors");
  ASSERT_TRUE(SaveVocabMap(*map, path).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->metadata().at("draft_vocab_size"), "64");
  EXPECT_EQ((*file)->metadata().at("target_vocab_size"), "1000");
  EXPECT_EQ((*file)->metadata().at("counted_tokens"), std::to_string(map->counted_tokens));
  auto d2t = (*file)->Get("d2t");
  ASSERT_TRUE(d2t.ok());
  EXPECT_EQ(d2t->dtype, DType::kI64);
  EXPECT_THAT(d2t->shape, ElementsAre(64));
  auto t2d = (*file)->Get("t2d");
  ASSERT_TRUE(t2d.ok());
  EXPECT_EQ(t2d->dtype, DType::kBool);
  EXPECT_THAT(t2d->shape, ElementsAre(1000));

  auto loaded = LoadVocabMap(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->d2t, map->d2t);
  EXPECT_EQ(loaded->t2d, map->t2d);
  EXPECT_EQ(loaded->target_vocab_size, 1000);
  EXPECT_EQ(loaded->counted_tokens, map->counted_tokens);
  EXPECT_EQ(map->counted_tokens, 33 * 30);  // 33 of 50 samples are trained
}

TEST_F(VocabMapFileTest, LoadsWithoutMetadata) {
  // An exported draft checkpoint carries d2t/t2d without our metadata.
  const std::string path = WriteRaw("bare.safetensors", {2}, {1, 3}, {5}, {0, 1, 0, 0, 1});
  auto loaded = LoadVocabMap(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(loaded->TargetIds(), ElementsAre(1, 4));
  EXPECT_EQ(loaded->counted_tokens, 0);
}

TEST_F(VocabMapFileTest, RejectsCorruptFiles) {
  struct Case {
    std::string name;
    std::string path;
    std::string expected;
  };
  std::vector<Case> cases = {
      {"d2t_2d", WriteRaw("a.safetensors", {1, 2}, {1, 3}, {5}, {0, 1, 0, 0, 1}),
       "tensor \"d2t\": shape is [1, 2]; expected [draft_vocab_size]"},
      {"t2d_2d", WriteRaw("b.safetensors", {2}, {1, 3}, {5, 1}, {0, 1, 0, 0, 1}),
       "tensor \"t2d\": shape is [5, 1]; expected [target_vocab_size]"},
      {"d2t_i32", WriteRaw("c.safetensors", {2}, {1, 3}, {5}, {0, 1, 0, 0, 1}, {}, DType::kI32),
       "tensor \"d2t\": dtype is I32; expected I64"},
      {"t2d_disagrees", WriteRaw("d.safetensors", {2}, {1, 3}, {5}, {0, 1, 0, 1, 0}),
       "t2d: is false at target id 4, which d2t entry 1 maps to"},
      {"t2d_extra", WriteRaw("e.safetensors", {2}, {1, 3}, {5}, {1, 1, 0, 0, 1}),
       "t2d: marks 3 target ids but d2t maps 2"},
      {"not_increasing", WriteRaw("f.safetensors", {2}, {3, 0}, {5}, {0, 1, 0, 1, 0}),
       "d2t: entry 1 maps to target id 1, not above entry 0's 3"},
      {"out_of_vocab", WriteRaw("g.safetensors", {2}, {1, 5}, {5}, {0, 1, 0, 0, 0}),
       "d2t: entry 1 maps to target id 6; expected 0 <= id < 5"},
      {"draft_bigger", WriteRaw("h.safetensors", {3}, {0, 0, 0}, {2}, {1, 1}),
       "d2t: has 3 entries; expected 1 <= draft vocab <= target vocab 2"},
      {"empty_d2t", WriteRaw("i.safetensors", {0}, {}, {2}, {0, 0}), "d2t: has 0 entries"},
      {"bool_not_01", WriteRaw("j.safetensors", {1}, {1}, {3}, {0, 2, 0}),
       "t2d: holds 2 at id 1; expected 0 or 1"},
      {"meta_draft",
       WriteRaw("k.safetensors", {2}, {1, 3}, {5}, {0, 1, 0, 0, 1}, {{"draft_vocab_size", "3"}}),
       "metadata \"draft_vocab_size\" is 3 but tensor \"d2t\" has 2 entries"},
      {"meta_target",
       WriteRaw("l.safetensors", {2}, {1, 3}, {5}, {0, 1, 0, 0, 1}, {{"target_vocab_size", "6"}}),
       "metadata \"target_vocab_size\" is 6 but tensor \"t2d\" has 5 entries"},
      {"meta_not_int",
       WriteRaw("m.safetensors", {2}, {1, 3}, {5}, {0, 1, 0, 0, 1}, {{"counted_tokens", "many"}}),
       "metadata \"counted_tokens\" is \"many\"; expected an integer"},
  };
  for (const Case& c : cases) {
    auto loaded = LoadVocabMap(c.path);
    ASSERT_FALSE(loaded.ok()) << c.name;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << c.name;
    EXPECT_THAT(loaded.status().message(), HasSubstr(c.path)) << c.name;
    EXPECT_THAT(loaded.status().message(), HasSubstr(c.expected)) << c.name;
  }
}

TEST_F(VocabMapFileTest, MissingTensorTruncatedAndMissingFile) {
  const std::string only_d2t = Path("only_d2t.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(only_d2t, {TensorToWrite{"d2t", DType::kI64, {1}, I64Bytes({0})}}).ok());
  auto missing_tensor = LoadVocabMap(only_d2t);
  ASSERT_FALSE(missing_tensor.ok());
  EXPECT_THAT(missing_tensor.status().message(), HasSubstr("no tensor named \"t2d\""));
  EXPECT_THAT(missing_tensor.status().message(), HasSubstr(only_d2t));

  const std::string good = WriteRaw("good.safetensors", {2}, {1, 3}, {5}, {0, 1, 0, 0, 1});
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string truncated = Path("truncated.safetensors");
  {
    std::ofstream out(truncated, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 3));
  }
  auto cut = LoadVocabMap(truncated);
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(cut.status().message(), HasSubstr(truncated));

  auto absent = LoadVocabMap(Path("nope.safetensors"));
  ASSERT_FALSE(absent.ok());
  EXPECT_THAT(absent.status().message(), HasSubstr("nope.safetensors"));
}

TEST(VocabMapTest, SaveRejectsInvalidMap) {
  VocabMap map;
  map.target_vocab_size = 4;
  map.d2t = {0, 0};
  map.t2d = {1, 0, 0, 0};
  absl::Status status = SaveVocabMap(map, "/tmp/never_written.safetensors");
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("t2d: is false at target id 1"));
}

}  // namespace
}  // namespace e3
