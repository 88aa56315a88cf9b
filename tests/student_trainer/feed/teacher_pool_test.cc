// The teacher pool's rules that need no server: which teachers agree, and
// whose turn it is. (tests/e2e/sharded_teachers_e2e_test.cc runs the pool
// against real teachers.)
#include "student_trainer/feed/teacher_pool.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace e3 {
namespace {

TeacherInfo Info(int64_t hidden, std::vector<int32_t> aux, int64_t draft_vocab) {
  TeacherInfo t;
  t.config.hidden_size = hidden;
  t.config.num_hidden_layers = 8;
  t.config.vocab_size = 8192;
  t.aux_layer_ids = std::move(aux);
  t.draft_vocab_size = draft_vocab;
  return t;
}

const std::vector<std::string> kAddresses = {"a:1", "b:2", "c:3"};

TEST(TeacherPoolTest, TeachersOfOneModelAgree) {
  const TeacherInfo a = Info(256, {1, 3, 4}, 512), b = Info(256, {1, 3, 4}, 512);
  EXPECT_TRUE(CheckTeachersAgree({&a}, kAddresses).ok());
  EXPECT_TRUE(CheckTeachersAgree({&a, &b, &a}, kAddresses).ok());
}

TEST(TeacherPoolTest, ADisagreementNamesBothTeachersAndWhatDiffers) {
  const TeacherInfo a = Info(256, {1, 3, 4}, 512);
  const TeacherInfo other_aux = Info(256, {1, 2, 4}, 512);
  const TeacherInfo other_model = Info(512, {1, 3, 4}, 1024);
  auto aux = CheckTeachersAgree({&a, &a, &other_aux}, kAddresses);
  ASSERT_FALSE(aux.ok());
  EXPECT_EQ(aux.message(),
            "teachers a:1 and c:3 serve different models, aux layers or draft vocabs (aux layer "
            "ids differ)");
  auto model = CheckTeachersAgree({&a, &other_model}, kAddresses);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.message().find("(hidden_size, draft vocab size differ)"), std::string::npos)
      << model;
}

TEST(TeacherPoolTest, FrozenWeightsMustBeTheSameCalibration) {
  FrozenWeights a;
  a.target_head = torch::arange(12, torch::kFloat).reshape({3, 4});
  a.vocab.d2t = {0, 1, 5};
  FrozenWeights same = a;
  same.target_head = a.target_head.clone();
  EXPECT_TRUE(CheckSameFrozenWeights(a, same, "a:1", "b:2").ok());
  FrozenWeights other_vocab = same;
  other_vocab.vocab.d2t = {0, 1, 6};
  auto vocab = CheckSameFrozenWeights(a, other_vocab, "a:1", "b:2");
  ASSERT_FALSE(vocab.ok());
  EXPECT_NE(vocab.message().find("teachers a:1 and b:2 serve different draft vocabs or heads"),
            std::string::npos);
  FrozenWeights other_head = same;
  other_head.target_head = a.target_head + 1;
  EXPECT_FALSE(CheckSameFrozenWeights(a, other_head, "a:1", "b:2").ok());
}

TEST(TeacherPoolTest, RoundRobinSkipsTeachersWhoseDataEnded) {
  RoundRobin turns(3);
  std::vector<size_t> order;
  auto take = [&](int n) {
    for (int i = 0; i < n; ++i) {
      std::optional<size_t> t = turns.Current();
      ASSERT_TRUE(t.has_value());
      order.push_back(*t);
      turns.Advance();
    }
  };
  take(4);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 0}));
  turns.MarkEnded(1);  // teacher 1 said end_of_data on its turn
  order.clear();
  take(3);
  EXPECT_EQ(order, (std::vector<size_t>{2, 0, 2}));
  turns.MarkEnded(0);
  turns.MarkEnded(2);
  EXPECT_FALSE(turns.Current().has_value());
}

}  // namespace
}  // namespace e3
