// The layers a teacher captures in every forward: what the students it
// serves read, as the run config says. Each subscriber then receives its
// own of them (common/stream/feature_request.h), so the set is the union
// of its students' plans, fixed at launch
// (docs/decisions/0065-feature-subscriptions.md).
#ifndef E3_TEACHER_SERVER_ENGINE_CAPTURED_LAYERS_H_
#define E3_TEACHER_SERVER_ENGINE_CAPTURED_LAYERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_config.h"
#include "common/model/model_config.h"

namespace e3 {

// The layers draft.algorithm's students read (draft.aux_layer_ids, a warm
// start's, or the algorithm's default), in their order; then, once each
// and ascending, the default layers of every algorithm in
// teachers.serve_algorithms and teachers.extra_aux_layer_ids.
// InvalidArgument naming the setting when an algorithm is unknown or a
// layer is not one `model` can serve.
absl::StatusOr<std::vector<int32_t>> CapturedLayers(const RunConfig& config, const ModelConfig& model);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_ENGINE_CAPTURED_LAYERS_H_
