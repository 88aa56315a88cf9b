#include "common/stream/feature_request.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace e3 {

FeatureRequest EveryFeature(const std::vector<int32_t>& captured) {
  FeatureRequest r;
  r.aux_layer_ids = captured;
  return r;
}

std::string AuxLayersText(const std::vector<int32_t>& ids) { return absl::StrJoin(ids, ","); }

std::string FeatureTensorsText(const FeatureRequest& request) {
  std::vector<std::string> names;
  if (!request.aux_layer_ids.empty()) names.push_back("aux_hidden");
  if (request.last_hidden) names.push_back("last_hidden");
  if (request.target_argmax) names.push_back("target_argmax");
  return names.empty() ? std::string("none") : absl::StrJoin(names, ",");
}

absl::StatusOr<std::vector<int64_t>> AuxPositions(const std::vector<int32_t>& wanted,
                                                  const std::vector<int32_t>& captured) {
  std::vector<int64_t> positions;
  std::vector<int32_t> missing;
  for (int32_t id : wanted) {
    const auto it = std::find(captured.begin(), captured.end(), id);
    if (it == captured.end()) {
      if (std::find(missing.begin(), missing.end(), id) == missing.end()) missing.push_back(id);
      continue;
    }
    positions.push_back(it - captured.begin());
  }
  if (missing.empty()) return positions;
  return absl::FailedPreconditionError(absl::StrCat(
      "the draft reads aux layers [", absl::StrJoin(wanted, ", "), "], but the teacher does not capture [",
      absl::StrJoin(missing, ", "), "]: it captures [", absl::StrJoin(captured, ", "),
      "]; start the teacher with these layers too (--aux_layer_ids, --extra_aux_layer_ids or "
      "--serve_algorithms), or give the student the teacher's (--aux_layer_ids)"));
}

DataFingerprint WithFeaturePlan(DataFingerprint stream, const FeatureRequest& request) {
  if (stream.empty()) return stream;
  stream.aux_layers = AuxLayersText(request.aux_layer_ids);
  stream.features = FeatureTensorsText(request);
  return stream;
}

}  // namespace e3
