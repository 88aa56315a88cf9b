#include "common/gpu/device_pool.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_error.h"
#include "common/gpu/cuda_runtime.h"

namespace e3 {

struct DevicePool::Slot {
  uint8_t* ptr = nullptr;
  size_t capacity = 0;
  std::string ipc_handle;
  bool in_use = false;
};

// What Acquire hands out: the slot's memory, returned to the pool when the
// last payload using it is gone. Holds the pool alive until then.
class DevicePool::Lease : public DeviceMemory {
 public:
  Lease(std::shared_ptr<DevicePool> pool, Slot* slot) : pool_(std::move(pool)), slot_(slot) {}
  ~Lease() override { pool_->Release(slot_); }
  uint8_t* data() const override { return slot_->ptr; }
  size_t capacity() const override { return slot_->capacity; }
  int device() const override { return pool_->device(); }
  const std::string& ipc_handle() const override { return slot_->ipc_handle; }

 private:
  std::shared_ptr<DevicePool> pool_;
  Slot* slot_;
};

DevicePool::DevicePool(int device) : device_(device) {}

size_t DevicePool::buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

size_t DevicePool::bytes_allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& s : slots_) n += s->capacity;
  return n;
}

void DevicePool::Release(Slot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  slot->in_use = false;
}

#ifdef E3_WITH_CUDA_RUNTIME

absl::StatusOr<std::shared_ptr<DevicePool>> DevicePool::Create(int device) {
  const int n = CudaDeviceCount();
  if (device < 0 || device >= n) {
    return absl::InvalidArgumentError(absl::StrCat("device pool: GPU ", device, " does not exist (", n, " visible)"));
  }
  return std::shared_ptr<DevicePool>(new DevicePool(device));
}

DevicePool::~DevicePool() {
  if (cudaSetDevice(device_) != cudaSuccess) return;
  for (auto& s : slots_) cudaFree(s->ptr);
}

absl::StatusOr<std::shared_ptr<DeviceMemory>> DevicePool::Acquire(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  std::lock_guard<std::mutex> lock(mu_);
  Slot* best = nullptr;
  for (auto& s : slots_) {
    if (!s->in_use && s->capacity >= bytes && (best == nullptr || s->capacity < best->capacity)) best = s.get();
  }
  if (best == nullptr) {
    E3_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    auto slot = std::make_unique<Slot>();
    // Round up so that batches of similar size share buffers.
    slot->capacity = (bytes + (1u << 20) - 1) / (1u << 20) * (1u << 20);
    void* ptr = nullptr;
    E3_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, slot->capacity),
                            absl::StrCat("cudaMalloc of ", slot->capacity, " bytes on GPU ", device_).c_str());
    slot->ptr = static_cast<uint8_t*>(ptr);
    cudaIpcMemHandle_t handle;
    auto st = CudaStatus(cudaIpcGetMemHandle(&handle, ptr), "cudaIpcGetMemHandle");
    if (!st.ok()) {
      cudaFree(ptr);
      return st;
    }
    slot->ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    best = slot.get();
    slots_.push_back(std::move(slot));
  }
  best->in_use = true;
  return std::shared_ptr<DeviceMemory>(new Lease(shared_from_this(), best));
}

absl::StatusOr<std::unique_ptr<PayloadBuffer>> BuildDevicePayload(TransportKind transport,
                                                                  const std::vector<PayloadSource>& sources,
                                                                  DevicePool& pool) {
  if (transport != TransportKind::kNccl && transport != TransportKind::kCudaIpc) {
    return absl::InvalidArgumentError(absl::StrCat("BuildDevicePayload: ", TransportName(transport),
                                                   " is not a device transport"));
  }
  auto layout = PayloadBuffer::LayOut(sources);
  if (!layout.ok()) return layout.status();
  auto memory = pool.Acquire(layout->total_bytes);
  if (!memory.ok()) return memory.status();
  E3_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool.device()), "cudaSetDevice");
  // The sources were written by kernels on the legacy default stream (where
  // LibTorch runs), so copies on that stream are ordered after them.
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].nbytes == 0) continue;
    E3_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync((*memory)->data() + layout->tensors[i].offset, sources[i].data,
                                            sources[i].nbytes, cudaMemcpyDefault, cudaStreamLegacy),
                            absl::StrCat("copying payload tensor ", sources[i].name).c_str());
  }
  E3_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (payload)");
  return PayloadBuffer::OnDevice(transport, std::move(layout).value(), std::move(memory).value());
}

#else  // !E3_WITH_CUDA_RUNTIME

absl::StatusOr<std::shared_ptr<DevicePool>> DevicePool::Create(int) {
  return absl::UnimplementedError("device payloads need CUDA: this build has no CUDA runtime");
}
DevicePool::~DevicePool() = default;
absl::StatusOr<std::shared_ptr<DeviceMemory>> DevicePool::Acquire(size_t) {
  return absl::UnimplementedError("device payloads need CUDA: this build has no CUDA runtime");
}
absl::StatusOr<std::unique_ptr<PayloadBuffer>> BuildDevicePayload(TransportKind, const std::vector<PayloadSource>&,
                                                                  DevicePool&) {
  return absl::UnimplementedError("device payloads need CUDA: this build has no CUDA runtime");
}

#endif

}  // namespace e3
