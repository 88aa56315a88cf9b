#include "teacher_server/service/nccl_sender.h"

#include "absl/strings/str_cat.h"

namespace e3 {

NcclSender::NcclSender(std::unique_ptr<NcclChannel> channel, absl::Duration timeout)
    : channel_(std::move(channel)), timeout_(timeout) {
  thread_ = std::thread([this] { Loop(); });
}

NcclSender::~NcclSender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  channel_->Cancel();
  cv_.notify_all();
  thread_.join();
}

void NcclSender::Enqueue(std::shared_ptr<const PayloadBuffer> payload) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(payload));
  }
  cv_.notify_all();
}

absl::Status NcclSender::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

int64_t NcclSender::bytes_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_sent_;
}

void NcclSender::Loop() {
  while (true) {
    std::shared_ptr<const PayloadBuffer> payload;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      payload = std::move(queue_.front());
      queue_.pop_front();
    }
    const DeviceMemory* mem = payload->device_memory();
    absl::Status st = mem == nullptr ? absl::InternalError("NCCL sender got a host payload")
                                     : channel_->Send(mem->data(), payload->total_bytes(), timeout_);
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok()) {
      status_ = absl::UnavailableError(absl::StrCat("NCCL send to the student failed: ", st.message()));
      queue_.clear();
      return;
    }
    bytes_sent_ += static_cast<int64_t>(payload->total_bytes());
  }
}

}  // namespace e3
