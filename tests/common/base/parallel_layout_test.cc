#include "common/base/parallel_layout.h"

#include "gtest/gtest.h"

namespace e3 {
namespace {

TEST(ParallelLayoutTest, OneProcessByDefault) {
  const ParallelLayout one;
  EXPECT_EQ(one.rank(), 0);
  EXPECT_EQ(one.world_size(), 1);
  EXPECT_TRUE(one.is_first());
  EXPECT_FALSE(one.tensor_parallel());
  EXPECT_FALSE(one.data_parallel());
  EXPECT_TRUE(one.OwnsRoundRobin(0));
  EXPECT_TRUE(one.OwnsRoundRobin(7));
}

TEST(ParallelLayoutTest, ReplicasOfConsecutiveTensorParallelRanks) {
  // 8 ranks: 2 replicas of tp 4, each with 2 expert groups of 2 ranks.
  const auto layout = ParallelLayout::Make(/*rank=*/6, /*world_size=*/8, /*tp_size=*/4, /*ep_size=*/2);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->dp_size(), 2);
  EXPECT_EQ(layout->dp_rank(), 1);
  EXPECT_EQ(layout->tp_rank(), 2);
  EXPECT_EQ(layout->moe_tp_size(), 2);
  EXPECT_EQ(layout->ep_rank(), 1);
  EXPECT_EQ(layout->moe_tp_rank(), 0);
  EXPECT_TRUE(layout->tensor_parallel());
  EXPECT_TRUE(layout->data_parallel());
  EXPECT_FALSE(layout->is_first());
  EXPECT_EQ(layout->Describe(), "rank 6/8 (tp 4, ep 2)");
}

TEST(ParallelLayoutTest, RoundRobinDealsItemsOverTheReplicas) {
  const auto rank1 = ParallelLayout::DataParallel(1, 3);
  ASSERT_TRUE(rank1.ok());
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(rank1->OwnsRoundRobin(i), i % 3 == 1) << i;
}

TEST(ParallelLayoutTest, ErrorsNameWhatDoesNotFit) {
  auto outside = ParallelLayout::Make(4, 4);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.status().message().find("rank 4 is outside a world of 4"), std::string::npos);
  auto tp = ParallelLayout::Make(0, 6, 4);
  EXPECT_NE(tp.status().message().find("tp size 4 must divide the world size 6"), std::string::npos);
  auto ep = ParallelLayout::Make(0, 4, 4, 3);
  EXPECT_NE(ep.status().message().find("ep size 3 must divide tp size 4"), std::string::npos);
}

}  // namespace
}  // namespace e3
