// Each subscriber receives its own slice of what the teacher captures: the
// aux states of its layers in its order (the same values as the captured
// ones, picked out) and only the tensors it asked for; a layer the
// teacher does not capture, or a cursor made under another plan, is
// refused before the subscription changes anything. Also the captured
// set itself: the union of what the run config's drafts read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "teacher_server/engine/captured_layers.h"
#include "teacher_server/engine/engine.h"
#include "teacher_server/models/aux_capture.h"
#include "tests/teacher_server/engine/engine_world.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// rand_default_mha: 6 layers of hidden size 64, three of them captured.
EngineOptions CapturingThreeLayers() {
  EngineOptions o;
  o.tokens_per_batch = 120;
  o.aux_layer_ids = {0, 2, 4};
  o.transports = {TransportKind::kInline};
  o.shm_prefix = "/e3featuretest";
  return o;
}

// The named tensor of a host payload as a tensor (a copy).
at::Tensor PayloadTensorNamed(const PayloadBuffer& p, const std::string& name, at::ScalarType type) {
  for (const PayloadTensor& t : p.tensors()) {
    if (t.name == name) {
      return torch::from_blob(const_cast<uint8_t*>(p.data() + t.offset), t.shape, torch::TensorOptions().dtype(type))
          .clone();
    }
  }
  ADD_FAILURE() << "no tensor " << name;
  return at::Tensor();
}

std::vector<std::string> TensorNames(const PayloadBuffer& p) {
  std::vector<std::string> names;
  for (const PayloadTensor& t : p.tensors()) names.push_back(t.name);
  return names;
}

SubscribeParams FirstBatchOf(const std::string& id, std::optional<FeatureRequest> features) {
  SubscribeParams p;
  p.subscriber_id = id;
  p.credit_window = 1;
  p.features = std::move(features);
  return p;
}

TEST(BatchFeaturesTest, ASubscriberGetsItsLayersInItsOrderAndOnlyItsTensors) {
  testing::EngineWorld w = testing::MakeEngineWorld(12, /*seed=*/5);
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), CapturingThreeLayers());
  ASSERT_TRUE(engine.ok()) << engine.status();
  // An older student, without a request: everything, as before.
  const uint64_t all_gen = (*engine)->Subscribe(FirstBatchOf("everything", std::nullopt)).value();
  const ReadyBatch all = testing::NextBatch(**engine, 0, all_gen);
  ASSERT_NE(all.payload, nullptr);
  EXPECT_EQ(TensorNames(*all.payload), (std::vector<std::string>{"input_ids", "cu_seqlens", "loss_mask", "aux_hidden",
                                                                 "last_hidden", "target_argmax"}));
  // The same batch for a student reading layers 4 then 0, and the argmax.
  FeatureRequest mine;
  mine.aux_layer_ids = {4, 0};
  mine.last_hidden = false;
  const uint64_t mine_gen = (*engine)->Subscribe(FirstBatchOf("mine", mine)).value();
  const ReadyBatch b = testing::NextBatch(**engine, 0, mine_gen);
  ASSERT_NE(b.payload, nullptr);
  ASSERT_EQ(b.sample_ids, all.sample_ids);
  EXPECT_EQ(TensorNames(*b.payload),
            (std::vector<std::string>{"input_ids", "cu_seqlens", "loss_mask", "aux_hidden", "target_argmax"}));
  const int64_t T = b.num_tokens;
  const at::Tensor every = PayloadTensorNamed(*all.payload, "aux_hidden", at::kFloat);
  const at::Tensor own = PayloadTensorNamed(*b.payload, "aux_hidden", at::kFloat);
  ASSERT_EQ(own.sizes(), (std::vector<int64_t>{T, 2 * 64}));
  // Captured order is [0, 2, 4]: layer 4 is the third block, layer 0 the first.
  EXPECT_TRUE(torch::equal(own.narrow(1, 0, 64), every.narrow(1, 128, 64)));
  EXPECT_TRUE(torch::equal(own.narrow(1, 64, 64), every.narrow(1, 0, 64)));
  EXPECT_TRUE(torch::equal(PayloadTensorNamed(*b.payload, "target_argmax", at::kInt),
                           PayloadTensorNamed(*all.payload, "target_argmax", at::kInt)));
  EXPECT_LT(b.payload->total_bytes(), all.payload->total_bytes());
}

TEST(BatchFeaturesTest, SelectingEveryLayerInOrderCopiesNothing) {
  const at::Tensor aux = torch::arange(2 * 3 * 4, torch::kFloat).view({2, 12});
  EXPECT_TRUE(EveryAuxLayer({0, 1, 2}, 3));
  EXPECT_FALSE(EveryAuxLayer({0, 2}, 3));
  EXPECT_FALSE(EveryAuxLayer({2, 1, 0}, 3));
  EXPECT_EQ(SelectAuxStates(aux, 3, {0, 1, 2}).data_ptr(), aux.data_ptr());
  const at::Tensor picked = SelectAuxStates(aux, 3, {2, 2, 0});
  ASSERT_EQ(picked.sizes(), (std::vector<int64_t>{2, 12}));
  EXPECT_TRUE(torch::equal(picked[1].narrow(0, 0, 4), aux[1].narrow(0, 8, 4)));
  EXPECT_TRUE(torch::equal(picked[1].narrow(0, 8, 4), aux[1].narrow(0, 0, 4)));
  EXPECT_EQ(SelectAuxStates(aux, 3, {}).sizes(), (std::vector<int64_t>{2, 0}));
}

TEST(BatchFeaturesTest, ALayerNotCapturedIsRefusedBeforeAnythingChanges) {
  testing::EngineWorld w = testing::MakeEngineWorld(12, /*seed=*/5);
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), CapturingThreeLayers());
  ASSERT_TRUE(engine.ok()) << engine.status();
  FeatureRequest other;
  other.aux_layer_ids = {0, 1, 2};
  auto refused = (*engine)->Subscribe(FirstBatchOf("other", other));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("does not capture [1]: it captures [0, 2, 4]"));
  EXPECT_EQ((*engine)->world_size(), 0) << "a refused subscription fixed the world";
}

TEST(BatchFeaturesTest, ACursorOfAnotherPlanIsRefused) {
  testing::EngineWorld w = testing::MakeEngineWorld(12, /*seed=*/5);
  EngineOptions o = CapturingThreeLayers();
  o.fingerprint.dataset = "1111111111111111";
  o.fingerprint.samples = "2222222222222222";
  o.fingerprint.draft_vocab = "3333333333333333";
  const DataFingerprint stream = o.fingerprint;
  o.fingerprint = WithFeaturePlan(o.fingerprint, EveryFeature(o.aux_layer_ids));
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  FeatureRequest dflash;
  dflash.aux_layer_ids = {2, 4};
  dflash.last_hidden = false;
  // Its checkpoint's cursor was made while it read everything.
  SubscribeParams p = FirstBatchOf("dflash", dflash);
  p.fingerprint = WithFeaturePlan(stream, EveryFeature({0, 2, 4}));
  auto refused = (*engine)->Subscribe(p);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("aux layers the draft reads (--aux_layer_ids, --draft_algorithm): cursor 0,2,4, this "
                        "subscription 2,4"));
  // Under its own plan, or from a cursor written before plans were
  // recorded, it subscribes.
  p.fingerprint = WithFeaturePlan(stream, dflash);
  EXPECT_TRUE((*engine)->Subscribe(p).ok());
  p.fingerprint = stream;
  EXPECT_TRUE((*engine)->Subscribe(p).ok());
  // An older student presents GetInfo's fingerprint: the plan of everything.
  SubscribeParams older = FirstBatchOf("older", std::nullopt);
  older.fingerprint = o.fingerprint;
  EXPECT_TRUE((*engine)->Subscribe(older).ok());
}

// The run config's drafts: an EAGLE-3 default group and DFlash students of
// two layers on an 8-layer target, with one more layer asked for.
TEST(CapturedLayersTest, TheUnionOfWhatTheServedDraftsRead) {
  ModelConfig target;
  target.num_hidden_layers = 8;
  RunConfig c;
  auto own = CapturedLayers(c, target);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(*own, (std::vector<int32_t>{1, 3, 4}));
  c.teachers.serve_algorithms = {"dflash"};
  c.draft.dflash_layers = 2;
  c.teachers.extra_aux_layer_ids = {0};
  auto all = CapturedLayers(c, target);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, (std::vector<int32_t>{1, 3, 4, 0, 5}));
  c.draft.aux_layer_ids = {5, 1};
  EXPECT_EQ(CapturedLayers(c, target).value(), (std::vector<int32_t>{5, 1, 0}));

  c.teachers.serve_algorithms = {"medusa"};
  auto unknown = CapturedLayers(c, target);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("teachers.serve_algorithms (--serve_algorithms)"));
  c.teachers.serve_algorithms = {};
  c.teachers.extra_aux_layer_ids = {7};
  auto last = CapturedLayers(c, target);
  EXPECT_EQ(last.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(last.status().message()), HasSubstr("teachers.extra_aux_layer_ids (--extra_aux_layer_ids)"));
}

}  // namespace
}  // namespace e3
