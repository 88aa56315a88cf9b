// What any draft model is to the parts of the student that do not know its
// algorithm: the optimizer and master weights (its parameters, as one flat
// buffer), data parallelism, checkpoints and resume, the best-draft export
// and the acceptance measurement. Each algorithm's model implements it
// (eagle3_draft.h); a new algorithm's model does too, and every one of
// those parts takes it unchanged.
#ifndef E3_STUDENT_TRAINER_DRAFT_DRAFT_MODEL_H_
#define E3_STUDENT_TRAINER_DRAFT_DRAFT_MODEL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"
#include "nlohmann/json.hpp"
#include "student_trainer/draft/flat_parameters.h"
#include "student_trainer/feed/eval_batch.h"

namespace e3 {

// Every export is a Hugging Face folder: this file, and the weights.
inline constexpr char kDraftConfigFile[] = "config.json";

struct DraftExportOptions {
  at::ScalarType dtype = at::kBFloat16;  // of the trained weights (float types only)
  // Extra top-level config.json fields (e.g. the best export's "e3_best").
  nlohmann::json extra = nlohmann::json::object();
};

// What loading an export does when it names another target than the
// draft's: a resume refuses it (its stream would be another model's), a
// warm start says so and goes on (a draft may seed training for a model
// of the same shape).
enum class OtherTarget { kRefuse, kWarn };

class DraftModel : public torch::nn::Module {
 public:
  // The trainable parameters under their export names, in a fixed order.
  virtual std::vector<std::pair<std::string, at::Tensor>> ExportedParameters() const = 0;
  // The same parameters as views of one flat buffer with a flat gradient
  // (flat_parameters.h): the fused optimizer and the master weights work
  // on it.
  virtual FlatParameters& flat() = 0;
  virtual const FlatParameters& flat() const = 0;
  // Where the draft computes.
  virtual at::Device device() const = 0;
  // The target's input embedding the draft reads, frozen: [V, H_t].
  virtual const at::Tensor& target_embed_tokens() const = 0;
  // The target's lm_head the draft's proposals are read through, frozen,
  // [V, H_t], where the draft has no head of its own (DFlash: the serving
  // engines take the target's, so the export holds none); undefined where
  // the draft's own exported lm_head proposes (EAGLE-3).
  virtual const at::Tensor& target_lm_head() const = 0;

  // Writes the layout the serving engines load into `dir`.
  virtual absl::Status Export(const std::string& dir, const DraftExportOptions& options) const = 0;
  // Reads an Export back. What the export must match (shapes, the
  // algorithm's own settings, the target) is checked before the first
  // copy: a checkpoint of another draft is refused, never half-loaded.
  virtual absl::Status LoadExport(const std::string& dir, OtherTarget other_target) = 0;

  // The tokens (target ids) a serving engine's speculation round from each
  // row of `batch` would propose, `length` of them: [T, length] int64 on
  // the host (eval/acceptance.h plays the verify rounds with them).
  virtual absl::StatusOr<at::Tensor> ProposeChains(const EvalBatch& batch, int64_t length) = 0;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_DRAFT_DRAFT_MODEL_H_
