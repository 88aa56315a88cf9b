// A data fingerprint names what differs between a cursor's stream and a
// teacher's, field group by field group with the flags that set it, and
// an empty one (a fresh student, an older checkpoint) matches anything.
#include "common/stream/data_fingerprint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace e3 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

DataFingerprint Stream() {
  DataFingerprint f;
  f.dataset = "1111111111111111";
  f.chat_template = "2222222222222222";
  f.samples = "3333333333333333";
  f.data_seed = 42;
  f.epochs = 2;
  f.num_data_shards = 2;
  f.data_shard = 0;
  f.tokens_per_batch = 4096;
  f.draft_vocab = "4444444444444444";
  return f;
}

TEST(DataFingerprintTest, TheSameStreamAndAnEmptyOneAgree) {
  EXPECT_TRUE(CheckSameDataStream(Stream(), Stream(), "cursor").ok());
  EXPECT_TRUE(CheckSameDataStream(DataFingerprint{}, Stream(), "cursor").ok());
  EXPECT_TRUE(CheckSameDataStream(Stream(), DataFingerprint{}, "cursor").ok());
}

TEST(DataFingerprintTest, EachDifferenceIsNamedWithItsFlags) {
  DataFingerprint other = Stream();
  other.data_shard = 1;
  other.tokens_per_batch = 2048;
  other.chat_template = "5555555555555555";
  absl::Status st = CheckSameDataStream(Stream(), other, "rank-0's cursor 1:7");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(st.message());
  EXPECT_THAT(m, HasSubstr("rank-0's cursor 1:7 was made for another data stream"));
  EXPECT_THAT(m, HasSubstr("shard layout (--num_data_shards/--data_shard): cursor 0 of 2, teacher 1 of 2"));
  EXPECT_THAT(m, HasSubstr("token budget (--tokens_per_batch): cursor 4096, teacher 2048"));
  EXPECT_THAT(m, HasSubstr("chat template (--chat_template"));
  EXPECT_THAT(m, Not(HasSubstr("--data_seed")));
  EXPECT_THAT(m, Not(HasSubstr("draft vocab")));
  EXPECT_EQ(FingerprintDifferences(Stream(), other).size(), 3u);
}

TEST(DataFingerprintTest, JsonRoundTripsAndRefusesWrongTypes) {
  auto back = FingerprintFromJson(FingerprintToJson(Stream()), "f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(FingerprintDifferences(*back, Stream()).empty());
  auto bad = FingerprintFromJson(nlohmann::json{{"data_shard", "one"}}, "state.json: cursors[0].fingerprint");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("cursors[0].fingerprint.data_shard"));
  EXPECT_FALSE(FingerprintFromJson(nlohmann::json{{"dataset", std::string(257, 'a')}}, "f").ok());
  EXPECT_FALSE(FingerprintFromJson(nlohmann::json::array(), "f").ok());
  EXPECT_EQ(FingerprintHex(0xabcull), "0000000000000abc");
}

}  // namespace
}  // namespace e3
