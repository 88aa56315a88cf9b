// Export of the EAGLE-3 draft as a Hugging Face folder that SGLang and vLLM
// load as an EAGLE-3 draft (DESIGN.md "Export"), and the loader that reads
// such a folder back into a draft (resume, evaluation).
//
// config.json: a Llama config with architectures ["LlamaForCausalLMEagle3"],
// num_hidden_layers 1, the target's vocab_size, draft_vocab_size,
// target_hidden_size, tie_word_embeddings false, the target's rope in the
// transformers-4 layout (rope_theta + rope_scaling), the aux layers in
// each engine's own key and numbering, and the target it was trained for
// ("e3_target": name or path, architecture, layers, config.json's SHA-256).
//
// The aux layers are trained on "output of decoder layer i" (transformers'
// hidden_states[i + 1]), and each engine reads them differently
// (docs/decisions/0010-draft-export.md):
//   - SGLang reads eagle_config.eagle_aux_hidden_state_layer_ids in that
//     numbering and captures id i at the input of layer i + 1;
//   - vLLM reads a top-level eagle_aux_hidden_state_layer_ids in its own
//     numbering, id j = the state entering layer j (the output of layer
//     j - 1), and ignores eagle_config: the top-level key holds i + 1.
//
// model.safetensors: the 13 trainable weights under their export names in
// the chosen dtype, plus d2t (I64) and t2d (BOOL); never embed_tokens (the
// serving engine shares the target's).
#ifndef E3_STUDENT_TRAINER_DRAFT_DRAFT_EXPORT_H_
#define E3_STUDENT_TRAINER_DRAFT_DRAFT_EXPORT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/safetensors.h"
#include "common/torch/torch_core.h"
#include "nlohmann/json.hpp"
#include "student_trainer/draft/eagle3_draft.h"

namespace e3 {

inline constexpr char kDraftWeightsFile[] = "model.safetensors";


// What every draft's export writes alike: the config's "torch_dtype" name
// of `dtype` (bf16, fp16 or fp32; else InvalidArgument), and the target's
// rope as the "rope_scaling" transformers 4.x writes and SGLang and vLLM
// read (null for the default rope).
absl::StatusOr<std::string> TorchDtypeName(at::ScalarType dtype);
nlohmann::json RopeScalingJson(const RopeConfig& rope);
// A loaded export trained for another target than the draft's (by the
// hash of its config.json): refused for a resume, a warning for a warm
// start. Either side unknown passes.
absl::Status CheckSameTarget(const TargetIdentity& file, const TargetIdentity& mine, const std::string& path,
                             OtherTarget other_target);

// The config.json text for `config` with weights in `dtype`, plus `extra`.
absl::StatusOr<std::string> DraftConfigJson(const Eagle3DraftConfig& config, at::ScalarType dtype,
                                            const nlohmann::json& extra = nlohmann::json::object());

// Writes config.json and model.safetensors into `dir` (created if absent;
// existing files are replaced atomically).
absl::Status ExportDraft(const Eagle3DraftImpl& draft, const std::string& dir,
                         const DraftExportOptions& options = {});

// Parses an exported config.json back into a draft config (dims, rope,
// vocab sizes, aux ids). Errors name the file and the field.
absl::StatusOr<Eagle3DraftConfig> ReadDraftConfig(const std::string& config_json_path);

// Copies the trainable weights of `file` into `draft` (converted to its
// dtype and device) after checking every name and shape. When the file
// holds d2t/t2d they must equal the draft's: its target head rows were
// chosen with its own map. Errors name the file and the tensor. Every check
// precedes the first copy, so a file that fails leaves the draft as it was.
absl::Status LoadDraftWeights(Eagle3DraftImpl& draft, const SafetensorsFile& file);

// Reads an ExportDraft folder into `draft`: config.json must describe the
// same shapes (dims, heads, vocab sizes, rope type) and aux layers, then
// LoadDraftWeights.
absl::Status LoadDraftExport(Eagle3DraftImpl& draft, const std::string& dir,
                             OtherTarget other_target = OtherTarget::kRefuse);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_DRAFT_DRAFT_EXPORT_H_
