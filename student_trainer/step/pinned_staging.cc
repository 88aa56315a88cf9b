#include "student_trainer/step/pinned_staging.h"

#include <map>
#include <memory>
#include <thread>
#include <utility>

#include <c10/core/impl/VirtualGuardImpl.h>

namespace e3 {

PinnedStaging& PinnedStaging::For(const at::Device& device, StagingDirection direction) {
  thread_local std::map<std::pair<int, StagingDirection>, std::unique_ptr<PinnedStaging>> buffers;
  std::unique_ptr<PinnedStaging>& s = buffers[{device.index(), direction}];
  if (s == nullptr) s.reset(new PinnedStaging(device));
  return *s;
}

at::Tensor PinnedStaging::Reserve(int64_t bytes) {
  WaitForCopies();
  if (!pinned_.defined() || pinned_.numel() < bytes) {
    // Grown with headroom, so that batches of slowly growing size do not
    // pin a new buffer each time.
    pinned_ = at::empty({bytes + bytes / 4 + 4096}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  }
  return pinned_;
}

void PinnedStaging::RecordCopies() {
  c10::impl::VirtualGuardImpl guard(device_.type());
  if (!copied_) copied_.emplace(device_.type());
  copied_->record(guard.getStream(device_));
}

void PinnedStaging::WaitForCopies() {
  // c10::Event has no host wait in LibTorch 1.13. The waits are short: an
  // upload has long finished by the next step, and a download is queued
  // ahead of the step's work.
  while (copied_ && !copied_->query()) std::this_thread::yield();
}

}  // namespace e3
