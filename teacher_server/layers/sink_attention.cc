#include "teacher_server/layers/sink_attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "common/torch/torch_compat.h"
#include "teacher_server/layers/kv_cache.h"

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

// Query rows q [heads, nq, D] at positions pos0, pos0 + 1, ... of their
// sequence, against its keys and values ks/vs [heads, >= pos0 + nq, D]
// (position j at index j).
at::Tensor AttendRows(const at::Tensor& q, const at::Tensor& ks, const at::Tensor& vs, int64_t pos0,
                      double scaling, const at::Tensor& sinks, int64_t window) {
  const int64_t heads = q.size(0), nq = q.size(1);
  // Keys before k0 are outside every row's window: skipping them drops
  // only columns whose probability would be exactly zero.
  const int64_t k0 = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0, nk = pos0 + nq - k0;
  at::Tensor scores = at::matmul(q, ks.narrow(1, k0, nk).transpose(1, 2)) * scaling;
  scores = scores.masked_fill(HiddenKeys(pos0, nq, k0, nk, window, q.device()),
                              -std::numeric_limits<float>::infinity());
  if (sinks.defined()) {
    scores = torch::cat({scores, sinks.to(scores.scalar_type()).view({heads, 1, 1}).expand({heads, nq, 1})}, -1);
  }
  scores = scores - std::get<0>(scores.max(-1, /*keepdim=*/true));
  at::Tensor probs = at::softmax(scores, -1, scores.scalar_type()).narrow(-1, 0, nk);
  return at::matmul(probs.to(vs.scalar_type()), vs.narrow(1, k0, nk));
}

// One sample: q [n, heads, D] at positions past, past + 1, ...; keys and
// values [past + n, kv_heads, D]. Writes [n, heads, D] into out.
void AttendSample(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t past, double scaling,
                  const at::Tensor& sinks, int64_t window, at::Tensor out) {
  const int64_t heads = q.size(1), n = q.size(0), n_rep = heads / k.size(1);
  const at::Tensor qs = q.transpose(0, 1);
  const at::Tensor ks = RepeatKv(k.transpose(0, 1), n_rep);
  const at::Tensor vs = RepeatKv(v.transpose(0, 1), n_rep);
  const int64_t keys = window > 0 ? std::min(k.size(0), 2 * window) : k.size(0);
  int64_t chunk = std::max<int64_t>(16, kChunkScores / (heads * keys));
  // A sliding chunk's keys span at most its rows plus the window.
  if (window > 0) chunk = std::min(chunk, window);
  for (int64_t q0 = 0; q0 < n; q0 += chunk) {
    const int64_t nq = std::min(chunk, n - q0);
    const at::Tensor rows = AttendRows(qs.narrow(1, q0, nq), ks, vs, past + q0, scaling, sinks, window);
    out.narrow(0, q0, nq).copy_(rows.transpose(0, 1));
  }
}

}  // namespace

at::Tensor PackedSinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const PackedLayout& layout, double scaling, const at::Tensor& sinks,
                               int64_t sliding_window) {
  at::Tensor out = torch::empty_like(q);
  const std::vector<int64_t>& cu = layout.cu_seqlens;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t begin = cu[s], n = cu[s + 1] - begin;
    AttendSample(q.narrow(0, begin, n), k.narrow(0, begin, n), v.narrow(0, begin, n), /*past=*/0, scaling, sinks,
                 sliding_window, out.narrow(0, begin, n));
  }
  return out;
}

at::Tensor FlashSinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const PackedLayout& layout, double scaling, const at::Tensor& sinks,
                              int64_t sliding_window) {
  // The kernel's window counts the keys before the query: window - 1.
  const compat::FlashVarlenResult r = compat::FlashVarlenWindowAttentionWithLse(
      q, k, v, layout.cu_seqlens_device, layout.max_seqlen, scaling, sliding_window > 0 ? sliding_window - 1 : -1);
  if (!sinks.defined()) return r.out;
  TORCH_CHECK(r.lse.dim() == 2 && r.lse.size(0) == q.size(1) && r.lse.size(1) == q.size(0),
              "flash attention returned a log-sum-exp of shape ", r.lse.sizes(), " for queries of shape ", q.sizes());
  // [heads, T] -> [T, heads, 1]
  const at::Tensor share = at::sigmoid(r.lse - sinks.to(at::kFloat).unsqueeze(1)).t().unsqueeze(-1);
  return (r.out.to(at::kFloat) * share).to(q.scalar_type());
}

at::Tensor CachedSinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, KvCacheSlot cache,
                               const PackedLayout& layout, double scaling, const at::Tensor& sinks,
                               int64_t sliding_window) {
  KvCache& kv = *cache.cache;
  kv.Store(cache.layer, k, v);
  at::Tensor out = torch::empty_like(q);
  const std::vector<int64_t>& cu = layout.cu_seqlens;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t begin = cu[s], n = cu[s + 1] - begin;
    auto [keys, values] = kv.SampleKeysValues(cache.layer, s);
    AttendSample(q.narrow(0, begin, n), keys, values, kv.Past(s), scaling, sinks, sliding_window,
                 out.narrow(0, begin, n));
  }
  return out;
}

}  // namespace e3
