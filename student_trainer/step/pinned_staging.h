// Pinned host buffers kept between training steps, one per thread, device
// and direction, for the small copies a step makes between host and device
// (its plan's inputs down, the plan up). Pinning a fresh buffer per step
// cost milliseconds of host time at 16k tokens; a pageable copy is a
// synchronisation of its own.
//
// A buffer is rewritten only after the last copy through it has finished:
// an event recorded after that copy says so.
#ifndef E3_STUDENT_TRAINER_STEP_PINNED_STAGING_H_
#define E3_STUDENT_TRAINER_STEP_PINNED_STAGING_H_

#include <cstdint>
#include <optional>

#include <c10/core/Event.h>

#include "common/torch/torch_core.h"

namespace e3 {

enum class StagingDirection { kToDevice, kToHost };

class PinnedStaging {
 public:
  // This thread's buffer for `device` (a CUDA device) and `direction`.
  static PinnedStaging& For(const at::Device& device, StagingDirection direction);

  // The buffer, at least `bytes` long, once the last copy through it has
  // finished (kByte, pinned).
  at::Tensor Reserve(int64_t bytes);
  // Marks the copies just queued on the device's current stream as the
  // buffer's last.
  void RecordCopies();
  // Returns once those copies have finished.
  void WaitForCopies();

 private:
  explicit PinnedStaging(const at::Device& device) : device_(device) {}

  at::Device device_;
  at::Tensor pinned_;
  std::optional<c10::Event> copied_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STEP_PINNED_STAGING_H_
