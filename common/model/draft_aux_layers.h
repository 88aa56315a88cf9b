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
#include "common/model/model_config.h"
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

// The layers a draft of `algorithm` (draft.algorithm) reads from `target`
// by default: EAGLE-3's (and 3.1's) [1, L/2-1, L-4], DFlash's
// `dflash_layers` spread over 1..L-3.
std::vector<int32_t> DefaultDraftAuxLayerIds(const std::string& algorithm, int64_t dflash_layers,
                                             const ModelConfig& target);

// The layers a draft reads, in the order it concatenates them: `configured`
// (draft.aux_layer_ids) when given; else those the draft export in
// `init_from` (a warm start) names; else its algorithm's default. Both
// services call it with the same settings: the student asks for these,
// the teacher captures them. InvalidArgument when an id is not one
// `target` can serve (CheckAuxLayerIds), naming draft.aux_layer_ids.
absl::StatusOr<std::vector<int32_t>> DraftAuxLayerIds(const std::string& algorithm,
                                                      const std::vector<int64_t>& configured,
                                                      const std::string& init_from, int64_t dflash_layers,
                                                      const ModelConfig& target);

// Every layer of `lists`, once: the first list in its own order (what a
// subscriber without a request receives keeps that order), then the
// others' layers ascending.
std::vector<int32_t> AuxLayerUnion(const std::vector<std::vector<int32_t>>& lists);

}  // namespace e3

#endif  // E3_COMMON_MODEL_DRAFT_AUX_LAYERS_H_
