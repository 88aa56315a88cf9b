// Row gather for the teacher (see teacher_ops.h, GatherRows): one 16-byte
// pack per thread and grid-stride step.
#include "kernels/common.cuh"
#include "kernels/teacher_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // the grid-stride loops' grid

// out[r] = x[index[r]] for the first LimitedRows rows, a pack per thread.
template <typename T>
__global__ void GatherRowsKernel(const T* __restrict__ x, const int64_t* __restrict__ index, T* __restrict__ out,
                                 int64_t rows, int64_t cols, const int32_t* __restrict__ row_limit) {
  using P = Pack<T, kVec>;
  const int64_t packs = cols / kVec;
  const int64_t total = LimitedRows(rows, row_limit) * packs;
  for (int64_t idx = GridStrideStart(); idx < total; idx += GridStride()) {
    const int64_t r = idx / packs, p = idx % packs;
    reinterpret_cast<P*>(out + r * cols)[p] = reinterpret_cast<const P*>(x + index[r] * cols)[p];
  }
}

}  // namespace

bool GatherRows(Dtype dtype, const void* x, const int64_t* index, void* out, int64_t rows, int64_t cols,
                const int32_t* row_limit, void* stream) {
  if (rows <= 0 || cols % kVec != 0 || !Aligned16OrNull(x) || !Aligned16OrNull(out)) return false;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = GridBlocks(rows * cols / kVec, kThreads, kMaxBlocks);
  if (dtype == Dtype::kBFloat16) {
    GatherRowsKernel<__nv_bfloat16><<<blocks, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), index,
                                                                static_cast<__nv_bfloat16*>(out), rows, cols,
                                                                row_limit);
  } else {
    GatherRowsKernel<__half><<<blocks, kThreads, 0, s>>>(static_cast<const __half*>(x), index,
                                                         static_cast<__half*>(out), rows, cols, row_limit);
  }
  return true;
}

}  // namespace e3::kernels
