// What a subscription carries besides batches: the data fingerprint its
// cursor belongs to (common/stream/data_fingerprint.h), the features the
// subscriber reads (common/stream/feature_request.h) and the generation
// that fences a superseded subscriber's Acks. Shared by the teacher service and
// the student client, so both spell them the same.
#ifndef E3_PROTO_SUBSCRIPTION_WIRE_H_
#define E3_PROTO_SUBSCRIPTION_WIRE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "common/stream/data_fingerprint.h"
#include "common/stream/feature_request.h"
#include "proto/teacher.pb.h"

namespace e3 {

// The Subscribe stream's initial-metadata key holding the generation.
inline constexpr char kSubscriptionGenerationKey[] = "e3-subscription-generation";

v1::DataFingerprint FingerprintToWire(const DataFingerprint& f);
DataFingerprint FingerprintFromWire(const v1::DataFingerprint& w);

v1::FeatureRequest FeatureRequestToWire(const FeatureRequest& r);
FeatureRequest FeatureRequestFromWire(const v1::FeatureRequest& w);

// The generation in a metadata value; nullopt unless it is a decimal > 0.
std::optional<uint64_t> ParseSubscriptionGeneration(const std::string& value);

}  // namespace e3

#endif  // E3_PROTO_SUBSCRIPTION_WIRE_H_
