// The aux layers in a draft's config.json, in the keys and numberings the
// serving engines read (student_trainer/draft/draft_export.h writes them):
// eagle_config.eagle_aux_hidden_state_layer_ids counts "output of decoder
// layer i" (SGLang's), the top-level eagle_aux_hidden_state_layer_ids
// counts "the state entering layer j" (vLLM's), j = i + 1. Both services
// read them: the student to resume or warm-start a draft, the teacher to
// capture the layers a warm-started draft was trained on.
#ifndef E3_COMMON_MODEL_DRAFT_AUX_LAYERS_H_
#define E3_COMMON_MODEL_DRAFT_AUX_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace e3 {

// Our ids in vLLM's numbering.
std::vector<int32_t> VllmAuxLayerIds(const std::vector<int32_t>& ids);

// The ids of `config` (a draft's parsed config.json, read from `path`):
// eagle_config's list, checked against the top-level one when both are
// there; a DFlash export's dflash_config.target_layer_ids (the same
// numbering) where it has them. Empty when neither is there.
// InvalidArgument naming the file and field otherwise.
absl::StatusOr<std::vector<int32_t>> ReadDraftAuxLayerIds(const nlohmann::json& config, const std::string& path);
// The same from the file `config_json_path`.
absl::StatusOr<std::vector<int32_t>> ReadDraftAuxLayerIds(const std::string& config_json_path);

// The layers a DFlash draft of `num_draft_layers` layers reads by default
// (SpecForge's recipes): spread evenly over 1..L-3, ties rounded to even
// as Python's round(); one layer reads L/2. Qwen3-8B (L = 36) with 5
// gives [1, 9, 17, 25, 33].
std::vector<int32_t> DFlashTargetLayerIds(int64_t num_target_layers, int64_t num_draft_layers);

}  // namespace e3

#endif  // E3_COMMON_MODEL_DRAFT_AUX_LAYERS_H_
