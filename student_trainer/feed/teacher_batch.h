// What the teacher ships for one training batch, as the feed hands it to
// the step: the packed samples and the target's features of them.
#ifndef E3_STUDENT_TRAINER_FEED_TEACHER_BATCH_H_
#define E3_STUDENT_TRAINER_FEED_TEACHER_BATCH_H_

#include "common/torch/torch_core.h"

namespace e3 {

// One packed batch as the teacher ships it (any device; the step copies it
// to the draft's device and dtype as needed).
struct TeacherBatch {
  at::Tensor input_ids;      // [T] integer
  at::Tensor cu_seqlens;     // [B + 1] integer, 0 = c_0 <= ... <= c_B = T
  at::Tensor loss_mask;      // [T] bool / integer / float, nonzero = trained
  at::Tensor aux_hidden;     // [T, num_aux * H_target]
  at::Tensor last_hidden;    // [T, H_target], after the target's final norm
  at::Tensor target_argmax;  // [T] integer, the target's full-vocab argmax
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_FEED_TEACHER_BATCH_H_
