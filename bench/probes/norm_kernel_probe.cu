// The teacher's RMSNorm kernel (fused_kernels.cu AddRmsNorm) on the 1B and
// 8B shapes: time per call and the memory bandwidth it reaches, with and
// without the residual add. Built once per launch shape to compare them
// (interleave the binaries' runs; run on an otherwise idle GPU):
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. bench/probes/norm_kernel_probe.cu \
//       teacher_server/kernels/fused_kernels.cu -o /tmp/norm4
//   nvcc ... -DE3_NORM_PACKS_PER_THREAD=1 ... -o /tmp/norm1   (the packs of 8 each thread takes; default 4)
//
// The SiLU-mul kernel of the same shapes is timed too, as a bandwidth
// reference for a plain streaming kernel.
#include <cstdio>

#include "bench/probes/cuda_probe_util.cuh"
#include "teacher_server/kernels/fused_kernels.h"

int main() {
  using e3::kernels::Dtype;
  struct NormShape { const char* name; int rows, cols, inter; };
  const NormShape shapes[] = {{"1B 8x1024", 8192, 2048, 8192}, {"1B chat mix", 7770, 2048, 8192},
                              {"8B 8x1024", 8192, 4096, 14336}};
#ifdef E3_NORM_PACKS_PER_THREAD
  std::printf("norm kernel: %d packs of 8 per thread\n", E3_NORM_PACKS_PER_THREAD);
#else
  std::printf("norm kernel: the default packs per thread (fused_kernels.cu)\n");
#endif
  for (const NormShape& s : shapes) {
    const size_t n = size_t(s.rows) * s.cols;
    __nv_bfloat16 *h, *delta, *w, *sum, *out, *gate_up, *act;
    CHECK_CUDA(cudaMalloc(&h, n * 2));
    CHECK_CUDA(cudaMalloc(&delta, n * 2));
    CHECK_CUDA(cudaMalloc(&sum, n * 2));
    CHECK_CUDA(cudaMalloc(&out, n * 2));
    CHECK_CUDA(cudaMalloc(&w, size_t(s.cols) * 2));
    CHECK_CUDA(cudaMalloc(&gate_up, size_t(s.rows) * s.inter * 4));
    CHECK_CUDA(cudaMalloc(&act, size_t(s.rows) * s.inter * 2));
    FillRandom<<<1024, 256>>>(h, n, 1, 4.f);
    FillRandom<<<1024, 256>>>(delta, n, 2);
    FillRandom<<<1024, 256>>>(w, s.cols, 3);
    FillRandom<<<1024, 256>>>(gate_up, size_t(s.rows) * s.inter * 2, 4);
    const double bytes = double(n) * 2;
    const float norm = TimeMs([&] {
      e3::kernels::AddRmsNorm(Dtype::kBFloat16, h, nullptr, w, nullptr, out, s.rows, s.cols, 1e-5f, nullptr);
    }, 200);
    const float add_norm = TimeMs([&] {
      e3::kernels::AddRmsNorm(Dtype::kBFloat16, h, delta, w, sum, out, s.rows, s.cols, 1e-5f, nullptr);
    }, 200);
    const float silu = TimeMs([&] {
      e3::kernels::SiluMul(Dtype::kBFloat16, gate_up, act, s.rows, s.inter, nullptr, nullptr);
    }, 100);
    CHECK_CUDA(cudaGetLastError());
    std::printf("%-12s norm %7.1f us (%4.2f TB/s)   add+norm %7.1f us (%4.2f TB/s)   silu-mul %7.1f us (%4.2f TB/s)\n",
                s.name, norm * 1e3, 2 * bytes / norm / 1e9, add_norm * 1e3, 4 * bytes / add_norm / 1e9, silu * 1e3,
                3.0 * s.rows * s.inter * 2 / silu / 1e9);
    cudaFree(h); cudaFree(delta); cudaFree(sum); cudaFree(out); cudaFree(w); cudaFree(gate_up); cudaFree(act);
  }
  return 0;
}
