// The draft a student trains: built from the teacher's model config and
// frozen tensors on the student's device, in its compute dtype, with fp32
// master weights below fp32 (master_weights.h) and the optimizer over
// them (draft_optimizer.h).
#ifndef E3_STUDENT_TRAINER_DRAFT_BUILDER_H_
#define E3_STUDENT_TRAINER_DRAFT_BUILDER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/feed/teacher_client.h"
#include "student_trainer/optim/draft_optimizer.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {

struct DraftBuildOptions {
  at::Device device = at::kCPU;
  std::string dtype;                       // empty: bfloat16 on a GPU, float32 on the CPU
  uint64_t init_seed = 0;                  // equal seeds give bit-equal initial weights
  int64_t intermediate_size = 0;           // 0: the target's
  // Keep the target head's rows outside the draft vocab (the LK losses;
  // FrozenWeights::target_head_rest must be there).
  bool keep_full_target_head = false;
  TttKernels kernels = TttKernels::kFast;  // kFast: the fused AdamW too
  DraftOptimizerOptions optimizer;
};

struct BuiltDraft {
  Eagle3DraftOptions options;         // rebuild the draft as initialised from these
  Eagle3FrozenTensors frozen;         // on the device, shared by draft and master
  Eagle3Draft draft{nullptr};         // what the TTT step runs
  std::optional<Eagle3Draft> master;  // its fp32 copy, below fp32
  std::unique_ptr<DraftOptimizer> optimizer;
  std::string dtype_name;
  std::string init_from;  // the export a warm start loaded (empty: none)

  // What the optimizer, checkpoints and the export see.
  Eagle3DraftImpl& trained() { return master.has_value() ? **master : *draft; }
  // The draft as it started (the same seed, or the warm start's export),
  // in the trained dtype.
  absl::StatusOr<Eagle3Draft> Initial() const;
};

// "cpu" or "cuda:N"; an error names the string.
absl::StatusOr<at::Device> ParseStudentDevice(const std::string& name);

// `group`: the data-parallel group the optimizer averages gradients over
// (null for one rank).
absl::StatusOr<BuiltDraft> BuildDraft(const TeacherInfo& info, const FrozenWeights& frozen,
                                      const DraftBuildOptions& o, ProcessGroup* group);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_DRAFT_BUILDER_H_
