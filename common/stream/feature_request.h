// What a student's draft algorithm reads from every batch, declared when
// it subscribes (DESIGN.md, "Draft algorithms"): the aux states of its
// layers, in the order it concatenates them, and which of the target's
// other tensors. input_ids, cu_seqlens and loss_mask always travel. The
// teacher captures a fixed set of layers and sends each subscriber only
// its own slice of them; the plan is part of the data fingerprint the
// subscriber's cursor carries, so a resume under another plan is refused
// (docs/decisions/0065-feature-subscriptions.md).
#ifndef E3_COMMON_STREAM_FEATURE_REQUEST_H_
#define E3_COMMON_STREAM_FEATURE_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/stream/data_fingerprint.h"

namespace e3 {

struct FeatureRequest {
  // The layers whose outputs aux_hidden holds, in this order ("output of
  // decoder layer i"); empty: no aux_hidden.
  std::vector<int32_t> aux_layer_ids;
  bool last_hidden = true;    // the final post-norm hidden state
  bool target_argmax = true;  // the target's full-vocab argmax

  bool operator==(const FeatureRequest& o) const {
    return aux_layer_ids == o.aux_layer_ids && last_hidden == o.last_hidden && target_argmax == o.target_argmax;
  }
};

// What a subscriber without a request receives: every captured layer, in
// capture order, and every tensor.
FeatureRequest EveryFeature(const std::vector<int32_t>& captured);

// The layer list as fingerprints and logs spell it: "1,3,4".
std::string AuxLayersText(const std::vector<int32_t>& ids);
// The tensors a plan ships besides ids and masks, in payload order:
// "aux_hidden,last_hidden,target_argmax" (the fingerprint's `features`).
std::string FeatureTensorsText(const FeatureRequest& request);

// Where each of `wanted` sits among `captured`, in wanted's order.
// FailedPrecondition naming the layers `captured` lacks and what it holds.
absl::StatusOr<std::vector<int64_t>> AuxPositions(const std::vector<int32_t>& wanted,
                                                  const std::vector<int32_t>& captured);

// The fingerprint of what a subscriber with `request` receives from the
// data stream `stream` fingerprints: the stream's fields with the plan's
// layers and tensors. An empty fingerprint (no stream named) stays empty.
DataFingerprint WithFeaturePlan(DataFingerprint stream, const FeatureRequest& request);

}  // namespace e3

#endif  // E3_COMMON_STREAM_FEATURE_REQUEST_H_
