// A subscriber's feature plan: its layers found among the captured ones
// (in its order, a missing one named with what is captured), the tensors
// it reads spelled as its fingerprint records them, and a plan other than
// a cursor's named as the difference, while a cursor written before plans
// were recorded matches any. Student group names are checked where they
// become file and segment names.
#include "common/stream/feature_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/stream/student_group.h"

namespace e3 {
namespace {

using ::testing::HasSubstr;

DataFingerprint PlanStream() {
  DataFingerprint f;
  f.dataset = "1111111111111111";
  f.samples = "3333333333333333";
  f.draft_vocab = "4444444444444444";
  f.tokens_per_batch = 512;
  return f;
}

FeatureRequest DFlashLike() {
  FeatureRequest r;
  r.aux_layer_ids = {5, 1};
  r.last_hidden = false;
  r.target_argmax = true;
  return r;
}

TEST(FeatureRequestTest, EverythingIsEveryCapturedLayerAndTensor) {
  const FeatureRequest all = EveryFeature({1, 3, 4});
  EXPECT_EQ(all.aux_layer_ids, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_TRUE(all.last_hidden);
  EXPECT_TRUE(all.target_argmax);
  EXPECT_EQ(FeatureTensorsText(all), "aux_hidden,last_hidden,target_argmax");
  EXPECT_EQ(FeatureTensorsText(DFlashLike()), "aux_hidden,target_argmax");
  FeatureRequest nothing;
  nothing.last_hidden = nothing.target_argmax = false;
  EXPECT_EQ(FeatureTensorsText(nothing), "none");
  EXPECT_EQ(AuxLayersText({2, 0, 1}), "2,0,1");
}

TEST(FeatureRequestTest, PositionsFollowTheRequestsOrder) {
  auto p = AuxPositions({5, 1}, {1, 3, 4, 5});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (std::vector<int64_t>{3, 0}));
  auto repeated = AuxPositions({4, 4}, {1, 3, 4});
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_EQ(*repeated, (std::vector<int64_t>{2, 2}));
  auto none = AuxPositions({}, {1, 3, 4});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST(FeatureRequestTest, ALayerNotCapturedIsRefusedNamingBothSets) {
  auto p = AuxPositions({1, 2, 6, 2}, {1, 3, 4});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(p.status().message());
  EXPECT_THAT(m, HasSubstr("the draft reads aux layers [1, 2, 6, 2]"));
  EXPECT_THAT(m, HasSubstr("does not capture [2, 6]"));
  EXPECT_THAT(m, HasSubstr("it captures [1, 3, 4]"));
  EXPECT_THAT(m, HasSubstr("--extra_aux_layer_ids"));
}

TEST(FeatureRequestTest, ThePlanIsPartOfTheFingerprint) {
  const DataFingerprint dflash = WithFeaturePlan(PlanStream(), DFlashLike());
  EXPECT_EQ(dflash.aux_layers, "5,1");
  EXPECT_EQ(dflash.features, "aux_hidden,target_argmax");
  EXPECT_EQ(dflash.dataset, PlanStream().dataset);
  // No stream named: nothing to compare, with or without a plan.
  EXPECT_TRUE(WithFeaturePlan(DataFingerprint{}, DFlashLike()).empty());

  // The same data under another plan is refused, naming the plan's part.
  const DataFingerprint eagle = WithFeaturePlan(PlanStream(), EveryFeature({1, 3, 4}));
  const absl::Status st = CheckSameDataStream(dflash, eagle, "subscriber rank-0's cursor 0:3");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(st.message());
  EXPECT_THAT(m, HasSubstr("aux layers the draft reads (--aux_layer_ids, --draft_algorithm): cursor 5,1, "
                           "this subscription 1,3,4"));
  EXPECT_THAT(m, HasSubstr("tensors the draft reads (--draft_algorithm, --dflash_labels): cursor "
                           "aux_hidden,target_argmax, this subscription aux_hidden,last_hidden,target_argmax"));
  EXPECT_EQ(FingerprintDifferences(dflash, eagle).size(), 2u);
  EXPECT_TRUE(CheckSameDataStream(dflash, WithFeaturePlan(PlanStream(), DFlashLike()), "cursor").ok());
}

TEST(FeatureRequestTest, ACursorWithoutAPlanMatchesAnyPlan) {
  // Written before the fingerprint carried a plan: its fields are empty.
  EXPECT_TRUE(CheckSameDataStream(PlanStream(), WithFeaturePlan(PlanStream(), DFlashLike()), "cursor").ok());
  // Written when it carried the layers but not the tensors.
  DataFingerprint layers_only = PlanStream();
  layers_only.aux_layers = "5,1";
  EXPECT_TRUE(CheckSameDataStream(layers_only, WithFeaturePlan(PlanStream(), DFlashLike()), "cursor").ok());
  layers_only.aux_layers = "1,3,4";
  EXPECT_FALSE(CheckSameDataStream(layers_only, WithFeaturePlan(PlanStream(), DFlashLike()), "cursor").ok());
}

TEST(FeatureRequestTest, ThePlanRoundTripsThroughJson) {
  const DataFingerprint f = WithFeaturePlan(PlanStream(), DFlashLike());
  auto back = FingerprintFromJson(FingerprintToJson(f), "f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->aux_layers, "5,1");
  EXPECT_EQ(back->features, "aux_hidden,target_argmax");
  auto old = FingerprintFromJson(nlohmann::json{{"dataset", "1111111111111111"}}, "f");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(old->features.empty());
}

TEST(StudentGroupTest, NamesThatBecomeFileNamesAreChecked) {
  EXPECT_TRUE(CheckStudentGroupName("", "--student_group").ok());
  EXPECT_TRUE(CheckStudentGroupName("dflash-2_b", "--student_group").ok());
  const absl::Status slash = CheckStudentGroupName("a/b", "--student_group");
  EXPECT_EQ(slash.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(slash.message()), HasSubstr("--student_group \"a/b\" has '/' at 1"));
  EXPECT_FALSE(CheckStudentGroupName(std::string(65, 'a'), "--student_group").ok());
  EXPECT_FALSE(CheckStudentGroupName("a b", "--student_group").ok());
  EXPECT_EQ(DescribeStudentGroup(""), "the default student group");
  EXPECT_EQ(DescribeStudentGroup("dflash"), "student group \"dflash\"");
}

}  // namespace
}  // namespace e3
