#include "common/gpu/nccl_channel.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_error.h"
#include "common/gpu/cuda_runtime.h"

namespace e3 {

#ifdef E3_WITH_CUDA_RUNTIME

struct NcclChannel::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
};

namespace {

// Polls `ready` until it returns true, an error, cancellation or timeout.
// Spins (yielding) for the first milliseconds: a transfer of one batch
// takes well under a millisecond over NVLink, and a sleeping poller would
// add its wake-up latency to every one. Then backs off to short sleeps.
template <typename Ready>
absl::Status PollUntil(Ready ready, const std::atomic<bool>& cancelled, absl::Duration timeout, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  const absl::Time deadline = absl::Now() + timeout;
  constexpr auto kSpin = std::chrono::milliseconds(20);
  while (true) {
    auto r = ready();
    if (!r.ok()) return r.status();
    if (*r) return absl::OkStatus();
    if (cancelled) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": the peer did not complete within ",
                                                      absl::FormatDuration(timeout)));
    }
    if (std::chrono::steady_clock::now() - start < kSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

absl::StatusOr<bool> CommSettled(ncclComm_t comm, const char* what) {
  ncclResult_t state = ncclSuccess;
  auto st = NcclStatus(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
  if (!st.ok()) return st;
  if (state == ncclInProgress) return false;
  st = NcclStatus(state, what);
  if (!st.ok()) return st;
  return true;
}

}  // namespace

absl::StatusOr<std::string> NcclChannel::NewUniqueId() {
  ncclUniqueId id;
  auto st = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (!st.ok()) return st;
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

NcclChannel::NcclChannel(int rank, int device) : rank_(rank), device_(device), impl_(std::make_unique<Impl>()) {}

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Create(const std::string& unique_id, int rank, int device) {
  if (unique_id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id has ", unique_id.size(), " bytes, expected ",
                                                   sizeof(ncclUniqueId)));
  }
  if (rank != kTeacherRank && rank != kStudentRank) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL channel rank ", rank, ", expected 0 or 1"));
  }
  const int n = CudaDeviceCount();
  if (device < 0 || device >= n) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL channel: GPU ", device, " does not exist (", n, " visible)"));
  }
  auto ch = std::unique_ptr<NcclChannel>(new NcclChannel(rank, device));
  E3_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  E3_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&ch->impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  E3_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ch->impl_->done, cudaEventDisableTiming), "cudaEventCreate");
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and transfers return at once; we poll with deadlines
  auto st = NcclStatus(ncclCommInitRankConfig(&ch->impl_->comm, 2, id, rank, &config), "ncclCommInitRankConfig");
  if (!st.ok()) return st;
  return ch;
}

NcclChannel::~NcclChannel() {
  if (impl_ == nullptr) return;
  cudaSetDevice(device_);
  // Abort, not destroy: destroy waits for pending transfers, which never
  // finish if the peer is gone.
  if (impl_->comm != nullptr) ncclCommAbort(impl_->comm);
  if (impl_->done != nullptr) cudaEventDestroy(impl_->done);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

absl::Status NcclChannel::WaitReady(absl::Duration timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return absl::FailedPreconditionError("NCCL channel is broken by an earlier error");
  if (ready_) return absl::OkStatus();
  ncclComm_t comm = impl_->comm;
  auto st = PollUntil([&] { return CommSettled(comm, "joining the NCCL channel"); }, cancelled_, timeout,
                      "joining the NCCL channel");
  if (!st.ok()) {
    broken_ = true;
    return st;
  }
  ready_ = true;
  return absl::OkStatus();
}

absl::Status NcclChannel::Send(const void* data, size_t bytes, absl::Duration timeout) {
  return Transfer(true, const_cast<void*>(data), bytes, timeout);
}

absl::Status NcclChannel::Recv(void* data, size_t bytes, absl::Duration timeout) {
  return Transfer(false, data, bytes, timeout);
}

absl::Status NcclChannel::Transfer(bool send, void* data, size_t bytes, absl::Duration timeout) {
  const absl::Time start = absl::Now();
  auto ready = WaitReady(timeout);
  if (!ready.ok()) return ready;
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return absl::FailedPreconditionError("NCCL channel is broken by an earlier error");
  if (bytes == 0) return absl::OkStatus();
  const char* what = send ? "NCCL send" : "NCCL receive";
  auto fail = [&](absl::Status st) {
    broken_ = true;  // a half-done transfer leaves the peers out of step
    return st;
  };
  if (auto st = CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); !st.ok()) return fail(st);
  if (auto st = OrderAfterDefaultStream(impl_->stream); !st.ok()) return fail(st);
  const int peer = rank_ == kTeacherRank ? kStudentRank : kTeacherRank;
  ncclResult_t r = send ? ncclSend(data, bytes, ncclUint8, peer, impl_->comm, impl_->stream)
                        : ncclRecv(data, bytes, ncclUint8, peer, impl_->comm, impl_->stream);
  if (auto st = NcclStatus(r, what); !st.ok()) return fail(st);
  ncclComm_t comm = impl_->comm;
  const absl::Duration left = timeout - (absl::Now() - start);
  if (auto st = PollUntil([&] { return CommSettled(comm, what); }, cancelled_, left, what); !st.ok()) return fail(st);
  if (auto st = CudaStatus(cudaEventRecord(impl_->done, impl_->stream), "cudaEventRecord"); !st.ok()) return fail(st);
  cudaEvent_t done = impl_->done;
  auto finished = [&]() -> absl::StatusOr<bool> {
    cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) return CudaStatus(q, what);
    // An error on the peer's side surfaces here rather than in the event.
    auto c = CommSettled(comm, what);
    if (!c.ok()) return c.status();
    return false;
  };
  if (auto st = PollUntil(finished, cancelled_, timeout - (absl::Now() - start), what); !st.ok()) return fail(st);
  return absl::OkStatus();
}

#else  // !E3_WITH_CUDA_RUNTIME

struct NcclChannel::Impl {};
namespace {
absl::Status NoNccl() { return absl::UnimplementedError("NCCL transport: this build has no CUDA runtime or NCCL"); }
}  // namespace
absl::StatusOr<std::string> NcclChannel::NewUniqueId() { return NoNccl(); }
NcclChannel::NcclChannel(int rank, int device) : rank_(rank), device_(device) {}
absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Create(const std::string&, int, int) { return NoNccl(); }
NcclChannel::~NcclChannel() = default;
absl::Status NcclChannel::WaitReady(absl::Duration) { return NoNccl(); }
absl::Status NcclChannel::Send(const void*, size_t, absl::Duration) { return NoNccl(); }
absl::Status NcclChannel::Recv(void*, size_t, absl::Duration) { return NoNccl(); }
absl::Status NcclChannel::Transfer(bool, void*, size_t, absl::Duration) { return NoNccl(); }

#endif

}  // namespace e3
