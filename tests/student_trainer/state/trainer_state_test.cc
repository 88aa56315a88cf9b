// trainer_state.json round-trips, and damage is an error naming the file
// and the field (the cases a disk error or a hand edit produce).
#include "student_trainer/state/trainer_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace e3 {
namespace {

using ::testing::HasSubstr;

TEST(TrainerStateTest, RoundTrips) {
  TrainerState st;
  st.step = 12;
  st.cursors = {{1, 5}, {0, 7}};
  st.tokens = 3456;
  st.subscriber_id = "rank-0";
  auto back = ParseTrainerState(TrainerStateToJson(st), "ckpt/trainer_state.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 12);
  ASSERT_EQ(back->cursors.size(), 2u);
  EXPECT_EQ(back->cursors[0].epoch, 1);
  EXPECT_EQ(back->cursors[0].next_batch, 5);
  EXPECT_EQ(back->cursors[1].epoch, 0);
  EXPECT_EQ(back->cursors[1].next_batch, 7);
  EXPECT_EQ(back->tokens, 3456);
  EXPECT_EQ(back->subscriber_id, "rank-0");
}

TEST(TrainerStateTest, CursorsKeepTheirDataFingerprint) {
  TrainerState st;
  StreamCursor c{0, 9, {}};
  c.data.dataset = "00000000000000aa";
  c.data.chat_template = "00000000000000ab";
  c.data.samples = "00000000000000ac";
  c.data.draft_vocab = "00000000000000ad";
  c.data.data_seed = 18446744073709551615ull;  // any uint64 seed
  c.data.epochs = 3;
  c.data.num_data_shards = 2;
  c.data.data_shard = 1;
  c.data.tokens_per_batch = 4096;
  st.cursors = {c, {2, 0, {}}};
  auto back = ParseTrainerState(TrainerStateToJson(st), "s.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->cursors.size(), 2u);
  EXPECT_TRUE(FingerprintDifferences(back->cursors[0].data, c.data).empty());
  EXPECT_EQ(back->cursors[0].data.data_seed, 18446744073709551615ull);
  EXPECT_TRUE(back->cursors[1].data.empty()) << "no fingerprint stays none";

  auto bad = ParseTrainerState(R"({"step": 1, "cursors": [{"fingerprint": {"epochs": -1}}]})", "s.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("s.json: cursors[0].fingerprint.epochs"));
  bad = ParseTrainerState(R"({"step": 1, "cursors": [{"fingerprint": {"samples": 7}}]})", "s.json");
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("cursors[0].fingerprint.samples: expected a string"));
}

TEST(TrainerStateTest, OptionalFieldsMayBeAbsent) {
  auto st = ParseTrainerState(R"({"step": 3, "cursors": [{}]})", "s.json");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->step, 3);
  ASSERT_EQ(st->cursors.size(), 1u);
  EXPECT_EQ(st->cursors[0].epoch, 0);
  EXPECT_EQ(st->tokens, 0);
  EXPECT_EQ(st->subscriber_id, "");
}

TEST(TrainerStateTest, DamageNamesTheFileAndTheField) {
  const struct {
    const char* text;
    const char* message;
  } cases[] = {
      {"", "s.json: not a JSON object"},
      {"[1, 2]", "s.json: not a JSON object"},
      {R"({"cursors": []})", "s.json: step is missing; expected an integer >= 0"},
      {R"({"step": "three", "cursors": []})",
       "s.json: step is \"three\"; expected an integer >= 0"},
      {R"({"step": -1, "cursors": []})", "step is -1"},
      {R"({"step": 18446744073709551615, "cursors": []})", "step is 18446744073709551615"},
      {R"({"step": 1.5, "cursors": []})", "step is 1.5"},
      {R"({"step": 1})", "cursors is missing; expected an array"},
      {R"({"step": 1, "cursors": {}})", "cursors is {}; expected an array"},
      {R"({"step": 1, "cursors": [3]})", "s.json: cursors[0] is not an object"},
      {R"({"step": 1, "cursors": [{}, {"epoch": "x"}]})", "s.json: cursors[1].epoch is \"x\""},
      {R"({"step": 1, "cursors": [{"next_batch": -4}]})", "cursors[0].next_batch is -4"},
      {R"({"step": 1, "cursors": [], "tokens": null})", "tokens is null"},
      {R"({"step": 1, "cursors": [], "subscriber_id": 7})",
       "subscriber_id is 7; expected a string"},
  };
  for (const auto& c : cases) {
    auto st = ParseTrainerState(c.text, "s.json");
    ASSERT_FALSE(st.ok()) << c.text;
    EXPECT_EQ(st.status().code(), absl::StatusCode::kDataLoss) << c.text;
    EXPECT_THAT(st.status().message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(TrainerStateTest, ALongValueIsShownCut) {
  const std::string big(10000, 'x');
  auto st = ParseTrainerState(R"({"step": ")" + big + R"(", "cursors": []})", "s.json");
  ASSERT_FALSE(st.ok());
  EXPECT_LT(st.status().message().size(), 200u);
}

// The cursors must be where the steps put them: an edited next_batch (16
// made 90) is refused before the student asks a teacher for batch 90.
TEST(TrainerStateTest, CursorsMustMatchTheBatchesTaken) {
  TrainerState st;
  st.step = 16;
  st.cursors = {{0, 16, {}, 16}};
  EXPECT_TRUE(CheckCursorsAgainstSteps(st, "s.json").ok());
  auto back = ParseTrainerState(TrainerStateToJson(st), "s.json");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->cursors[0].consumed, 16);
  EXPECT_TRUE(CheckCursorsAgainstSteps(*back, "s.json").ok());

  st.cursors[0].next_batch = 90;
  const absl::Status edited = CheckCursorsAgainstSteps(st, "s.json");
  EXPECT_EQ(edited.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(edited.message()),
              HasSubstr("s.json: cursors[0] is at 0:90, but 16 batches were taken from that stream"));
  st.cursors[0] = {0, 90, {}, 90};  // cursor and count edited together: the steps still disagree
  EXPECT_THAT(std::string(CheckCursorsAgainstSteps(st, "s.json").message()),
              HasSubstr("90 batches were taken, but step 16 and 0 skipped batches account for 16"));

  // Two streams, round-robin, one in its second epoch; one skipped batch.
  st.step = 11;
  st.skipped_batches = 1;
  st.cursors = {{1, 2, {}, 7}, {0, 5, {}, 5}};
  EXPECT_TRUE(CheckCursorsAgainstSteps(st, "s.json").ok());
  st.cursors[0].next_batch = 8;  // past all it took, even in a later epoch
  EXPECT_FALSE(CheckCursorsAgainstSteps(st, "s.json").ok());

  // A checkpoint that did not count: nothing to check against.
  auto old = ParseTrainerState(R"({"step": 3, "cursors": [{"epoch": 0, "next_batch": 50}]})", "s.json");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->cursors[0].consumed, -1);
  EXPECT_TRUE(CheckCursorsAgainstSteps(*old, "s.json").ok());
}

}  // namespace
}  // namespace e3
