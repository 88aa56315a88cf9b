// Times cuBLAS on the teacher's projection GEMMs (GPU machine): the
// cublasGemmEx default that LibTorch's matmul uses, against every algorithm
// cuBLASLt's heuristic offers for the same problem, plus the residual form
// (beta = 1, D = X W^T + H). It measures how much per-shape algorithm
// selection could gain before any of it is built into the teacher.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 -I. bench/probes/gemm_algo_probe.cu -lcublasLt -lcublas -o /tmp/gemm_probe
//   /tmp/gemm_probe
#include <cublas_v2.h>

#include <algorithm>
#include <vector>

#include "bench/probes/cuda_probe_util.cuh"

int main() {
  const Shape* shapes = kTeacherShapes;
  cublasHandle_t blas; CHECK_BLAS(cublasCreate(&blas));
  cublasLtHandle_t lt; CHECK_BLAS(cublasLtCreate(&lt));
  size_t workspace_bytes = 64u << 20;
  void* workspace; CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_BLAS(cublasSetWorkspace(blas, workspace, workspace_bytes));
  for (const Shape& s : kTeacherShapes) {
    // Row-major X[m,k], W[n,k], Y[m,n]; column-major Y^T = W * X^T.
    __nv_bfloat16 *x, *w, *y;
    CHECK_CUDA(cudaMalloc(&x, size_t(s.m) * s.k * 2));
    CHECK_CUDA(cudaMalloc(&w, size_t(s.n) * s.k * 2));
    CHECK_CUDA(cudaMalloc(&y, size_t(s.m) * s.n * 2));
    FillRandom<<<1024, 256>>>(x, size_t(s.m) * s.k, 1);
    FillRandom<<<1024, 256>>>(w, size_t(s.n) * s.k, 2);
    cudaMemset(y, 0, size_t(s.m) * s.n * 2);
    const double flops = 2.0 * s.m * s.n * s.k;
    float alpha = 1.f, beta0 = 0.f, beta1 = 1.f;
    float gemm_ex = TimeMs([&] {
      CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, w, CUDA_R_16BF, s.k,
                              x, CUDA_R_16BF, s.k, &beta0, y, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT_TENSOR_OP));
    });
    float gemm_ex_beta1 = TimeMs([&] {
      CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, w, CUDA_R_16BF, s.k,
                              x, CUDA_R_16BF, s.k, &beta1, y, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT_TENSOR_OP));
    });
    LtPlan plan = MakePlan(lt, s, workspace_bytes);
    const int count = plan.count;
    const cublasLtMatmulHeuristicResult_t* results = plan.results;
    cublasLtMatmulDesc_t desc = plan.desc;
    cublasLtMatrixLayout_t la = plan.la, lb = plan.lb, lc = plan.lc;
    std::vector<float> times;
    for (int i = 0; i < count; ++i) {
      times.push_back(TimeMs([&] {
        CHECK_BLAS(cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta0, y, lc, y, lc, &results[i].algo,
                                  workspace, workspace_bytes, 0));
      }));
    }
    int best = int(std::min_element(times.begin(), times.end()) - times.begin());
    float best_beta1 = TimeMs([&] {
      CHECK_BLAS(cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta1, y, lc, y, lc, &results[best].algo,
                                workspace, workspace_bytes, 0));
    });
    std::printf("%-12s m=%d n=%d k=%d  GemmEx %.3f ms (%.0f TF)  beta1 %.3f  | Lt %d algos: top1 %.3f ms (%.0f TF) best #%d %.3f ms (%.0f TF) beta1 %.3f\n",
                s.name, s.m, s.n, s.k, gemm_ex, flops / gemm_ex / 1e9, gemm_ex_beta1, count, times[0],
                flops / times[0] / 1e9, best, times[best], flops / times[best] / 1e9, best_beta1);
    std::printf("   all:");
    for (float t : times) std::printf(" %.3f", t);
    std::printf("\n");
    DestroyPlan(plan);
    cudaFree(x); cudaFree(w); cudaFree(y);
  }
  // In sequence, as a forward runs them: each model's four layer GEMMs
  // (o_proj and down_proj accumulating into the residual), 16 or 32 times,
  // with cuBLAS's default, cuBLASLt's first guess, and the per-shape
  // fastest of the isolated timings above.
  for (int model = 0; model < 2; ++model) {
    const Shape* layer = &shapes[model * 5];
    const int layers = model == 0 ? 16 : 32;
    size_t max_in = 0, max_out = 0;
    for (int i = 0; i < 4; ++i) {
      max_in = std::max(max_in, size_t(layer[i].m) * layer[i].k);
      max_out = std::max(max_out, size_t(layer[i].m) * layer[i].n);
    }
    __nv_bfloat16 *x, *y, *w[4];
    CHECK_CUDA(cudaMalloc(&x, max_in * 2));
    CHECK_CUDA(cudaMalloc(&y, max_out * 2));
    FillRandom<<<1024, 256>>>(x, max_in, 3);
    FillRandom<<<1024, 256>>>(y, max_out, 4);
    LtPlan plans[4];
    cublasLtMatmulAlgo_t top1[4], best_algo[4];
    for (int i = 0; i < 4; ++i) {
      const Shape& s = layer[i];
      CHECK_CUDA(cudaMalloc(&w[i], size_t(s.n) * s.k * 2));
      FillRandom<<<1024, 256>>>(w[i], size_t(s.n) * s.k, 5 + i);
      LtPlan& p = plans[i];
      p = MakePlan(lt, s, workspace_bytes);
      top1[i] = best_algo[i] = p.results[0].algo;
      const float beta = (i == 1 || i == 3) ? 1.f : 0.f, alpha = 1.f;
      float best = 1e30f;
      for (int c = 0; c < p.count; ++c) {
        const float t = TimeMs([&] {
          CHECK_BLAS(cublasLtMatmul(lt, p.desc, &alpha, w[i], p.la, x, p.lb, &beta, y, p.lc, y, p.lc,
                                    &p.results[c].algo, workspace, workspace_bytes, 0));
        }, 10);
        if (t < best) { best = t; best_algo[i] = p.results[c].algo; }
      }
    }
    for (int mode = 0; mode < 3; ++mode) {
      auto forward = [&] {
        for (int l = 0; l < layers; ++l) {
          for (int i = 0; i < 4; ++i) {
            const Shape& s = layer[i];
            const float alpha = 1.f, beta = (i == 1 || i == 3) ? 1.f : 0.f;
            if (mode == 0) {
              CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, w[i], CUDA_R_16BF, s.k, x,
                                      CUDA_R_16BF, s.k, &beta, y, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT_TENSOR_OP));
            } else {
              const LtPlan& p = plans[i];
              CHECK_BLAS(cublasLtMatmul(lt, p.desc, &alpha, w[i], p.la, x, p.lb, &beta, y, p.lc, y, p.lc,
                                        mode == 1 ? &top1[i] : &best_algo[i], workspace, workspace_bytes, 0));
            }
          }
        }
      };
      const float ms = TimeMs(forward, 5);
      const char* what = mode == 0 ? "cublasGemmEx default" : mode == 1 ? "cuBLASLt first guess"
                                                                        : "cuBLASLt fastest isolated";
      std::printf("%s layers in sequence (%d x qkv, o+res, gate_up, down+res): %s %.2f ms\n",
                  model == 0 ? "1B" : "8B", layers, what, ms);
    }
    for (int i = 0; i < 4; ++i) {
      DestroyPlan(plans[i]);
      cudaFree(w[i]);
    }
    cudaFree(x);
    cudaFree(y);
  }
  return 0;
}
