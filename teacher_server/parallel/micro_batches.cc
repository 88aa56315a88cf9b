#include "teacher_server/parallel/micro_batches.h"

#include <atomic>
#include <cstdlib>

namespace e3 {
namespace {

std::atomic<int64_t> g_overlapped{0};

}  // namespace

int64_t OverlappedForwards() { return g_overlapped.load(std::memory_order_relaxed); }
void CountOverlappedForward() { g_overlapped.fetch_add(1, std::memory_order_relaxed); }

int64_t OverlapSplitPoint(const std::vector<int64_t>& cu_seqlens, int64_t min_tokens) {
  const int64_t samples = static_cast<int64_t>(cu_seqlens.size()) - 1;
  if (samples < 2 || min_tokens <= 0) return 0;
  const int64_t total = cu_seqlens.back();
  int64_t best = 1;
  for (int64_t k = 2; k < samples; ++k) {
    // |2 * cu[k] - total| compares distances to total / 2 without rounding.
    if (std::llabs(2 * cu_seqlens[k] - total) < std::llabs(2 * cu_seqlens[best] - total)) best = k;
  }
  const int64_t first = cu_seqlens[best];
  return first >= min_tokens && total - first >= min_tokens ? best : 0;
}

std::vector<int64_t> SampleRangeOffsets(const std::vector<int64_t>& cu_seqlens, int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  out.reserve(end - begin + 1);
  for (int64_t i = begin; i <= end; ++i) out.push_back(cu_seqlens[i] - cu_seqlens[begin]);
  return out;
}

}  // namespace e3
