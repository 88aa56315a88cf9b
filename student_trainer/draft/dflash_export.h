// Export of the DFlash draft as the folder SGLang (--speculative-algorithm
// DFLASH) and vLLM ("method": "dflash") load, and its loader:
//   config.json  "architectures": ["DFlashDraftModel"], model_type qwen3,
//                the Qwen3 dims, "block_size", "num_target_layers",
//                "layer_types" (every layer full attention: non-causal in
//                both engines, as trained), "dflash_config" with
//                "mask_token_id", "target_layer_ids" and "block_size", and
//                the target the draft was trained for ("e3_target");
//   model.safetensors  fc, hidden_norm, layers.N.*, norm, with no
//                "model." prefix (vLLM adds it) and no embedding or head
//                (both engines take the target's).
// target_layer_ids count "output of decoder layer i", the loaders' own
// numbering (SGLang and vLLM capture the input of layer i + 1).
#ifndef E3_STUDENT_TRAINER_DRAFT_DFLASH_EXPORT_H_
#define E3_STUDENT_TRAINER_DRAFT_DFLASH_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "student_trainer/draft/dflash_draft.h"

namespace e3 {

inline constexpr char kDFlashArchitecture[] = "DFlashDraftModel";

// The config.json text for `config` with weights in `dtype`, plus `extra`.
absl::StatusOr<std::string> DFlashConfigJson(const DFlashDraftConfig& config, at::ScalarType dtype,
                                             const nlohmann::json& extra = nlohmann::json::object());

// Reads an exported config.json back; errors name the file and the field.
absl::StatusOr<DFlashDraftConfig> ReadDFlashConfig(const std::string& config_json_path);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_DRAFT_DFLASH_EXPORT_H_
