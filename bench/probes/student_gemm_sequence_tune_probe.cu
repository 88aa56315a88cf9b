// How much could choosing cuBLASLt's algorithms gain for the student's
// fast TTT step (8B shape) inside the step's own GEMM sequence (GPU
// machine)? The step runs at the board's power cap, so, as for the
// teacher (gemm_sequence_tune_probe.cu), a candidate is judged by the time
// of the whole sequence it runs in, never alone.
//
// The sequence is the step's GEMMs in the step's order and forms (row-major
// C[m, n] = A[m, k] B[k, n], A or B read transposed where the step reads
// them so): once per batch fc, the q/k/v embedding half and the target
// logits (fp32 out); per TTT step q/k/v's hidden half, o and down with the
// residual in the epilogue and gate_up; the head's lm_head forward, input
// gradient and weight gradient (accumulated) per chunk of `chunk` rows;
// per step the input and weight gradients (accumulated, q/k/v's into its
// column block of the fused weight); once fc's weight gradient and the
// embedding half's G (fp32 out). Attention and the elementwise kernels are
// left out, so the board runs hotter than in the step: a gain here is an
// upper bound on the step's.
//
// Candidates: the heuristic's (its first choice is what at::mm and the
// step's cuBLASLt calls run), none that splits K, then the first two's
// swizzle and cluster variants. Coordinate descent over the problems, then
// the tuned set against the first choices in alternated rounds.
//
//   nvcc -O2 -std=c++17 -arch=sm_90a -I. bench/probes/student_gemm_sequence_tune_probe.cu -lcublasLt -o /tmp/student_seq_tune
//   /tmp/student_seq_tune [tokens=16384] [max_candidates=8] [passes=1]
#include <string>
#include <vector>

#include "bench/probes/cuda_probe_util.cuh"

namespace {

constexpr size_t kWorkspace = size_t{32} << 20;

// One GEMM form of the step, row-major: C[m, n] (+)= A[m, k] B[k, n].
struct Problem {
  std::string name;
  int64_t m, n, k;
  bool a_stored_transposed;  // A lies in memory as [k, m]
  bool b_stored_transposed;  // B lies in memory as [n, k] (a weight read as W^T)
  int64_t b_row_stride;      // B's row stride where it is a column block (0: dense)
  int64_t c_row_stride;      // C's row stride where it is a column block (0: dense)
  bool accumulate;           // C += (beta = 1, C is D)
  bool residual;             // D = AB + R (beta = 1, R separate)
  bool fp32_out;
  int calls;                 // per step
  // cuBLASLt's descriptors (column-major: C^T = B^T A^T).
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  std::vector<cublasLtMatmulAlgo_t> candidates;
  std::vector<std::string> labels;
  void *a = nullptr, *b = nullptr, *c = nullptr, *r = nullptr;
};

void Describe(Problem& p) {
  CHECK_BLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is our B, its B our A.
  const cublasOperation_t ta = p.b_stored_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.a_stored_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (p.b_stored_transposed) {
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, p.k, p.n, p.b_row_stride ? p.b_row_stride : p.k));
  } else {
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, p.n, p.k, p.b_row_stride ? p.b_row_stride : p.n));
  }
  if (p.a_stored_transposed) {
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, p.m, p.k, p.m));
  } else {
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, p.k, p.m, p.k));
  }
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.lc, p.fp32_out ? CUDA_R_32F : CUDA_R_16BF, p.n, p.m,
                                        p.c_row_stride ? p.c_row_stride : p.n));
}

void FindCandidates(cublasLtHandle_t lt, Problem& p, int max_candidates) {
  cublasLtMatmulPreference_t pref;
  CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspace;
  CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(32);
  int count = 0;
  CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.la, p.lb, p.lc, p.lc, pref, 32, results.data(), &count));
  cublasLtMatmulPreferenceDestroy(pref);
  auto add = [&](const cublasLtMatmulAlgo_t& a) {
    if (int(p.candidates.size()) >= max_candidates) return;
    if (LtAlgoConfig<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1) return;
    cublasLtMatmulHeuristicResult_t check;
    if (cublasLtMatmulAlgoCheck(lt, p.desc, p.la, p.lb, p.lc, p.lc, &a, &check) != CUBLAS_STATUS_SUCCESS) return;
    if (check.workspaceSize > kWorkspace) return;
    const std::string label = LtAlgoLabel(a);
    if (std::find(p.labels.begin(), p.labels.end(), label) != p.labels.end()) return;
    p.candidates.push_back(a);
    p.labels.push_back(label);
  };
  if (count > 0 && results[0].state == CUBLAS_STATUS_SUCCESS) add(results[0].algo);
  // Variants of the first choice: the other swizzle and cluster shapes.
  if (!p.candidates.empty()) {
    for (const cublasLtMatmulAlgo_t& a :
         LtAlgoVariants(p.candidates[0], {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                          CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1})) {
      add(a);
    }
  }
  for (int i = 1; i < count; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) add(results[i].algo);
  }
}

void* Random(size_t elements, unsigned seed, float scale, bool fp32 = false) {
  void* p;
  CHECK_CUDA(cudaMalloc(&p, elements * (fp32 ? 4 : 2)));
  if (fp32) {
    CHECK_CUDA(cudaMemset(p, 0, elements * 4));
  } else {
    FillRandom<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), elements, seed, scale);
  }
  return p;
}

// The step's GEMMs at `tokens` tokens (one sample, every position trained),
// 8B shape, TTT 7, draft vocabulary 32000, head chunks of `chunk` rows.
std::vector<Problem> StepProblems(int64_t T, int64_t chunk) {
  const int64_t H = 4096, I = 14336, QKV = 6144, V = 32000, steps = 7;
  const int chunks = int((steps * T + chunk - 1) / chunk);
  const int s = int(steps);
  // name, m, n, k, A^T, B^T, B stride, C stride, accumulate, residual, fp32, calls
  return {
      {"fc fwd", T, H, 3 * H, false, true, 0, 0, false, false, false, 1},
      {"qkv embed-half fwd", T, QKV, H, false, true, 2 * H, 0, false, false, false, 1},
      {"target logits fp32", T, V, H, false, true, 0, 0, false, false, true, 1},
      {"qkv hidden-half fwd +res", T, QKV, H, false, true, 2 * H, 0, false, true, false, s},
      {"o fwd +res", T, H, H, false, true, 0, 0, false, true, false, s},
      {"gate_up fwd", T, 2 * I, H, false, true, 0, 0, false, false, false, s},
      {"down fwd +res", T, H, I, false, true, 0, 0, false, true, false, s},
      {"lm_head fwd", chunk, V, H, false, true, 0, 0, false, false, false, chunks},
      {"lm_head dx", chunk, H, V, false, false, 0, 0, false, false, false, chunks},
      {"lm_head dw +=", V, H, chunk, true, false, 0, 0, true, false, false, chunks},
      {"down dx", T, I, H, false, false, 0, 0, false, false, false, s},
      {"down dw +=", H, I, T, true, false, 0, 0, true, false, false, s},
      {"gate_up dx", T, H, 2 * I, false, false, 0, 0, false, false, false, s},
      {"gate_up dw +=", 2 * I, H, T, true, false, 0, 0, true, false, false, s},
      {"o dx", T, H, H, false, false, 0, 0, false, false, false, s},
      {"o dw +=", H, H, T, true, false, 0, 0, true, false, false, s},
      {"qkv hidden-half dx", T, H, QKV, false, false, 2 * H, 0, false, false, false, s},
      {"qkv hidden-half dw +=", QKV, H, T, true, false, 0, 2 * H, true, false, false, s},
      {"fc dw +=", H, 3 * H, T, true, false, 0, 0, true, false, false, 1},
      {"embed-half G fp32", QKV, H, T, true, false, 0, 0, false, false, true, 1},
  };
}

void Allocate(Problem& p, unsigned seed) {
  const int64_t a_elems = p.m * p.k;
  const int64_t b_elems = p.b_row_stride ? (p.b_stored_transposed ? p.n : p.k) * p.b_row_stride : p.k * p.n;
  const int64_t c_elems = p.c_row_stride ? p.m * p.c_row_stride : p.m * p.n;
  p.a = Random(a_elems, seed, 1.f);
  p.b = Random(b_elems, seed + 1, 0.02f);
  p.c = Random(c_elems, seed + 2, 0.01f, p.fp32_out);
  if (p.residual) p.r = Random(p.m * p.n, seed + 3, 1.f);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int max_candidates = argc > 2 ? std::atoi(argv[2]) : 8;
  const int passes = argc > 3 ? std::atoi(argv[3]) : 1;
  const int64_t chunk = tokens >= 8192 ? 8192 : tokens;
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasLtCreate(&lt));
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, kWorkspace));
  std::vector<Problem> problems = StepProblems(tokens, chunk);
  double tflop = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    Problem& p = problems[i];
    Describe(p);
    FindCandidates(lt, p, max_candidates);
    Allocate(p, 100 + 10 * unsigned(i));
    const double f = 2.0 * p.m * p.n * p.k * p.calls / 1e12;
    tflop += f;
    std::printf("%-24s m %6ld n %6ld k %6ld x%-2d %6.2f TFLOP: %zu candidates\n", p.name.c_str(), long(p.m),
                long(p.n), long(p.k), p.calls, f, p.candidates.size());
    for (size_t c = 0; c < p.labels.size(); ++c) std::printf("    [%zu] %s\n", c, p.labels[c].c_str());
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  auto run = [&](Problem& p, int c) {
    const float alpha = 1.f, beta = (p.accumulate || p.residual) ? 1.f : 0.f;
    const void* cin = p.residual ? p.r : p.c;
    CHECK_BLAS(cublasLtMatmul(lt, p.desc, &alpha, p.b, p.la, p.a, p.lb, &beta, cin, p.lc, p.c, p.lc,
                              &p.candidates[c], workspace, kWorkspace, 0));
  };
  // The step's order: once-per-batch forwards, the steps' forwards, the
  // head's chunks, the steps' backwards, the once-per-batch gradients.
  auto sequence = [&](const std::vector<int>& choice) {
    auto go = [&](int i) { run(problems[i], choice[i]); };
    for (int i = 0; i < 3; ++i) go(i);
    for (int s = 0; s < problems[4].calls; ++s) for (int i = 3; i < 7; ++i) go(i);
    for (int c = 0; c < problems[7].calls; ++c) for (int i = 7; i < 10; ++i) go(i);
    for (int s = 0; s < problems[10].calls; ++s) for (int i = 10; i < 18; ++i) go(i);
    for (int i = 18; i < 20; ++i) go(i);
  };
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto time_sequence = [&](const std::vector<int>& choice, int reps) {
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(e0);
      sequence(choice);
      cudaEventRecord(e1);
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      ms.push_back(t);
    }
    return Median(ms);
  };

  const std::vector<int> first(problems.size(), 0);
  std::vector<int> best = first;
  time_sequence(best, 2);  // warm the clocks into the power cap
  const float first_ms = time_sequence(best, 3);
  std::printf("\n%.1f TFLOP; heuristic's first choices: %.2f ms per sequence (%.0f TFLOP/s)\n", tflop, first_ms,
              tflop / first_ms * 1e3);
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = 0; i < problems.size(); ++i) {
      Problem& p = problems[i];
      if (p.candidates.size() < 2) continue;
      const float incumbent = time_sequence(best, 2);
      int pick = best[i];
      float pick_ms = incumbent;
      std::printf("pass %d %s: incumbent [%d] %.2f;", pass, p.name.c_str(), best[i], incumbent);
      for (size_t c = 0; c < p.candidates.size(); ++c) {
        if (int(c) == best[i]) continue;
        std::vector<int> trial = best;
        trial[i] = int(c);
        const float t = time_sequence(trial, 1);
        std::printf(" [%zu] %.2f", c, t);
        if (t < pick_ms) {
          pick_ms = t;
          pick = int(c);
        }
      }
      std::printf("\n");
      if (pick == best[i] || pick_ms >= incumbent * 0.998f) continue;
      std::vector<int> trial = best;
      trial[i] = pick;
      float sum_new = 0, sum_old = 0;
      for (int r = 0; r < 2; ++r) {
        sum_new += time_sequence(trial, 2);
        sum_old += time_sequence(best, 2);
      }
      std::printf("  confirm [%d] %.2f against [%d] %.2f\n", pick, sum_new / 2, best[i], sum_old / 2);
      if (sum_new < sum_old * 0.998f) {
        best = trial;
        std::printf("  -> %s takes [%d] %s\n", p.name.c_str(), pick, p.labels[pick].c_str());
      }
    }
  }
  std::printf("\nfirst choices against tuned, alternated rounds (ms per sequence):\n");
  for (int r = 0; r < 5; ++r) {
    const float a = time_sequence(first, 2), t = time_sequence(best, 2);
    std::printf("  round %d: first %.2f tuned %.2f ratio %.4f\n", r, a, t, a / t);
  }
  for (size_t i = 0; i < problems.size(); ++i) {
    if (best[i] != 0) std::printf("%s: [%d] %s\n", problems[i].name.c_str(), best[i], problems[i].labels[best[i]].c_str());
  }
  return 0;
}
