// Soft cross-entropy over draft logits with the gradient written in place
// (see student_ops.h). One block per row: the first pass reads only
// the logits and keeps a running max and sum of exponentials (online
// softmax) and the argmax; for the LK losses a second pass sums min(P, q)
// and the mass where q follows; the last pass writes the gradient and
// sums the target's dot product with the logits for the loss.
//
// The target row (fp32: twice the logits' bytes) is read by the last pass
// only, and the logits' second read mostly hits L2 (a block's row was read
// just before): about the minimum HBM traffic of one read of each row and
// one write. This needs sum_v p_v before the last pass; it is 1, as the
// target's log-sum-exp is its own row's (TargetDistribution), so the
// kernel takes it as 1 where the ATen statement sums p (the two differ by
// fp32 rounding). The target probabilities are never stored: p =
// exp(target - lse_t) is recomputed from the fp32 target logits.
#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

// RowRuns as the kernel reads them: run r is rows [begin[r], begin[r + 1]).
struct RowRunOffsets {
  int count = 0;
  int64_t begin[kMaxRowRuns + 1] = {};
};

constexpr int kThreads = 512;

struct RowStats {
  float max;      // running max of z
  float sum_exp;  // sum of exp(z - max)
  int64_t arg;    // first index of the max
};

// The cross-entropy kernel's exponential: one multiply and the hardware's
// base-2 exponential (a few ulp; expf's accurate form is about nine
// instructions, and three exponentials per element made the kernel
// issue-bound). Every exponential of that kernel goes through it, so that
// the LK terms' tie tests compare values computed one way. The target's
// statistics, read once per batch, keep expf.
template <bool kFast>
__device__ __forceinline__ float Exp(float x) {
  return kFast ? __expf(x) : expf(x);
}
constexpr bool kFastExp = true;

// Folds a pack of kVec values (indices first, first + 1, ...) into the
// running statistics: the pack's max first, then one rescale, so the sum
// needs no branch per element. Strict > keeps the first index of the max.
template <bool kFast>
__device__ __forceinline__ void VisitPack(RowStats& s, const float (&z)[kVec], int64_t first) {
  float m = s.max;
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    if (z[e] > m) {
      m = z[e];
      s.arg = first + e;
    }
  }
  float sum = s.sum_exp == 0.f ? 0.f : s.sum_exp * Exp<kFast>(s.max - m);
#pragma unroll
  for (int e = 0; e < kVec; ++e) sum += Exp<kFast>(z[e] - m);
  s.max = m;
  s.sum_exp = sum;
}

// Sums e and takes the smallest arg over the warp.
__device__ __forceinline__ void WarpMergeSums(float& e, long long& arg) {
  for (int o = 16; o > 0; o >>= 1) {
    e += __shfl_xor_sync(0xffffffffu, e, o);
    const long long other = __shfl_xor_sync(0xffffffffu, arg, o);
    arg = other < arg ? other : arg;
  }
}

// Merges the block's per-thread statistics; every thread gets the result.
__device__ RowStats BlockMerge(RowStats s) {
  __shared__ float sh_max[32], sh_exp[32];
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
  WarpMergeSums(e, arg);
  if (lane == 0) {
    sh_exp[warp] = e;
    sh_arg[warp] = arg;
  }
  __syncthreads();
  e = lane < warps ? sh_exp[lane] : 0.f;
  arg = lane < warps ? sh_arg[lane] : LLONG_MAX;
  WarpMergeSums(e, arg);
  return {m, e, static_cast<int64_t>(arg)};
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

// The LK terms of a row: alpha = sum min(P, q), S = sum FollowsQ * q, and
// the loss's sum p * z (so that a call that writes no gradient needs no
// further pass).
template <typename T>
__device__ float3 AcceptanceSums(const Pack<T, kVec>* z, const float* target, float t_lse,
                                 float log_mass, float lse, int64_t packs) {
  float alpha = 0.f, follows = 0.f, dot = 0.f;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const Pack<T, kVec> zp = z[i];
    float tv[kVec];
    LoadTarget(target, i, tv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float zf = Num<T>::ToF(zp.v[e]);
      const float q = Exp<kFastExp>(zf - lse);
      const float p_full = Exp<kFastExp>(tv[e] - t_lse + log_mass);
      alpha += fminf(q, p_full);
      follows += FollowsQ(q, p_full) * q;
      dot += Exp<kFastExp>(tv[e] - t_lse) * zf;
    }
  }
  alpha = BlockSum(alpha);
  follows = BlockSum(follows);
  dot = BlockSum(dot);
  return {alpha, follows, dot};
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SoftCrossEntropyKernel(T* __restrict__ logits, int64_t cols,
                           const float* __restrict__ target_logits,
                           const float* __restrict__ target_lse,
                           const int64_t* __restrict__ target_row,
                           const float* __restrict__ row_weight,
                           const float* __restrict__ row_grad_scale, float* __restrict__ loss,
                           int64_t* __restrict__ argmax, AcceptanceArgs acc, RowRunOffsets runs) {
  using P = Pack<T, kVec>;
  // Block b takes row b / count of run b % count: consecutive blocks read
  // neighbouring target rows. Runs shorter than the longest leave blocks
  // with nothing to do.
  int64_t row = blockIdx.x;
  if (runs.count > 0) {
    const int run = static_cast<int>(blockIdx.x % runs.count);
    const int64_t i = blockIdx.x / runs.count;
    if (i >= runs.begin[run + 1] - runs.begin[run]) return;
    row = runs.begin[run] + i;
  }
  P* z = reinterpret_cast<P*>(logits + row * cols);
  const float weight = row_weight[row];
  const bool trained = weight != 0.f;
  const int64_t t = trained ? target_row[row] : 0;
  const float* target = target_logits + t * cols;
  const float t_lse = trained ? target_lse[t] : 0.f;
  const int64_t packs = cols / kVec;

  RowStats s{-FLT_MAX, 0.f, 0};
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const P zp = z[i];
    float zf[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) zf[e] = Num<T>::ToF(zp.v[e]);
    VisitPack<kFastExp>(s, zf, i * kVec);
  }
  const RowStats r = BlockMerge(s);
  const float lse = r.max + logf(r.sum_exp);
  if (threadIdx.x == 0) argmax[row] = r.arg;
  // The LK terms (uniform per block: every thread takes the same branch).
  const bool lk = acc.target_log_mass != nullptr;
  const float log_mass = lk && trained ? acc.target_log_mass[t] : 0.f;
  float3 lk_sums{0.f, 0.f, 0.f};
  if (lk && trained) lk_sums = AcceptanceSums(z, target, t_lse, log_mass, lse, packs);
  if (lk && threadIdx.x == 0 && acc.alpha != nullptr) acc.alpha[row] = lk_sums.x;
  if (lk && !acc.write_grad) {
    if (threadIdx.x == 0) loss[row] = trained ? -weight * (lk_sums.z - lse) : 0.f;
    return;
  }
  float acc_weight = 0.f;  // the coefficient of d alpha / dz
  if (lk && trained) {
    acc_weight = acc.acc_grad_scale[row] * weight;
    if (acc.log_form) acc_weight = lk_sums.x > 0.f ? acc_weight / lk_sums.x : 0.f;
  }
  // The last pass: the gradient (softmax(z) * sum p - p, with sum p = 1)
  // and the loss's sum p * z. Each thread rewrites only the packs it read.
  const float grad_weight = row_grad_scale[row] * weight;
  float dot = 0.f;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    P g;
    if (trained) {
      const P zp = z[i];
      float tv[kVec];
      LoadTarget(target, i, tv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float zf = Num<T>::ToF(zp.v[e]);
        const float softmax = Exp<kFastExp>(zf - lse);
        const float p = Exp<kFastExp>(tv[e] - t_lse);
        dot += p * zf;
        float grad = grad_weight * (softmax - p);
        if (acc_weight != 0.f) {
          const float p_full = Exp<kFastExp>(tv[e] - t_lse + log_mass);  // as AcceptanceSums
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
  if (trained) dot = BlockSum(dot);
  if (threadIdx.x == 0) loss[row] = trained ? -weight * (dot - lse) : 0.f;
}

__global__ void __launch_bounds__(kThreads)
    RowLogSumExpArgmaxKernel(const float* __restrict__ x, int64_t cols, float* __restrict__ lse,
                             int64_t* __restrict__ argmax) {
  const int64_t row = blockIdx.x;
  const float* values = x + row * cols;
  RowStats s{-FLT_MAX, 0.f, 0};
  for (int64_t i = threadIdx.x; i < cols / kVec; i += blockDim.x) {
    float v[kVec];
    LoadTarget(values, i, v);
    VisitPack<false>(s, v, i * kVec);
  }
  const RowStats r = BlockMerge(s);
  if (threadIdx.x == 0) {
    lse[row] = r.max + logf(r.sum_exp);
    argmax[row] = r.arg;
  }
}

}  // namespace

bool SoftCrossEntropy(Dtype dtype, void* logits, int64_t rows, int64_t cols,
                      const float* target_logits, const float* target_lse,
                      const int64_t* target_row, const float* row_weight,
                      const float* row_grad_scale, float* loss, int64_t* argmax,
                      const AcceptanceArgs* acceptance, const RowRuns* row_runs, void* stream) {
  if (rows <= 0 || cols <= 0 || cols % kVec != 0 || !Aligned16(logits) ||
      !Aligned16(target_logits) || rows > 0x7fffffff) {
    return false;
  }
  RowRunOffsets runs;
  int64_t blocks = rows;
  if (row_runs != nullptr && row_runs->count > 0) {
    if (row_runs->count > kMaxRowRuns) return false;
    int64_t longest = 0;
    runs.count = row_runs->count;
    for (int r = 0; r < runs.count; ++r) {
      if (row_runs->length[r] < 0) return false;
      runs.begin[r + 1] = runs.begin[r] + row_runs->length[r];
      longest = std::max(longest, row_runs->length[r]);
    }
    if (runs.begin[runs.count] != rows) return false;
    blocks = longest * runs.count;
    if (blocks > 0x7fffffff) return false;
  }
  const AcceptanceArgs acc = acceptance != nullptr ? *acceptance : AcceptanceArgs{};
  if (acc.target_log_mass != nullptr && acc.write_grad && acc.acc_grad_scale == nullptr) return false;
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    SoftCrossEntropyKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, AsStream(stream)>>>(
        static_cast<T*>(logits), cols, target_logits, target_lse, target_row, row_weight,
        row_grad_scale, loss, argmax, acc, runs);
    return true;
  });
}

bool RowLogSumExpArgmax(const float* x, int64_t rows, int64_t cols, float* lse, int64_t* argmax, void* stream) {
  if (rows <= 0 || cols <= 0 || cols % kVec != 0 || !Aligned16(x) || rows > 0x7fffffff) return false;
  RowLogSumExpArgmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, AsStream(stream)>>>(x, cols, lse, argmax);
  return true;
}

}  // namespace e3::kernels
