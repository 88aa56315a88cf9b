// The CUDA caching allocator's view of a device's memory, for the
// benchmarks' peak and resident figures (zeros on the CPU).
#ifndef E3_BENCH_DEVICE_MEMORY_H_
#define E3_BENCH_DEVICE_MEMORY_H_

#ifdef E3_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "common/torch/torch_core.h"

namespace e3::bench {

struct MemoryStats {
  double allocated = 0, peak = 0;  // bytes
};

// Synchronises the device, then reads what is allocated now and the peak
// since the last reset; `reset_peak` starts a new peak.
inline MemoryStats DeviceMemory(const at::Device& device, bool reset_peak) {
  MemoryStats m;
#ifdef E3_HAS_CUDA
  if (device.is_cuda()) {
    torch::cuda::synchronize(device.index());
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    m.allocated = static_cast<double>(stats.allocated_bytes[0].current);
    m.peak = static_cast<double>(stats.allocated_bytes[0].peak);
    if (reset_peak) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#else
  (void)device;
  (void)reset_peak;
#endif
  return m;
}

}  // namespace e3::bench

#endif  // E3_BENCH_DEVICE_MEMORY_H_
