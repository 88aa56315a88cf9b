// A two-rank NCCL communicator between one teacher (rank 0) and one
// student (rank 1), for point-to-point payload transfer. The student makes
// the unique id (NewUniqueId) and sends it in its SubscribeRequest; both
// sides then create the channel with it, so it works across hosts as well
// as across GPUs of one host. The communicator is non-blocking: every wait
// is bounded, and a peer that vanishes gives an error instead of a hang.
#ifndef E3_COMMON_GPU_NCCL_CHANNEL_H_
#define E3_COMMON_GPU_NCCL_CHANNEL_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace e3 {

class NcclChannel {
 public:
  static constexpr int kTeacherRank = 0;
  static constexpr int kStudentRank = 1;

  // ncclGetUniqueId: the bytes to send to the peer.
  static absl::StatusOr<std::string> NewUniqueId();
  // Starts joining the communicator on `device` and returns at once; the
  // first Send/Recv (or WaitReady) waits for the peer to join.
  static absl::StatusOr<std::unique_ptr<NcclChannel>> Create(const std::string& unique_id, int rank, int device);
  ~NcclChannel();  // aborts whatever is still in flight

  absl::Status WaitReady(absl::Duration timeout);
  // Blocking transfers of `bytes` bytes of device memory to/from the peer,
  // in the order they are called; each waits at most `timeout` (the
  // peer's matching call included).
  absl::Status Send(const void* data, size_t bytes, absl::Duration timeout);
  absl::Status Recv(void* data, size_t bytes, absl::Duration timeout);
  // Makes every current and later wait return Cancelled (thread-safe).
  void Cancel() { cancelled_ = true; }

  int rank() const { return rank_; }
  int device() const { return device_; }

 private:
  struct Impl;
  NcclChannel(int rank, int device);
  absl::Status Transfer(bool send, void* data, size_t bytes, absl::Duration timeout);

  const int rank_;
  const int device_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;  // one transfer at a time
  bool ready_ = false;
  bool broken_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace e3

#endif  // E3_COMMON_GPU_NCCL_CHANNEL_H_
