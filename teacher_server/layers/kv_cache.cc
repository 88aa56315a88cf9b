#include "teacher_server/layers/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/torch/torch_compat.h"

namespace e3 {
namespace {

// kv head j serves query heads [j * n_rep, (j + 1) * n_rep), as transformers' repeat_kv.
at::Tensor RepeatKvHeads(const at::Tensor& x, int64_t n_rep) {  // [kv_heads, n, D]
  return n_rep == 1 ? x : x.repeat_interleave(n_rep, /*dim=*/0);
}

}  // namespace

KvCache::KvCache(int64_t layers, int64_t sequences, int64_t capacity, int64_t kv_heads, int64_t head_dim,
                 const at::TensorOptions& options)
    : capacity_(capacity), lengths_(static_cast<size_t>(sequences), 0) {
  for (int64_t l = 0; l < layers; ++l) {
    keys_.push_back(at::zeros({sequences, capacity, kv_heads, head_dim}, options));
    values_.push_back(at::zeros({sequences, capacity, kv_heads, head_dim}, options));
  }
}

absl::Status KvCache::BeginAppend(const std::vector<int64_t>& sequence_ids, const std::vector<int64_t>& cu_seqlens) {
  if (cu_seqlens.size() != sequence_ids.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: ", sequence_ids.size(), " sequences but ",
                                                   cu_seqlens.size() - 1, " samples in the batch"));
  }
  std::set<int64_t> seen;
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(cu_seqlens.back()));
  for (size_t s = 0; s < sequence_ids.size(); ++s) {
    const int64_t b = sequence_ids[s], n = cu_seqlens[s + 1] - cu_seqlens[s];
    if (b < 0 || b >= sequences() || !seen.insert(b).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV cache: sequence id ", b, " is out of [0, ", sequences(), ") or repeated"));
    }
    if (lengths_[b] + n > capacity_) {
      return absl::OutOfRangeError(absl::StrCat("KV cache: sequence ", b, " would hold ", lengths_[b] + n,
                                                " tokens; its capacity is ", capacity_));
    }
    for (int64_t i = 0; i < n; ++i) rows.push_back(b * capacity_ + lengths_[b] + i);
  }
  const at::Device device = keys_.empty() ? at::Device(at::kCPU) : keys_[0].device();
  rows_ = torch::tensor(rows, torch::kLong).to(device);
  sequence_index_ = torch::tensor(sequence_ids, torch::kLong).to(device);
  sequence_ids_ = sequence_ids;
  cu_seqlens_ = cu_seqlens;
  appending_ = true;
  return absl::OkStatus();
}

void KvCache::CommitAppend() {
  for (size_t s = 0; s < sequence_ids_.size(); ++s) lengths_[sequence_ids_[s]] += cu_seqlens_[s + 1] - cu_seqlens_[s];
  appending_ = false;
}

void KvCache::Store(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(appending_, "KvCache: storing keys outside BeginAppend/CommitAppend");
  const int64_t kvh = k.size(1), d = k.size(2);
  keys_[layer].view({sequences() * capacity_, kvh, d}).index_copy_(0, rows_, k);
  values_[layer].view({sequences() * capacity_, kvh, d}).index_copy_(0, rows_, v);
}

std::pair<at::Tensor, at::Tensor> KvCache::SampleKeysValues(int64_t layer, size_t s) const {
  const int64_t b = sequence_ids_[s], total = lengths_[b] + cu_seqlens_[s + 1] - cu_seqlens_[s];
  return {keys_[layer][b].narrow(0, 0, total), values_[layer][b].narrow(0, 0, total)};
}

at::Tensor KvCache::Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scaling, const PackedLayout& layout, AttentionKernel kernel) {
  Store(layer, k, v);
  bool empty = true, one_token_each = true;
  for (size_t s = 0; s < sequence_ids_.size(); ++s) {
    empty = empty && lengths_[sequence_ids_[s]] == 0;
    one_token_each = one_token_each && cu_seqlens_[s + 1] - cu_seqlens_[s] == 1;
  }
  if (empty) return PackedCausalAttention(q, k, v, layout, scaling, kernel);
  if (one_token_each) return AttendDecode(layer, q, scaling);
  return AttendPerSample(layer, q, scaling);
}

at::Tensor KvCache::AttendDecode(int64_t layer, const at::Tensor& q, double scaling) const {
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kvh = keys_[layer].size(2), group = heads / kvh;
  int64_t keys = 0;
  for (int64_t b : sequence_ids_) keys = std::max(keys, lengths_[b] + 1);
  at::Tensor k = keys_[layer], v = values_[layer];
  if (n != sequences()) {
    k = k.index_select(0, sequence_index_);
    v = v.index_select(0, sequence_index_);
  }
  // [n, keys, kvh, D] -> [n, kvh, keys, D]; q [n, heads, D] -> [n, kvh, group, D].
  k = k.narrow(1, 0, keys).permute({0, 2, 1, 3});
  v = v.narrow(1, 0, keys).permute({0, 2, 1, 3});
  std::vector<float> mask(static_cast<size_t>(n * keys), 0.0f);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t j = lengths_[sequence_ids_[s]] + 1; j < keys; ++j) {
      mask[s * keys + j] = -std::numeric_limits<float>::infinity();
    }
  }
  const at::Tensor additive =
      torch::tensor(mask).view({n, 1, 1, keys}).to(q.device(), q.scalar_type());
  at::Tensor o =
      compat::ScaledDotProductAttention(q.reshape({n, kvh, group, d}), k, v, additive, /*is_causal=*/false, scaling);
  return o.reshape({n, heads, d});
}

at::Tensor KvCache::AttendPerSample(int64_t layer, const at::Tensor& q, double scaling) const {
  const int64_t heads = q.size(1), kvh = keys_[layer].size(2);
  at::Tensor out = at::empty_like(q);
  for (size_t s = 0; s < sequence_ids_.size(); ++s) {
    const int64_t b = sequence_ids_[s], begin = cu_seqlens_[s], n = cu_seqlens_[s + 1] - begin;
    const int64_t past = lengths_[b], total = past + n;
    const at::Tensor k = RepeatKvHeads(keys_[layer][b].narrow(0, 0, total).transpose(0, 1), heads / kvh);
    const at::Tensor v = RepeatKvHeads(values_[layer][b].narrow(0, 0, total).transpose(0, 1), heads / kvh);
    // New token i sees the past and new tokens 0..i: -inf above that diagonal.
    const at::Tensor mask =
        at::full({n, total}, -std::numeric_limits<double>::infinity(), q.options()).triu(past + 1);
    const at::Tensor qs = q.narrow(0, begin, n).transpose(0, 1);  // [heads, n, D]
    at::Tensor o = compat::ScaledDotProductAttention(qs.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                                     mask.view({1, 1, n, total}), /*is_causal=*/false, scaling);
    out.narrow(0, begin, n).copy_(o.squeeze(0).transpose(0, 1));
  }
  return out;
}

}  // namespace e3
