// Checks of a TTT batch and options shared by the reference and the fast
// TTT step: every error names the field and what was expected.
#ifndef E3_STUDENT_TRAINER_STEP_BATCH_CHECKS_H_
#define E3_STUDENT_TRAINER_STEP_BATCH_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {

// InvalidArgument "TTT batch: <field>: <what>".
absl::Status TttBatchError(const std::string& field, const std::string& what);

absl::Status ValidateTttOptions(const TttOptions& options);

// Shapes and dtypes of every field; reads no tensor's values.
absl::Status CheckTttBatchShapes(const Eagle3DraftConfig& config, const TeacherBatch& batch);

// The packing: 0 = c_0 <= ... <= c_B = total.
absl::Status CheckCuSeqlens(const std::vector<int64_t>& cu, int64_t total);

// Both, with cu_seqlens read from its device: returns it as a host vector.
absl::StatusOr<std::vector<int64_t>> ValidateTttBatch(const Eagle3DraftConfig& config,
                                                      const TeacherBatch& batch);

// Whether every id lies in [0, vocab): on the ids' device (one host
// synchronisation), or over a CPU int64 tensor.
absl::Status CheckIdRange(const std::string& field, const at::Tensor& ids, int64_t vocab);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STEP_BATCH_CHECKS_H_
