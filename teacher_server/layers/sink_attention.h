// GPT-OSS's attention core over packed samples: causal attention whose
// softmax denominator also counts a learned per-head "sink" logit, on
// layers that may see only the last `sliding_window` keys.
//
// As transformers 5.17 computes it (modeling_gpt_oss.py
// eager_attention_forward): scores = (q k^T) * scaling, masked; the head's
// sink appended as one more column; the row's maximum subtracted; softmax
// in the scores' dtype; the sink's column dropped; probabilities times v.
// The sink takes probability mass without contributing a value, so a row's
// weights sum to less than one. A sliding layer's query at position i sees
// keys j with i - window < j <= i (masking_utils sliding_window_overlay),
// within its own sample: packed samples never see each other.
#ifndef E3_TEACHER_SERVER_LAYERS_SINK_ATTENTION_H_
#define E3_TEACHER_SERVER_LAYERS_SINK_ATTENTION_H_

#include <cstdint>

#include "common/torch/torch_core.h"
#include "teacher_server/layers/attention.h"

namespace e3 {

// q: [T, heads, D], k/v: [T, kv_heads, D]; sinks: [heads] (undefined: no
// sink, a plain softmax); sliding_window: keys a query sees, itself
// included (0: every earlier key of its sample). Returns [T, heads, D].
// Rows are processed in chunks so that a chunk's scores stay near 256 MiB
// in fp32 whatever the sample length (a softmax is per row, so chunking
// changes no result).
at::Tensor PackedSinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const PackedLayout& layout, double scaling, const at::Tensor& sinks,
                               int64_t sliding_window);

// The same through one varlen flash call over the packed batch (the sgl
// backend; CUDA, bf16/fp16, LibTorch 2.5+: the caller checks
// FlashVarlenAppliesTo and passes layout.cu_seqlens_device): the window
// through the kernel's own window arguments, and the sink afterwards,
// exactly: with lse the log-sum-exp of a row's scaled scores over its
// keys, adding the sink's column to the softmax scales the row's output by
// exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink), in fp32 and
// rounded once. transformers' eager path takes its softmax in the
// activations' dtype; this one keeps fp32 throughout, as flash does.
at::Tensor FlashSinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const PackedLayout& layout, double scaling, const at::Tensor& sinks,
                              int64_t sliding_window);

// The same over a generation's cache (layers/kv_cache.h): stores the new
// tokens' k and v, then each sample's queries, at positions after its
// sequence's cached ones, attend over the cached keys and its own. The
// window counts cached keys as it counts the sample's own.
at::Tensor CachedSinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, KvCacheSlot cache,
                               const PackedLayout& layout, double scaling, const at::Tensor& sinks,
                               int64_t sliding_window);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_SINK_ATTENTION_H_
