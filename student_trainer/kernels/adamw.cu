// AdamW over flat fp32 master weights and moments, with global-norm
// clipping folded into the update (see student_kernels.h). Every scalar
// that changes between steps (learning rate, step count, grad norm) is read
// from device memory, so the host enqueues a step without waiting.
#include "student_trainer/kernels/kernel_common.cuh"

namespace e3::student_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kNormBlocks = 1024;

template <typename G>
__device__ __forceinline__ float GradAt(const G* g, int64_t i);
template <>
__device__ __forceinline__ float GradAt<float>(const float* g, int64_t i) {
  return g[i];
}
template <>
__device__ __forceinline__ float GradAt<__nv_bfloat16>(const __nv_bfloat16* g, int64_t i) {
  return __bfloat162float(g[i]);
}
template <>
__device__ __forceinline__ float GradAt<__half>(const __half* g, int64_t i) {
  return __half2float(g[i]);
}

template <typename G>
__global__ void SquaredNormKernel(const G* __restrict__ grad, int64_t n,
                                  float* __restrict__ partial) {
  float s = 0.f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = GradAt(grad, i);
    s += g * g;
  }
  s = BlockSum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <typename G, typename W>
__global__ void AdamWKernel(const G* __restrict__ grad, float* __restrict__ master,
                            float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                            W* __restrict__ work, int64_t n, AdamWScalars c) {
  const float lr = *c.lr;
  const float step = *c.step;
  // clip_grad_norm_: scale by max_norm / (norm + 1e-6) where that is below 1.
  float clip = 1.f;
  if (c.grad_norm != nullptr) clip = fminf(1.f, c.max_norm / (*c.grad_norm + 1e-6f));
  const float bias1 = 1.f - powf(c.beta1, step);
  const float bias2_sqrt = sqrtf(1.f - powf(c.beta2, step));
  const float step_size = lr / bias1;
  const float decay = 1.f - lr * c.weight_decay;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = GradAt(grad, i) * clip;
    const float m = c.beta1 * exp_avg[i] + (1.f - c.beta1) * g;
    const float v = c.beta2 * exp_avg_sq[i] + (1.f - c.beta2) * g * g;
    float p = master[i] * decay;
    p -= step_size * m / (sqrtf(v) / bias2_sqrt + c.eps);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    if (work != nullptr) work[i] = Num<W>::FromF(p);
  }
}

template <typename G>
void LaunchStep(Dtype work_dtype, const G* grad, float* master, float* exp_avg, float* exp_avg_sq,
                void* work, int64_t n, const AdamWScalars& c, cudaStream_t stream) {
  const int64_t blocks = GridBlocks(n, kThreads, 8192);
  if (work_dtype == Dtype::kBFloat16) {
    AdamWKernel<G, __nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
        grad, master, exp_avg, exp_avg_sq, static_cast<__nv_bfloat16*>(work), n, c);
  } else {
    AdamWKernel<G, __half><<<blocks, kThreads, 0, stream>>>(grad, master, exp_avg, exp_avg_sq,
                                                            static_cast<__half*>(work), n, c);
  }
}

}  // namespace

int64_t AdamWNormBlocks(int64_t n) { return GridBlocks(n, kThreads, kNormBlocks); }

bool GradSquaredNormPartials(Dtype grad_dtype, bool grad_fp32, const void* grad, int64_t n,
                             float* partial, void* stream) {
  if (n <= 0) return false;
  const int64_t blocks = AdamWNormBlocks(n);
  if (grad_fp32) {
    SquaredNormKernel<float>
        <<<blocks, kThreads, 0, AsStream(stream)>>>(static_cast<const float*>(grad), n, partial);
    return true;
  }
  return DispatchDtype(grad_dtype, [&](auto tag) {
    using G = decltype(tag);
    SquaredNormKernel<G>
        <<<blocks, kThreads, 0, AsStream(stream)>>>(static_cast<const G*>(grad), n, partial);
    return true;
  });
}

bool AdamWStep(Dtype work_dtype, bool grad_fp32, const void* grad, float* master, float* exp_avg,
               float* exp_avg_sq, void* work, int64_t n, const AdamWScalars& scalars,
               void* stream) {
  if (n <= 0 || scalars.lr == nullptr || scalars.step == nullptr) return false;
  if (grad_fp32) {
    LaunchStep(work_dtype, static_cast<const float*>(grad), master, exp_avg, exp_avg_sq, work, n,
               scalars, AsStream(stream));
    return true;
  }
  // 16-bit gradients are the working draft's own, in its dtype.
  return DispatchDtype(work_dtype, [&](auto tag) {
    using G = decltype(tag);
    LaunchStep(work_dtype, static_cast<const G*>(grad), master, exp_avg, exp_avg_sq, work, n,
               scalars, AsStream(stream));
    return true;
  });
}

const char* TakeLaunchError() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace e3::student_kernels
