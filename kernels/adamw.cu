// AdamW over flat fp32 master weights and moments, with global-norm
// clipping folded into the update (see student_ops.h). Every scalar
// that changes between steps (learning rate, step count, grad norm) is read
// from device memory, so the host enqueues a step without waiting.
#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kNormBlocks = 1024;

// Elements per 16-byte access of the gradient: the kernels are bound by
// memory bandwidth, which one 2-byte element a thread reached only in part
// (the norm of bf16 gradients at about a third of it).
template <typename G>
constexpr int kGradPack = 16 / static_cast<int>(sizeof(G));

// Runs visit.template Visit<kN>(i) over the grid for every whole pack of
// kN elements, then visit.template Visit<1>(i) for each of the n % kN left.
template <int kN, typename Visitor>
__device__ __forceinline__ void ForPacks(int64_t n, Visitor& visit) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / kN;
  for (int64_t p = first; p < packs; p += stride) visit.template Visit<kN>(p * kN);
  for (int64_t i = packs * kN + first; i < n; i += stride) visit.template Visit<1>(i);
}

template <typename G>
struct SquaredNormVisitor {
  const G* __restrict__ grad;
  float sum;
  template <int kN>
  __device__ __forceinline__ void Visit(int64_t i) {
    const Pack<G, kN> g = *reinterpret_cast<const Pack<G, kN>*>(grad + i);
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      const float x = Num<G>::ToF(g.v[e]);
      sum += x * x;
    }
  }
};

template <typename G>
__global__ void SquaredNormKernel(const G* __restrict__ grad, int64_t n,
                                  float* __restrict__ partial) {
  SquaredNormVisitor<G> visit{grad, 0.f};
  ForPacks<kGradPack<G>>(n, visit);
  const float s = BlockSum(visit.sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// The step's constants, from the device scalars.
struct AdamWConstants {
  float clip, beta1, beta2, eps, step_size, bias2_sqrt, decay;
};

__device__ AdamWConstants ReadConstants(const AdamWScalars& c) {
  const float lr = *c.lr;
  const float step = *c.step;
  // clip_grad_norm_: scale by max_norm / (norm + 1e-6) where that is below 1.
  float clip = 1.f;
  if (c.grad_norm != nullptr) clip = fminf(1.f, c.max_norm / (*c.grad_norm + 1e-6f));
  const float bias1 = 1.f - powf(c.beta1, step);
  return {clip, c.beta1, c.beta2, c.eps, lr / bias1, sqrtf(1.f - powf(c.beta2, step)),
          1.f - lr * c.weight_decay};
}

// Four elements a thread: 16-byte accesses to the fp32 buffers, 8-byte ones
// to 16-bit gradients and working weights.
constexpr int kAdamPack = 4;

template <typename G, typename W>
struct AdamWVisitor {
  const G* __restrict__ grad;
  float* __restrict__ master;
  float* __restrict__ exp_avg;
  float* __restrict__ exp_avg_sq;
  W* __restrict__ work;
  AdamWConstants k;

  template <int kN>
  __device__ __forceinline__ void Visit(int64_t i) {
    const Pack<G, kN> g = *reinterpret_cast<const Pack<G, kN>*>(grad + i);
    Pack<float, kN> m = *reinterpret_cast<const Pack<float, kN>*>(exp_avg + i);
    Pack<float, kN> v = *reinterpret_cast<const Pack<float, kN>*>(exp_avg_sq + i);
    Pack<float, kN> p = *reinterpret_cast<const Pack<float, kN>*>(master + i);
    Pack<W, kN> w;
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      const float ge = Num<G>::ToF(g.v[e]) * k.clip;
      m.v[e] = k.beta1 * m.v[e] + (1.f - k.beta1) * ge;
      v.v[e] = k.beta2 * v.v[e] + (1.f - k.beta2) * ge * ge;
      p.v[e] = p.v[e] * k.decay - k.step_size * m.v[e] / (sqrtf(v.v[e]) / k.bias2_sqrt + k.eps);
      w.v[e] = Num<W>::FromF(p.v[e]);
    }
    *reinterpret_cast<Pack<float, kN>*>(exp_avg + i) = m;
    *reinterpret_cast<Pack<float, kN>*>(exp_avg_sq + i) = v;
    *reinterpret_cast<Pack<float, kN>*>(master + i) = p;
    if (work != nullptr) *reinterpret_cast<Pack<W, kN>*>(work + i) = w;
  }
};

template <typename G, typename W>
__global__ void AdamWKernel(const G* __restrict__ grad, float* __restrict__ master,
                            float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                            W* __restrict__ work, int64_t n, AdamWScalars c) {
  AdamWVisitor<G, W> visit{grad, master, exp_avg, exp_avg_sq, work, ReadConstants(c)};
  ForPacks<kAdamPack>(n, visit);
}

template <typename G>
void LaunchStep(Dtype work_dtype, const G* grad, float* master, float* exp_avg, float* exp_avg_sq,
                void* work, int64_t n, const AdamWScalars& c, cudaStream_t stream) {
  const int64_t blocks = GridBlocks((n + kAdamPack - 1) / kAdamPack, kThreads, 8192);
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

// The packed accesses need the buffers' starts aligned to them (flat
// buffers are; a view into one at an odd offset is refused).
bool GradSquaredNormPartials(Dtype grad_dtype, bool grad_fp32, const void* grad, int64_t n,
                             float* partial, void* stream) {
  if (n <= 0 || !Aligned16(grad)) return false;
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
  if (!Aligned16(grad) || !Aligned16(master) || !Aligned16(exp_avg) || !Aligned16(exp_avg_sq) ||
      !Aligned16(work)) {
    return false;
  }
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

}  // namespace e3::kernels
