// What goes into and comes out of a teacher forward pass. Batches are
// packed: samples are concatenated with no padding and delimited by
// cu_seqlens, as DESIGN.md's payload is.
#ifndef E3_TEACHER_SERVER_MODELS_FORWARD_TYPES_H_
#define E3_TEACHER_SERVER_MODELS_FORWARD_TYPES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"

namespace e3 {

class KvCache;  // layers/kv_cache.h

struct PackedBatch {
  at::Tensor input_ids;              // [T] int64, on the model's device
  std::vector<int64_t> cu_seqlens;   // B + 1 offsets, cu_seqlens[0] = 0, back() = T
  at::Tensor position_ids;           // [T] int64, restarting at 0 in each sample

  int64_t num_tokens() const { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  int64_t num_samples() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
};

// Builds a PackedBatch from per-sample token lists; validates that every id
// is in [0, vocab_size) and no sample is empty.
absl::StatusOr<PackedBatch> PackSamples(const std::vector<std::vector<int32_t>>& samples,
                                        int64_t vocab_size, const at::Device& device);
// From already-packed ids and offsets (checked the same way).
absl::StatusOr<PackedBatch> MakePackedBatch(at::Tensor input_ids, std::vector<int64_t> cu_seqlens,
                                            int64_t vocab_size, const at::Device& device);

struct ForwardOptions {
  // Decoder layers whose outputs are captured: layer i's output, HF's
  // hidden_states[i + 1] (for the last layer, before the final norm; HF's
  // hidden_states[L] is after it, and last_hidden holds that).
  std::vector<int32_t> aux_layer_ids;
  bool return_logits = false;  // full [T, V] logits; costly for big vocabs
  bool return_argmax = true;   // target_argmax [T], computed chunk-wise
  // Under TP: the sample index at which the batch splits into two
  // overlapped micro-batches (0: not split; parallel/micro_batches.h). The
  // TP leader decides it from its own options and sends it to every rank,
  // so that all ranks issue the same collectives whatever flags each was
  // started with. -1: the model decides from its own options.
  int64_t micro_batch_split = -1;
  // Generation (teacher_server/runtime/generation.h): the batch's samples extend
  // the cache's sequences named in its BeginAppend, and attend over what
  // those cached. One process only (no tensor parallelism).
  KvCache* kv_cache = nullptr;
};

struct ForwardOutput {
  at::Tensor aux_hidden;     // [T, k * H], aux layers concatenated in id order
  at::Tensor last_hidden;    // [T, H], after the final norm
  at::Tensor logits;         // [T, V] when asked for
  at::Tensor target_argmax;  // [T] int32 when asked for
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_FORWARD_TYPES_H_
