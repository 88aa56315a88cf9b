// The FP8 lm_head search (layers/fp8_head_argmax.h) outside its GEMM, on
// the Llama-3.1-8B head (128256 x 4096) and budget (8192 rows):
// 1. The top-8 scan (TopCandidatesKernel, kernels/fp8_argmax.cu): the
//    teacher's loads against other unroll depths and against loading each
//    pack's column scales with the pack, on a 4096-row chunk (the
//    teacher's) and on all 8192 rows. Every variant's candidate lists are
//    compared with the teacher kernel's before it is timed; one that
//    differs is reported and not timed. Two bounds, not checked: the scan
//    without column scales, and a plain read of the scores.
// 2. The chunking: the teacher's two 4096-row chunks (GEMM, then scan,
//    each) against one pass over 8192 rows (2.1 GB of scores), in
//    alternated rounds.
//
// Why: a Kineto profile of the tuned 8B forward (bench/README.md section
// 8, sixteenth session) put the scan at 0.99 ms per forward, 2.1 GB read
// at about 2.1 TB/s, and the FP8 GEMM at 6.69 ms in two chunks. The scan
// has one warp per row, so a 4096-row chunk fills half of the H200's
// warp slots, and each pack's 32 bytes of column scales were read after
// its 16 bytes of scores. Measured (seventeenth session): two packs per
// lane with their scales 1.25-1.27x the four-pack kernel of then, one
// 8192-row pass 1.02-1.05x two chunks; the teacher now does both.
//
// The kernels are this file's own: it includes fp8_argmax.cu, so the
// variants are the teacher's templates, not copies.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. bench/probes/fp8_head_probe.cu -lcublasLt -o /tmp/fp8_head_probe
//   /tmp/fp8_head_probe
#include "teacher_server/kernels/fp8_argmax.cu"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench/probes/cuda_probe_util.cuh"

namespace probe {

using bf16 = __nv_bfloat16;
constexpr int kRows = 8192, kChunk = 4096, kVocab = 128256, kHidden = 4096;
constexpr int kCand = e3::kernels::kFp8ArgmaxCandidates;
constexpr int kRounds = 3;

template <int U, bool ScalesFirst>
void Scan(const bf16* scores, int rows, const float* col_scale, int32_t* cand) {
  e3::kernels::TopCandidatesKernel<U, ScalesFirst><<<(rows + 7) / 8, 256>>>(scores, rows, kVocab, kVocab, col_scale,
                                                                            cand);
}

void TeacherScan(const bf16* scores, int rows, const float* col_scale, int32_t* cand) {
  if (!e3::kernels::TopScoreCandidates(scores, rows, kVocab, kVocab, col_scale, cand, nullptr)) {
    std::printf("the teacher's TopScoreCandidates refused the shape\n");
    std::exit(1);
  }
}

void ScanWithoutScales(const bf16* scores, int rows, const float*, int32_t* cand) {
  TeacherScan(scores, rows, nullptr, cand);
}

// Reads every pack of the scores once (16 bytes per lane, grid-stride);
// the sum's sign decides a store nobody reads, so nothing is elided.
__global__ void ReadAll(const uint4* __restrict__ p, size_t n, int32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = 1;
}

void ReadScores(const bf16* scores, int rows, const float*, int32_t* cand) {
  ReadAll<<<132 * 8, 256>>>(reinterpret_cast<const uint4*>(scores), size_t(rows) * kVocab / 8, cand);
}

struct ScanVariant {
  const char* name;
  void (*run)(const bf16*, int, const float*, int32_t*);
  bool checked;  // its candidate lists must be the teacher kernel's
};
const ScanVariant kScans[] = {
    {"teacher (U=2, scales first)", TeacherScan, true},
    {"U=4, scales per pack (before)", Scan<4, false>, true},
    {"U=4, scales first", Scan<4, true>, true},
    {"U=8, scales first", Scan<8, true>, true},
    {"U=8, scales per pack", Scan<8, false>, true},
    {"bound: no column scales", ScanWithoutScales, false},
    {"bound: read the scores only", ReadScores, false},
    {"teacher again (position check)", TeacherScan, true},
};
constexpr int kNumScans = sizeof(kScans) / sizeof(kScans[0]);

// Positive column scales of an e4m3 head's order (row max / 448), spread
// over a factor of 3 so that they reorder the raw scores.
__global__ void FillScales(float* s, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ 77u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    s[i] = (0.5f + (h & 0xffff) / 32768.f) / 448.f;
  }
}

size_t DifferentRows(const int32_t* a, const int32_t* b, int rows) {
  std::vector<int32_t> ha(size_t(rows) * kCand), hb(size_t(rows) * kCand);
  CHECK_CUDA(cudaMemcpy(ha.data(), a, ha.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hb.data(), b, hb.size() * 4, cudaMemcpyDeviceToHost));
  size_t differ = 0;
  for (int r = 0; r < rows; ++r) {
    differ += !std::equal(ha.begin() + size_t(r) * kCand, ha.begin() + size_t(r + 1) * kCand,
                          hb.begin() + size_t(r) * kCand);
  }
  return differ;
}

void Run() {
  const Lt lt;
  uint8_t *x8, *w8;
  bf16 *scores, *chunk_scores;
  float* col_scale;
  int32_t *want, *got, *chunked;
  CHECK_CUDA(cudaMalloc(&x8, size_t(kRows) * kHidden));
  CHECK_CUDA(cudaMalloc(&w8, size_t(kVocab) * kHidden));
  CHECK_CUDA(cudaMalloc(&scores, size_t(kRows) * kVocab * 2));
  CHECK_CUDA(cudaMalloc(&chunk_scores, size_t(kChunk) * kVocab * 2));
  CHECK_CUDA(cudaMalloc(&col_scale, size_t(kVocab) * 4));
  for (int32_t** c : {&want, &got, &chunked}) CHECK_CUDA(cudaMalloc(c, size_t(kRows) * kCand * 4));
  // The magnitudes of quantised rows: hidden rows scaled to 448 at their
  // maximum, head rows the same.
  FillRandomE4m3<<<1024, 256>>>(x8, size_t(kRows) * kHidden, 11, 448.f);
  FillRandomE4m3<<<1024, 256>>>(w8, size_t(kVocab) * kHidden, 12, 448.f);
  FillScales<<<256, 256>>>(col_scale, kVocab);
  // The FP8 lm_head product over all rows and over one chunk of them.
  LtPlan whole = lt.Plan(Shape{"lm_head", kRows, kVocab, kHidden}, /*fp8=*/true);
  LtPlan half = lt.Plan(Shape{"lm_head", kChunk, kVocab, kHidden}, /*fp8=*/true);
  if (whole.count == 0 || half.count == 0) {
    std::printf("cuBLASLt has no FP8 algorithm for the lm_head\n");
    std::exit(1);
  }
  lt.Run(whole, x8, w8, nullptr, scores);
  CHECK_CUDA(cudaGetLastError());

  // 1. The scan, on the first chunk and on all rows of one set of scores.
  for (const int rows : {kChunk, kRows}) {
    TeacherScan(scores, rows, col_scale, want);
    bool ok[kNumScans];
    for (int v = 0; v < kNumScans; ++v) {
      ok[v] = true;
      if (!kScans[v].checked) continue;
      CHECK_CUDA(cudaMemset(got, 0xff, size_t(rows) * kCand * 4));
      kScans[v].run(scores, rows, col_scale, got);
      CHECK_CUDA(cudaGetLastError());
      const size_t differ = DifferentRows(want, got, rows);
      ok[v] = differ == 0;
      if (!ok[v]) std::printf("scan %s: %zu of %d rows' candidates differ\n", kScans[v].name, differ, rows);
    }
    std::vector<double> t[kNumScans];
    for (int r = 0; r < kRounds; ++r) {
      for (int v = 0; v < kNumScans; ++v) {
        if (ok[v]) t[v].push_back(TimeMs([&] { kScans[v].run(scores, rows, col_scale, got); }, 20));
      }
    }
    const double bytes = double(rows) * kVocab * 2;
    std::printf("top-%d scan over %d x %d bf16 scores (%.2f GB), medians of %d interleaved rounds:\n", kCand, rows,
                kVocab, bytes / 1e9, kRounds);
    for (int v = 0; v < kNumScans; ++v) {
      if (!ok[v]) continue;
      const double ms = Median(t[v]);
      std::printf("  %-32s %7.1f us (%4.2f TB/s, %.3fx)\n", kScans[v].name, ms * 1e3, bytes / ms / 1e9,
                  Median(t[0]) / ms);
    }
  }

  // 2. Two chunks against one pass, GEMM and scan, alternated.
  const auto two_chunks = [&] {
    for (int c = 0; c < kRows / kChunk; ++c) {
      lt.Run(half, x8 + size_t(c) * kChunk * kHidden, w8, nullptr, chunk_scores);
      TeacherScan(chunk_scores, kChunk, col_scale, chunked + size_t(c) * kChunk * kCand);
    }
  };
  const auto one_pass = [&] {
    lt.Run(whole, x8, w8, nullptr, scores);
    TeacherScan(scores, kRows, col_scale, want);
  };
  two_chunks();
  one_pass();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("one pass against two chunks: %zu of %d rows' candidates differ (cuBLASLt's algorithm may differ "
              "with the row count)\n",
              DifferentRows(want, chunked, kRows), kRows);
  std::vector<double> t_two, t_one;
  for (int r = 0; r < 2 * kRounds; ++r) {
    t_two.push_back(TimeMs(two_chunks, 10));
    t_one.push_back(TimeMs(one_pass, 10));
  }
  std::printf("FP8 lm_head GEMM + scan, %d rows, medians of %d alternated rounds: two chunks %.3f ms, one pass "
              "%.3f ms (%.3fx)\n",
              kRows, 2 * kRounds, Median(t_two), Median(t_one), Median(t_two) / Median(t_one));
  std::vector<double> g_two, g_one;
  for (int r = 0; r < 2 * kRounds; ++r) {
    g_two.push_back(TimeMs([&] {
      lt.Run(half, x8, w8, nullptr, chunk_scores);
      lt.Run(half, x8 + size_t(kChunk) * kHidden, w8, nullptr, chunk_scores);
    }, 10));
    g_one.push_back(TimeMs([&] { lt.Run(whole, x8, w8, nullptr, scores); }, 10));
  }
  std::printf("  the GEMM alone: two chunks %.3f ms, one pass %.3f ms (%.3fx)\n", Median(g_two), Median(g_one),
              Median(g_two) / Median(g_one));
  DestroyPlan(whole);
  DestroyPlan(half);
  for (void* p : std::initializer_list<void*>{x8, w8, scores, chunk_scores, col_scale, want, got, chunked}) cudaFree(p);
}

}  // namespace probe

int main() {
  probe::Run();
  return 0;
}
