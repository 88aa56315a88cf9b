// What defines a teacher's data stream, so that a cursor {epoch,
// next_batch} names the same samples on both sides of a restart: batch k
// of epoch e is a function of the samples served (the data file, the chat
// template, cutting and sharding), their order (the data seed), the
// batching (the token budget) and the draft vocab the student's head was
// built for, and what the subscriber reads of each batch (its feature
// plan). The teacher announces it (GetInfo, with the plan of a subscriber
// that asks for everything), the student keeps it with each cursor in its
// checkpoint and presents it at Subscribe, and a teacher serving other
// data, or a plan other than the cursor's, refuses the cursor, naming
// what differs, instead of serving other samples under the same batch ids.
#ifndef E3_COMMON_STREAM_DATA_FINGERPRINT_H_
#define E3_COMMON_STREAM_DATA_FINGERPRINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace e3 {

struct DataFingerprint {
  std::string dataset;        // the --data file's bytes (FNV-1a, hex)
  std::string chat_template;  // the template text, its variables and the loss-mask options
  std::string samples;        // the tokenized samples this teacher serves (ids and loss masks)
  uint64_t data_seed = 0;
  int64_t epochs = 0;
  int32_t num_data_shards = 0;
  int32_t data_shard = 0;
  int64_t tokens_per_batch = 0;
  std::string draft_vocab;  // d2t
  // The subscriber's plan (common/stream/feature_request.h): the layers
  // whose states its batches carry, in its order ("1,3,4"), and the
  // tensors ("aux_hidden,target_argmax"). A draft trained on one plan
  // resumed under another would learn from other features. Empty in
  // cursors written before each was recorded; then not compared.
  std::string aux_layers;
  std::string features;

  // No fingerprint: a student with no cursor yet, or a checkpoint written
  // before cursors carried one. It matches any teacher.
  bool empty() const { return dataset.empty() && samples.empty() && draft_vocab.empty(); }
};

// The field groups of `cursor` that differ from `teacher`'s, each as
// "<what> (<flags>): cursor <a>, teacher <b>"; empty when they agree.
std::vector<std::string> FingerprintDifferences(const DataFingerprint& cursor, const DataFingerprint& teacher);

// FailedPrecondition naming every differing group unless the two agree or
// either is empty. `who` names the cursor's owner and position for the
// message ("subscriber rank-0's cursor 0:12").
absl::Status CheckSameDataStream(const DataFingerprint& cursor, const DataFingerprint& teacher,
                                 const std::string& who);

nlohmann::json FingerprintToJson(const DataFingerprint& f);
// `where` prefixes errors ("ckpt/trainer_state.json: cursors[0].fingerprint").
// DataLoss when a field has the wrong type; absent fields stay empty.
absl::StatusOr<DataFingerprint> FingerprintFromJson(const nlohmann::json& j, const std::string& where);

// 16 hex digits of FNV-1a over `bytes`, the form the string fields take.
std::string FingerprintHex(uint64_t hash);

}  // namespace e3

#endif  // E3_COMMON_STREAM_DATA_FINGERPRINT_H_
