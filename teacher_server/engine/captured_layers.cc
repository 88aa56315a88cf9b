#include "teacher_server/engine/captured_layers.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/draft_aux_layers.h"

namespace e3 {
namespace {

bool KnownAlgorithm(const std::string& name) { return name == "eagle3" || name == "eagle3.1" || name == "dflash"; }

}  // namespace

absl::StatusOr<std::vector<int32_t>> CapturedLayers(const RunConfig& config, const ModelConfig& model) {
  const DraftSettings& draft = config.draft;
  const TeachersSettings& teachers = config.teachers;
  std::vector<std::vector<int32_t>> lists;
  E3_ASSIGN_OR_RETURN(std::vector<int32_t> own, DraftAuxLayerIds(draft.algorithm, draft.aux_layer_ids, draft.init_from,
                                                                 draft.dflash_layers, model));
  lists.push_back(std::move(own));
  for (const std::string& algorithm : teachers.serve_algorithms) {
    if (!KnownAlgorithm(algorithm)) {
      return absl::InvalidArgumentError(absl::StrCat("teachers.serve_algorithms (--serve_algorithms) names \"",
                                                     algorithm, "\"; expected eagle3, eagle3.1 or dflash"));
    }
    lists.push_back(DefaultDraftAuxLayerIds(algorithm, draft.dflash_layers, model));
  }
  std::vector<int32_t> extra;
  for (int64_t id : teachers.extra_aux_layer_ids) {
    if (id > model.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("teachers.extra_aux_layer_ids (--extra_aux_layer_ids): ", id, " is not a layer of this model; "
                       "expected ids in [0, ", model.num_hidden_layers - 2, "]"));
    }
    extra.push_back(static_cast<int32_t>(id));
  }
  if (absl::Status s = CheckAuxLayerIds(extra, model.num_hidden_layers); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("teachers.extra_aux_layer_ids (--extra_aux_layer_ids) [",
                                                   absl::StrJoin(extra, ", "), "]: ", s.message()));
  }
  lists.push_back(std::move(extra));
  return AuxLayerUnion(lists);
}

}  // namespace e3
