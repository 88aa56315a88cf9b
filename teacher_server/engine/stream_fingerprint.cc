#include "teacher_server/engine/stream_fingerprint.h"

#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/fnv1a.h"
#include "common/base/status_macros.h"
#include "common/stream/feature_request.h"

namespace e3 {
namespace {

template <typename T>
uint64_t HashVector(const std::vector<T>& v, uint64_t h) {
  return Fnv1a(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)), h);
}

}  // namespace

absl::StatusOr<DataFingerprint> StreamFingerprint(const TeacherDataOptions& o, const TeacherData& served,
                                                  const EngineOptions& engine) {
  DataFingerprint f;
  E3_ASSIGN_OR_RETURN(const std::string bytes, ReadFileToString(o.data));
  f.dataset = FingerprintHex(Fnv1a(bytes, kFingerprintSeed));
  // The mask options change the samples without changing the template.
  const std::string tmpl = served.chat_template.has_value() ? served.chat_template->fingerprint() : "none";
  f.chat_template = FingerprintHex(Fnv1a(absl::StrCat(tmpl, "|reasoning=", o.chat_template.train_reasoning,
                                                      "|all_tokens=", o.train_on_all_tokens),
                                         kFingerprintSeed));
  // Each sample's length goes in too, so that two packings of the same
  // tokens into samples differ.
  uint64_t h = kFingerprintSeed;
  for (const Sample& s : served.dataset->samples()) {
    h = Fnv1a(absl::StrCat(s.size(), ":"), h);
    h = HashVector(s.input_ids, h);
    h = HashVector(s.loss_mask, h);
  }
  f.samples = FingerprintHex(h);
  f.data_seed = engine.seed;
  f.epochs = engine.epochs;
  f.num_data_shards = o.num_data_shards;
  f.data_shard = o.data_shard;
  f.tokens_per_batch = engine.tokens_per_batch;
  f.draft_vocab = FingerprintHex(HashVector(served.vocab.d2t, kFingerprintSeed));
  // The plan of a subscriber that asks for everything (an older student):
  // a subscriber with a request presents its own (WithFeaturePlan).
  return WithFeaturePlan(f, EveryFeature(engine.aux_layer_ids));
}

}  // namespace e3
