// The keys and values a teacher keeps while it generates: for each decoder
// layer, [sequences, capacity, kv_heads, head_dim], and each sequence's
// cached length on the host. A forward with a cache (ForwardOptions::
// kv_cache) appends its tokens to the sequences it names and attends over
// what they cached before plus its own tokens, so greedy decoding costs one
// token's forward per step instead of the whole prefix's.
//
// Rope positions are the caller's: a token appended to a sequence of length
// n sits at position n (PackedBatch::position_ids).
#ifndef E3_TEACHER_SERVER_LAYERS_KV_CACHE_H_
#define E3_TEACHER_SERVER_LAYERS_KV_CACHE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/torch/torch_core.h"
#include "teacher_server/layers/attention.h"

namespace e3 {

class KvCache {
 public:
  KvCache(int64_t layers, int64_t sequences, int64_t capacity, int64_t kv_heads, int64_t head_dim,
          const at::TensorOptions& options);

  int64_t layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t capacity() const { return capacity_; }
  const std::vector<int64_t>& lengths() const { return lengths_; }

  // Before a forward whose samples (offsets cu_seqlens) extend the cached
  // sequences `sequence_ids`, one sample each, in order: checks that they
  // are distinct, in range and fit, and plans where their rows go.
  absl::Status BeginAppend(const std::vector<int64_t>& sequence_ids, const std::vector<int64_t>& cu_seqlens);
  bool appending() const { return appending_; }
  // After the forward: the appended tokens count as cached.
  void CommitAppend();

  // In layer `layer`'s attention: stores the new tokens' roped k and v
  // [T, kv_heads, D] and returns the attention of q [T, heads, D] over each
  // sequence's cached keys and its own (causally). A forward from empty
  // sequences runs PackedCausalAttention as an uncached forward would.
  at::Tensor Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scaling,
                    const PackedLayout& layout, AttentionKernel kernel);

  // For attention cores of their own (sinks and sliding windows,
  // sink_attention.h): Store keeps the new tokens' roped k and v as Attend
  // does; then, for sample s of the forward being appended, Past is its
  // sequence's cached length before this forward and SampleKeysValues its
  // keys and values so far, [Past(s) + its tokens, kv_heads, D].
  void Store(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  int64_t Past(size_t s) const { return lengths_[sequence_ids_[s]]; }
  std::pair<at::Tensor, at::Tensor> SampleKeysValues(int64_t layer, size_t s) const;

 private:
  // One token per sequence: [n, heads, D] against each sequence's cache,
  // GQA without repeating k/v (query heads grouped under their kv head).
  at::Tensor AttendDecode(int64_t layer, const at::Tensor& q, double scaling) const;
  // Any other mix: each sample against its sequence's cache, causal within
  // its own tokens.
  at::Tensor AttendPerSample(int64_t layer, const at::Tensor& q, double scaling) const;

  int64_t capacity_;
  std::vector<at::Tensor> keys_, values_;
  std::vector<int64_t> lengths_;
  // The forward being appended.
  bool appending_ = false;
  std::vector<int64_t> sequence_ids_, cu_seqlens_;
  at::Tensor rows_;           // [T] int64: flat cache row of each new token
  at::Tensor sequence_index_;  // [n] int64: sequence_ids_ on the device
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_KV_CACHE_H_
