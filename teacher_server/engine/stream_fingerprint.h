// The fingerprint of the data stream this teacher serves
// (common/stream/data_fingerprint.h): hashes of the data file, the chat template
// and the tokenized samples of its shard, the draft vocab, and the order,
// sharding and batching settings. Computed once at startup.
#ifndef E3_TEACHER_SERVER_ENGINE_STREAM_FINGERPRINT_H_
#define E3_TEACHER_SERVER_ENGINE_STREAM_FINGERPRINT_H_

#include "absl/status/statusor.h"
#include "common/stream/data_fingerprint.h"
#include "teacher_server/data/data_setup.h"
#include "teacher_server/engine/engine.h"

namespace e3 {

// NotFound naming the file when o.data cannot be read.
absl::StatusOr<DataFingerprint> StreamFingerprint(const TeacherDataOptions& o, const TeacherData& served,
                                                  const EngineOptions& engine);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_ENGINE_STREAM_FINGERPRINT_H_
