// Every bound of proto/request_limits.h: the largest accepted value passes,
// one past it is refused naming the message, the field and what was
// expected. The loopback test (tests/teacher_server/service/service_limits_test.cc)
// shows the handlers apply them.
#include "proto/request_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/stream/sample_order.h"

namespace e3 {
namespace {

using ::testing::HasSubstr;

void ExpectRefused(const absl::Status& s, const std::string& message) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(message));
}

RequestLimits Limits() {
  RequestLimits l;
  l.vocab_size = 256;
  l.max_positions = 512;
  l.max_generate_new_tokens = 64;
  l.max_generate_prompt_tokens = 100;
  return l;
}

v1::SubscribeRequest GoodSubscribe() {
  v1::SubscribeRequest r;
  r.set_subscriber_id("rank-3");
  r.set_rank(3);
  r.set_world_size(4);
  r.set_credit_window(4);
  return r;
}

TEST(RequestLimitsTest, MessageSizeCaps) {
  EXPECT_TRUE(CheckMessageSizeCap(4 << 20, "--cap").ok());
  EXPECT_TRUE(CheckMessageSizeCap(2147483647, "--cap").ok());
  ExpectRefused(CheckMessageSizeCap(2147483648LL, "--cap"),
                "--cap is 2147483648; expected 1024 <= bytes <= 2147483647");
  ExpectRefused(CheckMessageSizeCap(0, "--cap"), "--cap is 0");
  ExpectRefused(CheckMessageSizeCap(-1, "--cap"), "--cap is -1");
}

TEST(RequestLimitsTest, GetInfoWorldIsBounded) {
  v1::GetInfoRequest r;
  EXPECT_TRUE(CheckGetInfoRequest(r).ok());  // 0: one rank
  r.set_world_size(kMaxWorldSize);
  EXPECT_TRUE(CheckGetInfoRequest(r).ok());
  r.set_world_size(kMaxWorldSize + 1);
  ExpectRefused(CheckGetInfoRequest(r),
                "GetInfoRequest.world_size is 10001; expected 0 <= world_size <= 10000");
  r.set_world_size(-2);
  ExpectRefused(CheckGetInfoRequest(r), "world_size is -2");
}

TEST(RequestLimitsTest, SubscribeRankAndWorld) {
  EXPECT_TRUE(CheckSubscribeRequest(GoodSubscribe(), Limits()).ok());
  v1::SubscribeRequest r = GoodSubscribe();
  r.set_rank(kMaxWorldSize - 1);
  r.set_world_size(kMaxWorldSize);
  EXPECT_TRUE(CheckSubscribeRequest(r, Limits()).ok());
  // A rank past the limit would make batch ids collide.
  r.set_rank(kMaxWorldSize);
  r.set_world_size(kMaxWorldSize + 1);
  ExpectRefused(CheckSubscribeRequest(r, Limits()),
                "SubscribeRequest.world_size is 10001; expected 1 <= world_size <= 10000");
  r = GoodSubscribe();
  r.set_rank(4);
  ExpectRefused(CheckSubscribeRequest(r, Limits()),
                "SubscribeRequest.rank is 4; expected 0 <= rank < world_size 4");
  r.set_rank(-1);
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "SubscribeRequest.rank is -1");
  r = GoodSubscribe();
  r.set_world_size(0);
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "world_size is 0");
}

TEST(RequestLimitsTest, SubscribeOtherFields) {
  v1::SubscribeRequest r = GoodSubscribe();
  r.set_subscriber_id("");
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "SubscribeRequest.subscriber_id is empty");
  r.set_subscriber_id(std::string(257, 'a'));
  ExpectRefused(CheckSubscribeRequest(r, Limits()),
                "subscriber_id is 257 bytes; expected at most 256");
  r.set_subscriber_id(std::string(256, 'a'));
  EXPECT_TRUE(CheckSubscribeRequest(r, Limits()).ok());
  r.set_subscriber_id("a\"b");
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "subscriber_id has byte 0x22 at 1");
  r.set_subscriber_id(std::string("a\nb"));
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "has byte 0x0a at 1");
  r = GoodSubscribe();
  r.set_host(std::string(300, 'h'));
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "SubscribeRequest.host is 300 bytes");
  r = GoodSubscribe();
  r.set_credit_window(-1);
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "credit_window is -1");
  r = GoodSubscribe();
  r.mutable_resume()->set_next_batch(-5);
  ExpectRefused(CheckSubscribeRequest(r, Limits()),
                "SubscribeRequest.resume is {epoch 0, next_batch -5}");
  r = GoodSubscribe();
  r.set_nccl_unique_id(std::string(129, 'x'));
  ExpectRefused(CheckSubscribeRequest(r, Limits()),
                "nccl_unique_id is 129 bytes; expected 0 or 128");
  r.set_nccl_unique_id(std::string(128, 'x'));
  EXPECT_TRUE(CheckSubscribeRequest(r, Limits()).ok());
  r.set_student_device(-1);
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "student_device is -1");
}

TEST(RequestLimitsTest, SubscribeCommitAndFingerprint) {
  v1::SubscribeRequest r = GoodSubscribe();
  r.mutable_resume()->set_next_batch(4);
  r.mutable_committed()->set_next_batch(4);
  EXPECT_TRUE(CheckSubscribeRequest(r, Limits()).ok());
  r.mutable_committed()->set_next_batch(5);
  ExpectRefused(CheckSubscribeRequest(r, Limits()),
                "SubscribeRequest.committed is 0:5, past resume 0:4; expected committed <= resume");
  r.mutable_committed()->set_next_batch(-1);
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "SubscribeRequest.committed is {epoch 0, next_batch -1}");
  r = GoodSubscribe();
  r.mutable_resume_fingerprint()->set_samples("0123456789abcdef");
  EXPECT_TRUE(CheckSubscribeRequest(r, Limits()).ok());
  r.mutable_resume_fingerprint()->set_samples(std::string("a\nb"));
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "SubscribeRequest.resume_fingerprint.samples has byte 0x0a");
  r = GoodSubscribe();
  r.mutable_resume_fingerprint()->set_tokens_per_batch(-2);
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "SubscribeRequest.resume_fingerprint has a negative");
}

TEST(RequestLimitsTest, Ack) {
  v1::AckRequest r;
  r.set_subscriber_id("rank-0");
  r.add_batch_ids(7);
  ExpectRefused(CheckAckRequest(r, Limits()), "AckRequest.subscription_generation is 0");
  r.set_subscription_generation(12);
  EXPECT_TRUE(CheckAckRequest(r, Limits()).ok());
  r.set_rank(kMaxWorldSize);
  ExpectRefused(CheckAckRequest(r, Limits()),
                "AckRequest.rank is 10000; expected 0 <= rank < 10000");
  r.set_rank(0);
  for (int i = 0; i < Limits().max_ack_batch_ids; ++i) r.add_batch_ids(i);
  ExpectRefused(CheckAckRequest(r, Limits()),
                "AckRequest.batch_ids holds 4097 ids; expected at most 4096");
  r.clear_batch_ids();
  r.mutable_committed()->set_epoch(-1);
  ExpectRefused(CheckAckRequest(r, Limits()), "AckRequest.committed is {epoch -1");
  r.clear_committed();
  r.set_subscriber_id("");
  ExpectRefused(CheckAckRequest(r, Limits()), "AckRequest.subscriber_id is empty");
}

// A feature request names at most max_feature_layers layers, none
// negative; a student group name is one a file may carry.
TEST(RequestLimitsTest, FeatureRequestsAndStudentGroups) {
  v1::SubscribeRequest r = GoodSubscribe();
  r.mutable_features()->add_aux_layer_ids(3);
  r.set_student_group("dflash");
  EXPECT_TRUE(CheckSubscribeRequest(r, Limits()).ok());
  r.mutable_features()->add_aux_layer_ids(-2);
  ExpectRefused(CheckSubscribeRequest(r, Limits()),
                "SubscribeRequest.features.aux_layer_ids[1] is -2; expected a layer id >= 0");
  r.mutable_features()->clear_aux_layer_ids();
  for (int i = 0; i <= Limits().max_feature_layers; ++i) r.mutable_features()->add_aux_layer_ids(i);
  ExpectRefused(CheckSubscribeRequest(r, Limits()),
                "SubscribeRequest.features.aux_layer_ids holds 257 layers; expected at most 256");
  r = GoodSubscribe();
  r.set_student_group("../ledger");
  ExpectRefused(CheckSubscribeRequest(r, Limits()), "SubscribeRequest.student_group \"../ledger\" has '.' at 0");

  v1::AckRequest ack;
  ack.set_subscriber_id("rank-0");
  ack.set_subscription_generation(12);
  ack.set_student_group("dflash");
  EXPECT_TRUE(CheckAckRequest(ack, Limits()).ok());
  ack.set_student_group(std::string(65, 'g'));
  ExpectRefused(CheckAckRequest(ack, Limits()), "AckRequest.student_group is 65 characters; expected at most 64");

  v1::GetEvalSetRequest eval;
  EXPECT_TRUE(CheckGetEvalSetRequest(eval, Limits()).ok());
  eval.mutable_features()->add_aux_layer_ids(-1);
  ExpectRefused(CheckGetEvalSetRequest(eval, Limits()), "GetEvalSetRequest.features.aux_layer_ids[0] is -1");
}

TEST(RequestLimitsTest, GetWeights) {
  v1::GetWeightsRequest r;
  EXPECT_TRUE(CheckGetWeightsRequest(r, Limits()).ok());
  for (int i = 0; i < 17; ++i) r.add_names("embed_tokens");
  ExpectRefused(CheckGetWeightsRequest(r, Limits()),
                "GetWeightsRequest.names holds 17 names; expected at most 16");
  r.clear_names();
  r.add_names(std::string(1000, 'n'));
  ExpectRefused(CheckGetWeightsRequest(r, Limits()), "GetWeightsRequest.names[] is 1000 bytes");
}

TEST(RequestLimitsTest, Generate) {
  v1::GenerateRequest r;
  r.set_max_new_tokens(8);
  ExpectRefused(CheckGenerateRequest(r, Limits()), "GenerateRequest.input_ids is empty");
  for (int i = 0; i < 100; ++i) r.add_input_ids(i);
  EXPECT_TRUE(CheckGenerateRequest(r, Limits()).ok());
  r.add_input_ids(1);
  ExpectRefused(CheckGenerateRequest(r, Limits()),
                "GenerateRequest.input_ids holds 101 tokens; expected at most 100 "
                "(--max_generate_prompt_tokens)");
  r.clear_input_ids();
  r.add_input_ids(5);
  r.add_input_ids(256);
  ExpectRefused(CheckGenerateRequest(r, Limits()),
                "GenerateRequest.input_ids[1] is 256; expected 0 <= id < vocab_size 256");
  r.set_input_ids(1, -3);
  ExpectRefused(CheckGenerateRequest(r, Limits()), "input_ids[1] is -3");
  r.set_input_ids(1, 9);
  r.set_max_new_tokens(64);
  EXPECT_TRUE(CheckGenerateRequest(r, Limits()).ok());
  r.set_max_new_tokens(65);
  ExpectRefused(CheckGenerateRequest(r, Limits()),
                "GenerateRequest.max_new_tokens is 65; expected 1 <= max_new_tokens <= 64 "
                "(--max_generate_new_tokens)");
  r.set_max_new_tokens(0);
  ExpectRefused(CheckGenerateRequest(r, Limits()), "max_new_tokens is 0");
  r.set_max_new_tokens(-2147483647 - 1);
  ExpectRefused(CheckGenerateRequest(r, Limits()), "max_new_tokens is -2147483648");
  RequestLimits short_model = Limits();
  short_model.max_positions = 10;
  r.set_max_new_tokens(9);
  ExpectRefused(CheckGenerateRequest(r, short_model), "exceeds max_position_embeddings 10");
}

}  // namespace
}  // namespace e3
