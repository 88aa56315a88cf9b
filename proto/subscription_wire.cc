#include "proto/subscription_wire.h"

#include "absl/strings/numbers.h"

namespace e3 {

v1::DataFingerprint FingerprintToWire(const DataFingerprint& f) {
  v1::DataFingerprint w;
  w.set_dataset(f.dataset);
  w.set_chat_template(f.chat_template);
  w.set_samples(f.samples);
  w.set_data_seed(f.data_seed);
  w.set_epochs(f.epochs);
  w.set_num_data_shards(f.num_data_shards);
  w.set_data_shard(f.data_shard);
  w.set_tokens_per_batch(f.tokens_per_batch);
  w.set_draft_vocab(f.draft_vocab);
  w.set_aux_layers(f.aux_layers);
  w.set_features(f.features);
  return w;
}

DataFingerprint FingerprintFromWire(const v1::DataFingerprint& w) {
  DataFingerprint f;
  f.dataset = w.dataset();
  f.chat_template = w.chat_template();
  f.samples = w.samples();
  f.data_seed = w.data_seed();
  f.epochs = w.epochs();
  f.num_data_shards = w.num_data_shards();
  f.data_shard = w.data_shard();
  f.tokens_per_batch = w.tokens_per_batch();
  f.draft_vocab = w.draft_vocab();
  f.aux_layers = w.aux_layers();
  f.features = w.features();
  return f;
}

v1::FeatureRequest FeatureRequestToWire(const FeatureRequest& r) {
  v1::FeatureRequest w;
  for (int32_t id : r.aux_layer_ids) w.add_aux_layer_ids(id);
  w.set_last_hidden(r.last_hidden);
  w.set_target_argmax(r.target_argmax);
  return w;
}

FeatureRequest FeatureRequestFromWire(const v1::FeatureRequest& w) {
  FeatureRequest r;
  r.aux_layer_ids.assign(w.aux_layer_ids().begin(), w.aux_layer_ids().end());
  r.last_hidden = w.last_hidden();
  r.target_argmax = w.target_argmax();
  return r;
}

std::optional<uint64_t> ParseSubscriptionGeneration(const std::string& value) {
  uint64_t g = 0;
  if (!absl::SimpleAtoi(value, &g) || g == 0) return std::nullopt;
  return g;
}

}  // namespace e3
