// A draft algorithm, as the trainer loop sees it: what it needs from the
// teacher, its model and optimizer, one training step (its batch planning,
// loss and metrics inside), and its model as the algorithm-free parts take
// it (draft_model.h: checkpoints, resume, the best-draft and final
// exports, the acceptance measurement).
//
// Adding an algorithm is one implementation of this interface in this
// folder, one name in CreateDraftAlgorithm, and its settings as rows of
// the draft section (common/config/settings.h); the trainer loop does not
// change (docs/decisions/0059-draft-algorithm-seam.md).
#ifndef E3_STUDENT_TRAINER_ALGORITHM_DRAFT_ALGORITHM_H_
#define E3_STUDENT_TRAINER_ALGORITHM_DRAFT_ALGORITHM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_config.h"
#include "common/model/model_config.h"
#include "common/stream/feature_request.h"
#include "common/torch/process_group.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/draft_model.h"
#include "student_trainer/feed/teacher_batch.h"
#include "student_trainer/feed/teacher_client.h"
#include "student_trainer/optim/draft_optimizer.h"

namespace e3 {

// What an algorithm asks of the teacher: what each batch carries besides
// the ids and the loss mask (its feature request: the aux layers in the
// order it reads them, the last hidden state, the target argmax), and
// which frozen weights. The target's distribution is the student's own
// work: last_hidden through the target head, whose rows outside the draft
// vocab come with target_head_rest.
struct TeacherNeeds {
  FeatureRequest features;
  // The target head's rows outside the draft vocab, with the weights:
  // losses over the target's full distribution need its normaliser.
  bool target_head_rest = false;
};

// One training step's figures, for the metrics (metrics_processor.h).
struct DraftStepOutput {
  double loss = 0;
  double tau = 1;                 // the acceptance length the step's accuracies predict
  std::vector<double> acc;        // per drafted position
  std::vector<double> ploss;      // per drafted position
  std::vector<double> acceptance_rate;  // the expected acceptance per position, where the loss has it
};

class DraftAlgorithm {
 public:
  virtual ~DraftAlgorithm() = default;

  // Its name in the run config (draft.algorithm) and in logs.
  virtual const char* name() const = 0;
  // What it reads from a teacher serving `target` (the layers may follow
  // the model's depth); InvalidArgument naming the setting when its
  // layers are not ones `target` can serve, or a warm start's export
  // cannot be read.
  virtual absl::StatusOr<TeacherNeeds> needs(const ModelConfig& target) const = 0;
  // Builds the draft for the teacher's model from its frozen tensors, on
  // this process's device, with its optimizer; `group` is the data-parallel
  // group (null for one rank). `info.aux_layer_ids` are the layers its
  // batches carry: those its needs() asked for.
  virtual absl::Status Build(const TeacherInfo& info, const FrozenWeights& frozen, ProcessGroup* group) = 0;
  // One line on what was built, for the log.
  virtual std::string Describe() const = 0;
  // The dtype the draft computes in ("bfloat16", "float32", ...).
  virtual const std::string& compute_dtype() const = 0;
  // The tokens a round drafts past the known ones, which the step's
  // metrics report one by one; and the chain length whose real tau picks
  // the best draft.
  virtual int64_t drafted_positions() const = 0;
  virtual int64_t eval_chain() const = 0;

  // The weights the optimizer trains (fp32 masters below fp32), which
  // checkpoints, exports and measurements read.
  virtual DraftModel& trained() = 0;
  virtual DraftOptimizer& optimizer() = 0;

  // One optimizer step on `batch` at learning rate `lr`. `batch` null: this
  // rank's share of a small global batch is empty; the step still runs, in
  // lockstep with the other ranks. `step` names the step in errors.
  virtual absl::StatusOr<DraftStepOutput> Step(const TeacherBatch* batch, double lr, int64_t step) = 0;

  // Loads an export's weights to start from (a warm start).
  virtual absl::Status WarmStart(const std::string& export_dir) = 0;
  // The draft as it started (the same seed, or the warm start's export),
  // in the trained dtype, for measuring what training bought.
  virtual absl::StatusOr<std::shared_ptr<DraftModel>> Initial() const = 0;
};

// The algorithm `draft.algorithm` names, reading its settings from the
// draft and schedule sections; it trains on `device`.
// What every algorithm derives alike from its sections: the compute
// dtype's name (draft.dtype; empty: bfloat16 on a GPU, float32 on the
// CPU), and the optimizer over `work` (`master`: its fp32 copy, or null)
// with the schedule's AdamW settings, fused where draft.kernels is fast.
std::string ComputeDtypeName(const DraftSettings& draft, const at::Device& device);
absl::StatusOr<std::unique_ptr<DraftOptimizer>> CreateScheduledOptimizer(const DraftSettings& draft,
                                                                         const ScheduleSettings& schedule,
                                                                         DraftModel& work, DraftModel* master,
                                                                         ProcessGroup* group);

// The positions the step metrics of draft.algorithm report (for sizing
// the metrics before the algorithm is built).
int64_t DraftedPositions(const DraftSettings& draft);

// The layers a draft of these settings reads from `target`
// (common/model/draft_aux_layers.h: draft.aux_layer_ids, a warm start's,
// or the algorithm's default).
absl::StatusOr<std::vector<int32_t>> DraftReadsLayers(const DraftSettings& draft, const ModelConfig& target);

absl::StatusOr<std::unique_ptr<DraftAlgorithm>> CreateDraftAlgorithm(const DraftSettings& draft,
                                                                     const ScheduleSettings& schedule,
                                                                     const at::Device& device);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_ALGORITHM_DRAFT_ALGORITHM_H_
