// The CUDA runtime as the GPU transports use it, without LibTorch: device
// queries and errors turned into absl::Status. Built against the CUDA
// toolkit when CMake finds it (E3_WITH_CUDA_RUNTIME); otherwise every call
// reports that this build has no CUDA.
#ifndef E3_COMMON_GPU_CUDA_RUNTIME_H_
#define E3_COMMON_GPU_CUDA_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace e3 {

// True when this build has the CUDA runtime and a GPU is visible.
bool CudaRuntimeAvailable();
int CudaDeviceCount();
// Device `device`'s compute capability as major * 10 + minor (90 for
// Hopper); 0 when it cannot be read (no such device, no CUDA runtime).
int CudaComputeCapability(int device);
// The shared memory one block of device `device` may opt in to, in bytes
// (227 KiB on Hopper); 0 when it cannot be read.
int64_t CudaSharedMemoryPerBlockOptin(int device);
// Device `device`'s name ("NVIDIA H200"); empty when it cannot be read.
std::string CudaDeviceName(int device);

// Copies `bytes` between any two addresses the CUDA runtime knows (host,
// this device, a peer, a mapped IPC allocation) and waits for the copy.
// `device` is made current first.
absl::Status CudaCopy(void* dst, const void* src, size_t bytes, int device);

// Both GPUs can access each other's memory directly (NVLink or PCIe P2P).
bool CudaPeerAccess(int from_device, int to_device);

}  // namespace e3

#endif  // E3_COMMON_GPU_CUDA_RUNTIME_H_
