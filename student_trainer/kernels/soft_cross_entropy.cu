// Soft cross-entropy over draft logits with the gradient written in place
// (see student_kernels.h). One block per row: the first pass keeps a
// running max and sum of exponentials (online softmax), the argmax, and
// the target's sum and dot product; for the LK losses a second pass sums
// min(P, q) and the mass where q follows; the last pass writes the gradient.
// The target probabilities are never stored: p = exp(target - lse_t) is
// recomputed from the fp32 target logits in each pass.
#include <cfloat>
#include <climits>

#include "student_trainer/kernels/kernel_common.cuh"

namespace e3::student_kernels {
namespace {

constexpr int kThreads = 512;

struct RowStats {
  float max;      // running max of z
  float sum_exp;  // sum of exp(z - max)
  int64_t arg;    // first index of the max
  float sum_p;    // sum of p
  float dot;      // sum of p * z
};

__device__ __forceinline__ void Visit(RowStats& s, float z, int64_t index) {
  if (z > s.max) {
    s.sum_exp = s.sum_exp * expf(s.max - z) + 1.f;
    s.max = z;
    s.arg = index;
  } else {
    s.sum_exp += expf(z - s.max);
  }
}

// Sums e, p and d and takes the smallest arg over the warp.
__device__ __forceinline__ void WarpMergeSums(float& e, float& p, float& d, long long& arg) {
  for (int o = 16; o > 0; o >>= 1) {
    e += __shfl_xor_sync(0xffffffffu, e, o);
    p += __shfl_xor_sync(0xffffffffu, p, o);
    d += __shfl_xor_sync(0xffffffffu, d, o);
    const long long other = __shfl_xor_sync(0xffffffffu, arg, o);
    arg = other < arg ? other : arg;
  }
}

// Merges the block's per-thread statistics; every thread gets the result.
__device__ RowStats BlockMerge(RowStats s) {
  __shared__ float sh_max[32], sh_exp[32], sh_p[32], sh_dot[32];
  __shared__ long long sh_arg[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  // Max first: every thread needs it to rescale its sum of exponentials.
  float m = s.max;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) sh_max[warp] = m;
  __syncthreads();
  m = lane < warps ? sh_max[lane] : -FLT_MAX;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float e = s.max == -FLT_MAX && s.sum_exp == 0.f ? 0.f : s.sum_exp * expf(s.max - m);
  long long arg = s.max == m ? static_cast<long long>(s.arg) : LLONG_MAX;
  float p = s.sum_p, d = s.dot;
  WarpMergeSums(e, p, d, arg);
  if (lane == 0) {
    sh_exp[warp] = e;
    sh_p[warp] = p;
    sh_dot[warp] = d;
    sh_arg[warp] = arg;
  }
  __syncthreads();
  e = lane < warps ? sh_exp[lane] : 0.f;
  p = lane < warps ? sh_p[lane] : 0.f;
  d = lane < warps ? sh_dot[lane] : 0.f;
  arg = lane < warps ? sh_arg[lane] : LLONG_MAX;
  WarpMergeSums(e, p, d, arg);
  return {m, e, static_cast<int64_t>(arg), p, d};
}

__device__ __forceinline__ void LoadTarget(const float* row, int64_t i, float (&v)[kVec]) {
  const float4 a = reinterpret_cast<const float4*>(row)[2 * i];
  const float4 b = reinterpret_cast<const float4*>(row)[2 * i + 1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The weight of q_v in d alpha: min(P, q) follows q where q < P, half of
// it at a tie (at::minimum's gradient).
__device__ __forceinline__ float FollowsQ(float q, float p_full) {
  return q < p_full ? 1.f : (q == p_full ? 0.5f : 0.f);
}

// The LK terms of a row: alpha = sum min(P, q) and S = sum FollowsQ * q.
template <typename T>
__device__ float2 AcceptanceSums(const Pack<T, kVec>* z, const float* target, float t_lse,
                                 float log_mass, float lse, int64_t packs) {
  float alpha = 0.f, follows = 0.f;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const Pack<T, kVec> zp = z[i];
    float tv[kVec];
    LoadTarget(target, i, tv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float q = expf(Num<T>::ToF(zp.v[e]) - lse);
      const float p_full = expf(tv[e] - t_lse + log_mass);
      alpha += fminf(q, p_full);
      follows += FollowsQ(q, p_full) * q;
    }
  }
  alpha = BlockSum(alpha);
  follows = BlockSum(follows);
  return {alpha, follows};
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SoftCrossEntropyKernel(T* __restrict__ logits, int64_t cols,
                           const float* __restrict__ target_logits,
                           const float* __restrict__ target_lse,
                           const int64_t* __restrict__ target_row,
                           const float* __restrict__ row_weight,
                           const float* __restrict__ row_grad_scale, float* __restrict__ loss,
                           int64_t* __restrict__ argmax, AcceptanceArgs acc) {
  using P = Pack<T, kVec>;
  const int64_t row = blockIdx.x;
  P* z = reinterpret_cast<P*>(logits + row * cols);
  const float weight = row_weight[row];
  const bool trained = weight != 0.f;
  const int64_t t = trained ? target_row[row] : 0;
  const float* target = target_logits + t * cols;
  const float t_lse = trained ? target_lse[t] : 0.f;
  const int64_t packs = cols / kVec;

  RowStats s{-FLT_MAX, 0.f, 0, 0.f, 0.f};
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const P zp = z[i];
    float tv[kVec];
    if (trained) LoadTarget(target, i, tv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float zf = Num<T>::ToF(zp.v[e]);
      Visit(s, zf, i * kVec + e);
      if (trained) {
        const float p = expf(tv[e] - t_lse);
        s.sum_p += p;
        s.dot += p * zf;
      }
    }
  }
  const RowStats r = BlockMerge(s);
  const float lse = r.max + logf(r.sum_exp);
  if (threadIdx.x == 0) {
    loss[row] = trained ? -weight * (r.dot - lse * r.sum_p) : 0.f;
    argmax[row] = r.arg;
  }
  // The LK terms (uniform per block: every thread takes the same branch).
  const bool lk = acc.target_log_mass != nullptr;
  const float log_mass = lk && trained ? acc.target_log_mass[t] : 0.f;
  float2 lk_sums{0.f, 0.f};
  if (lk && trained) lk_sums = AcceptanceSums(z, target, t_lse, log_mass, lse, packs);
  if (lk && threadIdx.x == 0 && acc.alpha != nullptr) acc.alpha[row] = lk_sums.x;
  if (lk && !acc.write_grad) return;
  float acc_weight = 0.f;  // the coefficient of d alpha / dz
  if (lk && trained) {
    acc_weight = acc.acc_grad_scale[row] * weight;
    if (acc.log_form) acc_weight = lk_sums.x > 0.f ? acc_weight / lk_sums.x : 0.f;
  }
  __syncthreads();  // every thread has read z before any writes it
  const float grad_weight = row_grad_scale[row] * weight;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    P g;
    if (trained) {
      const P zp = z[i];
      float tv[kVec];
      LoadTarget(target, i, tv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float softmax = expf(Num<T>::ToF(zp.v[e]) - lse);
        const float p = expf(tv[e] - t_lse);
        float grad = grad_weight * (softmax * r.sum_p - p);
        if (acc_weight != 0.f) {
          const float p_full = expf(tv[e] - t_lse + log_mass);  // as AcceptanceSums
          grad += acc_weight * softmax * (FollowsQ(softmax, p_full) - lk_sums.y);
        }
        g.v[e] = Num<T>::FromF(grad);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) g.v[e] = Num<T>::FromF(0.f);
    }
    z[i] = g;
  }
}

}  // namespace

bool SoftCrossEntropy(Dtype dtype, void* logits, int64_t rows, int64_t cols,
                      const float* target_logits, const float* target_lse,
                      const int64_t* target_row, const float* row_weight,
                      const float* row_grad_scale, float* loss, int64_t* argmax,
                      const AcceptanceArgs* acceptance, void* stream) {
  if (rows <= 0 || cols <= 0 || cols % kVec != 0 || !Aligned16(logits) ||
      !Aligned16(target_logits) || rows > 0x7fffffff) {
    return false;
  }
  const AcceptanceArgs acc = acceptance != nullptr ? *acceptance : AcceptanceArgs{};
  if (acc.target_log_mass != nullptr && acc.write_grad && acc.acc_grad_scale == nullptr) return false;
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    SoftCrossEntropyKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, AsStream(stream)>>>(
        static_cast<T*>(logits), cols, target_logits, target_lse, target_row, row_weight,
        row_grad_scale, loss, argmax, acc);
    return true;
  });
}

}  // namespace e3::student_kernels
