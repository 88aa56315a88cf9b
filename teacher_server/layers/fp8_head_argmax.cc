#include "teacher_server/layers/fp8_head_argmax.h"

#include <algorithm>
#include <atomic>

#include "common/torch/gemm.h"

#ifdef E3_HAS_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "common/gpu/cuda_runtime.h"
#include "kernels/fp8_argmax.h"
#include "teacher_server/layers/kernel_launch.h"
#endif

namespace e3 {
namespace {

std::atomic<int64_t> g_calls{0};

}  // namespace

std::unique_ptr<Fp8HeadArgmax> Fp8HeadArgmax::Prepare(const at::Tensor& w) {
#ifdef E3_HAS_CUDA
  if (!w.is_cuda() || w.scalar_type() != at::kBFloat16 || w.dim() != 2 || !w.is_contiguous()) return nullptr;
  const int64_t V = w.size(0), H = w.size(1);
  if (V == 0 || H == 0 || V % 16 != 0 || H % 16 != 0) return nullptr;
  // GemmE4m3 would refuse: checked before the head is quantised.
  if (CudaComputeCapability(w.device().index()) < 89) return nullptr;
  const c10::cuda::CUDAGuard guard(w.device());
  std::unique_ptr<Fp8HeadArgmax> head(new Fp8HeadArgmax());
  head->w_ = w;
  head->wq_ = at::empty({V, H}, w.options().dtype(at::kByte));
  head->w_scale_ = at::empty({V}, w.options().dtype(at::kFloat));
  at::Tensor nonfinite = at::empty({V}, w.options().dtype(at::kByte));
  CheckKernelLaunch(kernels::QuantizeRowsE4m3(w.data_ptr(), H, V, H, head->wq_.data_ptr(),
                                              head->w_scale_.data_ptr<float>(), nonfinite.data_ptr<uint8_t>(),
                                              CurrentStream(w)),
                    "e4m3 head");
  if (nonfinite.any().item<bool>()) return nullptr;
  // A probe product: cuBLASLt may still have no FP8 algorithm here.
  if (!GemmE4m3(head->wq_.narrow(0, 0, 16), head->wq_.narrow(0, 0, 16)).defined()) return nullptr;
  return head;
#else
  (void)w;
  return nullptr;
#endif
}

at::Tensor Fp8HeadArgmax::Argmax(const at::Tensor& x, at::Tensor* best_logit) const {
#ifdef E3_HAS_CUDA
  const int64_t H = w_.size(1), V = w_.size(0);
  if (x.dim() != 2 || x.size(1) != H || x.size(0) == 0 || x.scalar_type() != at::kBFloat16 ||
      x.device() != w_.device() || x.stride(1) != 1 || x.stride(0) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) {
    return {};
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0);
  at::Tensor xq = at::empty({rows, H}, x.options().dtype(at::kByte));
  at::Tensor nonfinite = at::empty({rows}, x.options().dtype(at::kByte));
  // No row scales: a positive factor per row leaves its argmax unchanged.
  CheckKernelLaunch(kernels::QuantizeRowsE4m3(x.data_ptr(), x.stride(0), rows, H, xq.data_ptr(), nullptr,
                                              nonfinite.data_ptr<uint8_t>(), CurrentStream(x)),
                    "e4m3 hidden rows");
  at::Tensor cand = at::empty({rows, kernels::kFp8ArgmaxCandidates}, x.options().dtype(at::kInt));
  // bf16 scores in chunks of up to 2 GiB, whole 256-row tiles for
  // cuBLASLt: 8192 rows at a 128k vocab, an 8x1024 budget in one pass. The
  // top-8 scan has one warp per row, so a 4096-row chunk fills only half
  // of the GPU's warp slots: one 8192-row pass beats two chunks
  // (bench/results/2026-12-02-teacher-kernels-gemm-tuning.md; the same candidates).
  constexpr int64_t kScoreChunkBytes = int64_t{2} << 30;
  const int64_t chunk = LmHeadChunkRows(2 * V, 256, kScoreChunkBytes);
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t n = std::min(chunk, rows - start);
    const at::Tensor scores = GemmE4m3(xq.narrow(0, start, n), wq_);
    if (!scores.defined()) return {};
    CheckKernelLaunch(kernels::TopScoreCandidates(scores.data_ptr(), n, V, V, w_scale_.data_ptr<float>(),
                                                  cand.data_ptr<int32_t>() + start * kernels::kFp8ArgmaxCandidates,
                                                  CurrentStream(x)),
                      "FP8 score candidates");
  }
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kInt));
  at::Tensor best;
  if (best_logit != nullptr) best = at::empty({rows}, x.options().dtype(at::kFloat));
  CheckKernelLaunch(kernels::RescoreCandidates(x.data_ptr(), x.stride(0), w_.data_ptr(), H, rows, V, H,
                                               cand.data_ptr<int32_t>(), nonfinite.data_ptr<uint8_t>(),
                                               out.data_ptr<int32_t>(),
                                               best.defined() ? best.data_ptr<float>() : nullptr, CurrentStream(x)),
                    "exact rescoring");
  if (best_logit != nullptr) *best_logit = best;
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return out;
#else
  (void)x;
  (void)best_logit;
  return at::Tensor();
#endif
}

int64_t Fp8HeadArgmaxCalls() { return g_calls.load(std::memory_order_relaxed); }

}  // namespace e3
