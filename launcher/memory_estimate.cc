#include "launcher/memory_estimate.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace e3 {
namespace {

// Bytes per element of a compute dtype name; empty: bfloat16 on a GPU,
// float32 on the CPU (the services' default).
double DtypeBytes(const std::string& dtype, bool gpu) {
  if (dtype.empty()) return gpu ? 2 : 4;
  return dtype == "float32" || dtype == "fp32" || dtype == "float" ? 4 : 2;
}

double AttentionParameters(const ModelConfig& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double q = static_cast<double>(m.num_attention_heads * m.head_dim);
  const double kv = static_cast<double>(m.num_key_value_heads * m.head_dim);
  return h * q + 2 * h * kv + q * h;
}

double MlpParameters(const ModelConfig& m, int64_t layer) {
  const double h = static_cast<double>(m.hidden_size);
  if (m.moe.num_experts > 0 && m.IsMoeLayer(layer)) {
    const double experts = static_cast<double>(m.moe.num_experts);
    return experts * 3 * h * static_cast<double>(m.moe.intermediate_size) + h * experts;
  }
  return 3 * h * static_cast<double>(m.intermediate_size);
}

}  // namespace

double TargetParameters(const ModelConfig& m) {
  const double embed = static_cast<double>(m.vocab_size * m.hidden_size);
  double total = embed * (m.tie_word_embeddings ? 1 : 2);
  for (int64_t i = 0; i < m.num_hidden_layers; ++i)
    total += AttentionParameters(m) + MlpParameters(m, i);
  return total;
}

namespace {

bool IsDFlash(const RunConfig& run) { return run.draft.algorithm == "dflash"; }

// The target layers whose states the draft's fc reads.
double CapturedLayers(const RunConfig& run) {
  if (!run.draft.aux_layer_ids.empty()) return static_cast<double>(run.draft.aux_layer_ids.size());
  return IsDFlash(run) ? static_cast<double>(run.draft.dflash_layers) : 3.0;
}

double DraftIntermediate(const ModelConfig& m, const RunConfig& run) {
  return static_cast<double>(run.draft.intermediate_size > 0 ? run.draft.intermediate_size : m.intermediate_size);
}

// DFlash: fc over the captured layers and its norm, then Qwen3 layers
// (q/k norms per head) and the final norm; no embedding or head of its own.
double DFlashParameters(const ModelConfig& m, const RunConfig& run) {
  const double h = static_cast<double>(m.hidden_size), d = static_cast<double>(m.head_dim);
  const double q = static_cast<double>(m.num_attention_heads) * d, kv = static_cast<double>(m.num_key_value_heads) * d;
  const double layer = 2 * h * q + 2 * h * kv + 3 * h * DraftIntermediate(m, run) + 2 * h + 2 * d;
  return CapturedLayers(run) * h * h + h + static_cast<double>(run.draft.dflash_layers) * layer + h;
}

// DFlash's activations: every layer's saved tensors over the block rows,
// the context's keys and values per layer, the chunked attention's scores
// (ops/dflash_block_attention.h: 2^27 fp32 scores, four such tensors in
// the backward) and the head's row chunk of fp32 logits and gradient.
double DFlashActivations(const ModelConfig& m, const RunConfig& run, double bytes) {
  const double h = static_cast<double>(m.hidden_size), tokens = static_cast<double>(run.schedule.tokens_per_batch);
  const double kv = static_cast<double>(m.num_key_value_heads * m.head_dim);
  const double rows = std::min<double>(static_cast<double>(run.draft.dflash_num_anchors), tokens) *
                      static_cast<double>(run.draft.dflash_block_size);
  const double layers = static_cast<double>(run.draft.dflash_layers);
  return layers * rows * (12 * h + 3 * DraftIntermediate(m, run)) * bytes + layers * tokens * 4 * kv * bytes +
         tokens * (CapturedLayers(run) + 1) * h * bytes + 4.0 * (int64_t{1} << 27) * 4 +
         2.0 * 2048 * static_cast<double>(m.vocab_size) * 4;
}

}  // namespace

double DraftParameters(const ModelConfig& m, const RunConfig& run) {
  if (IsDFlash(run)) return DFlashParameters(m, run);
  const double h = static_cast<double>(m.hidden_size);
  const double inter = DraftIntermediate(m, run);
  const double q = static_cast<double>(m.num_attention_heads * m.head_dim);
  const double kv = static_cast<double>(m.num_key_value_heads * m.head_dim);
  const double draft_vocab = static_cast<double>(std::min(run.draft.vocab_size, m.vocab_size));
  // fc (3H -> H); the layer's q/k/v read 2H; o; the MLP; the draft head;
  // EAGLE-3.1's norm of each captured layer before fc.
  const double fc_norms = run.draft.algorithm == "eagle3.1" ? CapturedLayers(run) * h : 0.0;
  return CapturedLayers(run) * h * h + 2 * h * (q + 2 * kv) + q * h + 3 * h * inter + draft_vocab * h + fc_norms;
}

MemoryEstimate TeacherRankMemory(const ModelConfig& m, const RunConfig& run, bool gpu,
                                 int students) {
  const double bytes = DtypeBytes(run.teachers.dtype, gpu);
  const double tp = static_cast<double>(run.teachers.tp);
  const double h = static_cast<double>(m.hidden_size);
  const double tokens = static_cast<double>(run.schedule.tokens_per_batch);
  const double inter = static_cast<double>(
      m.moe.num_experts > 0 ? m.moe.intermediate_size * m.moe.top_k : m.intermediate_size);
  MemoryEstimate e;
  // Heads, MLP columns, experts and vocabulary rows are split over the
  // ranks (KV heads are replicated below one per rank: a small excess).
  e.weights = TargetParameters(m) * bytes / tp;
  // The residual stream, q/k/v, the MLP's gate/up (their share of a
  // rank), and the lm_head's argmax over chunks of 1024 rows (fp32).
  e.activations = tokens * (6 * h + 3 * inter / tp) * bytes +
                  1024.0 * static_cast<double>(m.vocab_size) / tp * 4;
  // Rank 0 holds each subscriber's payloads in flight: the aux and last
  // hidden states (4H per token) of credit_window batches.
  const double credit = static_cast<double>(run.schedule.credit_window);
  e.buffers = students * credit * tokens * 4 * h * bytes;
  return e;
}

MemoryEstimate StudentRankMemory(const ModelConfig& m, const RunConfig& run, bool gpu) {
  const double bytes = DtypeBytes(run.draft.dtype, gpu);
  const double h = static_cast<double>(m.hidden_size);
  const double tokens = static_cast<double>(run.schedule.tokens_per_batch);
  const double draft_vocab = static_cast<double>(std::min(run.draft.vocab_size, m.vocab_size));
  const double length = static_cast<double>(run.draft.ttt_length);
  const double params = DraftParameters(m, run);
  const double embedding = static_cast<double>(m.vocab_size) * h * DtypeBytes(run.teachers.dtype, gpu);
  MemoryEstimate e;
  // The trainable draft, the frozen embeddings (the teacher's dtype) and
  // the target head: its draft rows in fp32 (EAGLE), or all of it in the
  // compute dtype (DFlash).
  e.weights = params * bytes + embedding +
              (IsDFlash(run) ? static_cast<double>(m.vocab_size) * h * bytes : draft_vocab * h * 4);
  // Gradients in the compute dtype; below fp32, fp32 masters; AdamW's two
  // fp32 moments.
  e.optimizer = params * (bytes + (bytes < 4 ? 4 : 0) + 8);
  // EAGLE: per TTT step the layer's saved tensors (about 12H per token),
  // and the draft logits of every step in one pass with their gradient
  // written over them.
  e.activations = IsDFlash(run) ? DFlashActivations(m, run, bytes)
                                : tokens * length * (12 * h * bytes + draft_vocab * bytes);
  // Prefetched batches: the captured layers' and the last hidden states,
  // ids and masks.
  e.buffers = static_cast<double>(run.schedule.credit_window) * tokens * ((CapturedLayers(run) + 1) * h * bytes + 16);
  return e;
}

std::string FormatBytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.1f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.0f MB", bytes / 1e6);
  return absl::StrFormat("%.0f KB", bytes / 1e3);
}

}  // namespace e3
