// Sends one subscriber's NCCL payloads, in descriptor order, on a thread of
// its own: the gRPC reactor only enqueues (a send waits until the student
// posts its receive, which must never block a gRPC callback thread), and
// the engine keeps computing the next batch meanwhile.
#ifndef E3_TEACHER_SERVER_SERVICE_NCCL_SENDER_H_
#define E3_TEACHER_SERVER_SERVICE_NCCL_SENDER_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/gpu/nccl_channel.h"
#include "common/transport/batch_payload.h"

namespace e3 {

class NcclSender {
 public:
  NcclSender(std::unique_ptr<NcclChannel> channel, absl::Duration timeout);
  ~NcclSender();  // cancels what is in flight and joins

  // Queues a device payload; it stays alive until sent.
  void Enqueue(std::shared_ptr<const PayloadBuffer> payload);
  // OK, or the first failure (after which nothing more is sent).
  absl::Status status() const;
  int64_t bytes_sent() const;

 private:
  void Loop();

  std::unique_ptr<NcclChannel> channel_;
  const absl::Duration timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const PayloadBuffer>> queue_;
  absl::Status status_;
  int64_t bytes_sent_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_SERVICE_NCCL_SENDER_H_
