#include "teacher_server/layers/sink_attention.h"

#include <algorithm>
#include <limits>

namespace e3 {
namespace {

// Score elements per chunk: 2^26 fp32 values, 256 MiB.
constexpr int64_t kChunkScores = int64_t{1} << 26;

// [kv_heads, n, D] -> [heads, n, D]: kv head j serves query heads
// [j * n_rep, (j + 1) * n_rep), as transformers' repeat_kv.
at::Tensor RepeatKv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t kvh = x.size(0), n = x.size(1), d = x.size(2);
  return x.unsqueeze(1).expand({kvh, n_rep, n, d}).reshape({kvh * n_rep, n, d});
}

// True where query q0 + a may not see key k0 + b: a later key, or one that
// has left the window.
at::Tensor HiddenKeys(int64_t q0, int64_t nq, int64_t k0, int64_t nk, int64_t window, const at::Device& device) {
  const auto opts = torch::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor qi = torch::arange(q0, q0 + nq, opts).unsqueeze(1);
  const at::Tensor kj = torch::arange(k0, k0 + nk, opts).unsqueeze(0);
  at::Tensor hidden = kj > qi;
  if (window > 0) hidden = hidden.logical_or(kj <= qi - window);
  return hidden;
}

// Rows [q0, q0 + nq) of one sample: qs [heads, n, D], ks/vs [heads, n, D].
at::Tensor AttendRows(const at::Tensor& qs, const at::Tensor& ks, const at::Tensor& vs, int64_t q0, int64_t nq,
                      double scaling, const at::Tensor& sinks, int64_t window) {
  const int64_t heads = qs.size(0);
  // Keys before k0 are outside every row's window: skipping them drops
  // only columns whose probability would be exactly zero.
  const int64_t k0 = window > 0 ? std::max<int64_t>(0, q0 - window + 1) : 0, nk = q0 + nq - k0;
  at::Tensor scores = at::matmul(qs.narrow(1, q0, nq), ks.narrow(1, k0, nk).transpose(1, 2)) * scaling;
  scores = scores.masked_fill(HiddenKeys(q0, nq, k0, nk, window, qs.device()),
                              -std::numeric_limits<float>::infinity());
  if (sinks.defined()) {
    scores = torch::cat({scores, sinks.to(scores.scalar_type()).view({heads, 1, 1}).expand({heads, nq, 1})}, -1);
  }
  scores = scores - std::get<0>(scores.max(-1, /*keepdim=*/true));
  at::Tensor probs = at::softmax(scores, -1, scores.scalar_type()).narrow(-1, 0, nk);
  return at::matmul(probs.to(vs.scalar_type()), vs.narrow(1, k0, nk));
}

}  // namespace

at::Tensor PackedSinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const PackedLayout& layout, double scaling, const at::Tensor& sinks,
                               int64_t sliding_window) {
  const int64_t heads = q.size(1), n_rep = heads / k.size(1);
  at::Tensor out = torch::empty_like(q);
  const std::vector<int64_t>& cu = layout.cu_seqlens;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t begin = cu[s], n = cu[s + 1] - begin;
    const at::Tensor qs = q.narrow(0, begin, n).transpose(0, 1);
    const at::Tensor ks = RepeatKv(k.narrow(0, begin, n).transpose(0, 1), n_rep);
    const at::Tensor vs = RepeatKv(v.narrow(0, begin, n).transpose(0, 1), n_rep);
    const int64_t keys = sliding_window > 0 ? std::min(n, 2 * sliding_window) : n;
    int64_t chunk = std::max<int64_t>(16, kChunkScores / (heads * keys));
    // A sliding chunk's keys span at most its rows plus the window.
    if (sliding_window > 0) chunk = std::min(chunk, sliding_window);
    for (int64_t q0 = 0; q0 < n; q0 += chunk) {
      const int64_t nq = std::min(chunk, n - q0);
      const at::Tensor rows = AttendRows(qs, ks, vs, q0, nq, scaling, sinks, sliding_window);
      out.narrow(0, begin + q0, nq).copy_(rows.transpose(0, 1));
    }
  }
  return out;
}

}  // namespace e3
