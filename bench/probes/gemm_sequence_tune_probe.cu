// Searches cuBLASLt's algorithms for the 8B teacher's GEMMs *inside a
// forward's sequence* (GPU machine). gemm_algo_probe.cu timed each shape
// alone and found that isolated winners lose in sequence: on a
// power-capped board a GEMM's speed depends on the clock the whole
// sequence leaves it. So here every candidate is judged by the time of the
// whole sequence it runs in: 32 layers of qkv, o_proj + residual, gate_up,
// down_proj + residual (each layer its own weights, as a model has), then
// the FP8 lm_head nomination GEMM. Coordinate descent: one shape's
// candidates at a time, the others at their current choice; then the
// tuned set against the heuristic's first choices in alternated rounds.
// The teacher's own tuner (teacher_server/layers/gemm_tuning.h) runs the
// same search at startup on the model's weights; this probe keeps the
// wider candidate set (cluster and swizzle variants) and the FP8 lm_head.
//
//   nvcc -O2 -std=c++17 -arch=sm_90a -I. bench/probes/gemm_sequence_tune_probe.cu -lcublasLt -o /tmp/seq_tune
//   /tmp/seq_tune [max_candidates_per_shape]
#include <cuda_fp8.h>

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "bench/probes/cuda_probe_util.cuh"

namespace {

constexpr int kLayers = 32;
constexpr size_t kWorkspace = size_t{32} << 20;

struct Problem {
  const char* name;
  int m, n, k;
  bool residual;  // beta = 1 with C = the residual stream
  bool fp8;       // e4m3 operands, bf16 output, fast accumulation
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  std::vector<cublasLtMatmulAlgo_t> candidates;
  std::vector<std::string> labels;
  int chosen = 0;
};

void Prepare(cublasLtHandle_t lt, Problem& p, int max_candidates) {
  CHECK_BLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (p.fp8) {
    const int8_t on = 1;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)));
  }
  const cudaDataType_t ab = p.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.la, ab, p.k, p.n, p.k));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.lb, ab, p.k, p.m, p.k));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_16BF, p.n, p.m, p.n));
  cublasLtMatmulPreference_t pref;
  CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspace;
  CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(max_candidates);
  int count = 0;
  CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.la, p.lb, p.lc, p.lc, pref, max_candidates,
                                            results.data(), &count));
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<std::string> seen;
  auto add = [&](const cublasLtMatmulAlgo_t& a) {
    cublasLtMatmulHeuristicResult_t check;
    if (cublasLtMatmulAlgoCheck(lt, p.desc, p.la, p.lb, p.lc, p.lc, &a, &check) != CUBLAS_STATUS_SUCCESS) return;
    if (check.workspaceSize > kWorkspace) return;
    const std::string label = LtAlgoLabel(a);
    if (std::find(seen.begin(), seen.end(), label) != seen.end()) return;
    seen.push_back(label);
    p.candidates.push_back(a);
    p.labels.push_back(label);
  };
  for (int i = 0; i < count; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) add(results[i].algo);
  }
  // Variants of the first two: the other CTA swizzle and other cluster
  // shapes, where the algorithm accepts them.
  const int base = int(p.candidates.size());
  for (int i = 0; i < std::min(base, 2); ++i) {
    for (const cublasLtMatmulAlgo_t& a :
         LtAlgoVariants(p.candidates[i], {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                          CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1,
                                          CUBLASLT_CLUSTER_SHAPE_4x1x1, CUBLASLT_CLUSTER_SHAPE_1x4x1})) {
      add(a);
    }
  }
}

struct Buffers {
  __nv_bfloat16 *x, *attn, *act, *qkv, *gu, *res_a, *res_b, *logits;
  uint8_t *x8, *w8;
  std::vector<std::array<__nv_bfloat16*, 4>> w;  // per layer: qkv, o, gate_up, down
};

}  // namespace

int main(int argc, char** argv) {
  const int max_candidates = argc > 1 ? std::atoi(argv[1]) : 24;
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasLtCreate(&lt));
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, kWorkspace));
  const int T = kProbeTokens, H = 4096, I = 14336, QKV = 6144, V = 128256;
  std::vector<Problem> problems = {
      {"qkv", T, QKV, H, false, false},  {"o_proj+res", T, H, H, true, false},
      {"gate_up", T, 2 * I, H, false, false}, {"down+res", T, H, I, true, false},
      {"lm_head fp8", T, V, H, false, true},
  };
  for (Problem& p : problems) {
    Prepare(lt, p, max_candidates);
    std::printf("%s (m %d n %d k %d): %zu candidates\n", p.name, p.m, p.n, p.k, p.candidates.size());
    for (size_t c = 0; c < p.labels.size(); ++c) std::printf("  [%zu] %s\n", c, p.labels[c].c_str());
  }
  Buffers b;
  auto bf16 = [](size_t n, unsigned seed, float scale) {
    __nv_bfloat16* p;
    CHECK_CUDA(cudaMalloc(&p, n * 2));
    FillRandom<<<1024, 256>>>(p, n, seed, scale);
    return p;
  };
  b.x = bf16(size_t(T) * H, 1, 1.f);
  b.attn = bf16(size_t(T) * H, 2, 1.f);
  b.act = bf16(size_t(T) * I, 3, 1.f);
  b.qkv = bf16(size_t(T) * QKV, 4, 0.f);
  b.gu = bf16(size_t(T) * 2 * I, 5, 0.f);
  b.res_a = bf16(size_t(T) * H, 6, 1.f);
  b.res_b = bf16(size_t(T) * H, 7, 1.f);
  b.logits = bf16(size_t(T) * V, 8, 0.f);
  CHECK_CUDA(cudaMalloc(&b.x8, size_t(T) * H));
  CHECK_CUDA(cudaMalloc(&b.w8, size_t(V) * H));
  FillRandomE4m3<<<1024, 256>>>(b.x8, size_t(T) * H, 9, 4.f);
  FillRandomE4m3<<<1024, 256>>>(b.w8, size_t(V) * H, 10, 0.5f);
  for (int l = 0; l < kLayers; ++l) {
    const float s = 0.02f;
    b.w.push_back({bf16(size_t(QKV) * H, 100 + 4 * l, s), bf16(size_t(H) * H, 101 + 4 * l, s),
                   bf16(size_t(2 * I) * H, 102 + 4 * l, s), bf16(size_t(H) * I, 103 + 4 * l, s)});
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  auto run = [&](Problem& p, int c, const void* w, const void* x, const void* res, void* y) {
    const float alpha = 1.f, beta = p.residual ? 1.f : 0.f;
    CHECK_BLAS(cublasLtMatmul(lt, p.desc, &alpha, w, p.la, x, p.lb, &beta, p.residual ? res : y, p.lc, y, p.lc,
                              &p.candidates[c], workspace, kWorkspace, 0));
  };
  // One forward's GEMMs with candidate `choice[s]` for shape s.
  auto forward = [&](const std::vector<int>& choice) {
    __nv_bfloat16 *res = b.res_a, *next = b.res_b;
    for (int l = 0; l < kLayers; ++l) {
      run(problems[0], choice[0], b.w[l][0], b.x, nullptr, b.qkv);
      run(problems[1], choice[1], b.w[l][1], b.attn, res, next);
      std::swap(res, next);
      run(problems[2], choice[2], b.w[l][2], b.x, nullptr, b.gu);
      run(problems[3], choice[3], b.w[l][3], b.act, res, next);
      std::swap(res, next);
    }
    run(problems[4], choice[4], b.w8, b.x8, nullptr, b.logits);
  };
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  // Median of `reps` forwards after one untimed one.
  auto time_forward = [&](const std::vector<int>& choice, int reps) {
    forward(choice);
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(e0);
      forward(choice);
      cudaEventRecord(e1);
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };

  const std::vector<int> first(problems.size(), 0);
  std::vector<int> best = first;
  float best_ms = time_forward(best, 3);
  std::printf("\nheuristic's first choices: %.2f ms per forward's GEMMs\n", best_ms);
  for (int pass = 0; pass < 2; ++pass) {
    bool moved = false;
    for (size_t s = 0; s < problems.size(); ++s) {
      Problem& p = problems[s];
      const float incumbent = time_forward(best, 3);
      int pick = best[s];
      float pick_ms = incumbent;
      std::printf("pass %d %s: incumbent [%d] %.2f ms;", pass, p.name, best[s], incumbent);
      for (size_t c = 0; c < p.candidates.size(); ++c) {
        if (int(c) == best[s]) continue;
        std::vector<int> trial = best;
        trial[s] = int(c);
        const float t = time_forward(trial, 2);
        std::printf(" [%zu] %.2f", c, t);
        if (t < pick_ms) {
          pick_ms = t;
          pick = int(c);
        }
      }
      std::printf("\n");
      if (pick != best[s] && pick_ms < incumbent * 0.997f) {
        // Confirm against the incumbent in alternated rounds.
        std::vector<int> trial = best;
        trial[s] = pick;
        float sum_new = 0, sum_old = 0;
        for (int r = 0; r < 3; ++r) {
          sum_new += time_forward(trial, 3);
          sum_old += time_forward(best, 3);
        }
        std::printf("  confirm [%d] %.2f vs [%d] %.2f ms\n", pick, sum_new / 3, best[s], sum_old / 3);
        if (sum_new < sum_old * 0.997f) {
          best = trial;
          moved = true;
          std::printf("  -> %s takes [%d] %s\n", p.name, pick, p.labels[pick].c_str());
        }
      }
    }
    if (!moved) break;
  }
  std::printf("\nfinal: first choices vs tuned, alternated rounds (ms per forward's GEMMs):\n");
  for (int r = 0; r < 6; ++r) {
    const float a = time_forward(first, 3), t = time_forward(best, 3);
    std::printf("  round %d: first %.2f tuned %.2f ratio %.4f\n", r, a, t, a / t);
  }
  for (size_t s = 0; s < problems.size(); ++s) {
    std::printf("%s: [%d] %s\n", problems[s].name, best[s], problems[s].labels[best[s]].c_str());
  }
  return 0;
}
