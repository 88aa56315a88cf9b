#include "teacher_server/models/vocab_tables.h"

#include "common/base/status_macros.h"
#include "teacher_server/models/weight_loader.h"

namespace e3 {
namespace {

constexpr char kEmbedName[] = "model.embed_tokens.weight";
// Read only when the head is not tied to the embedding.
constexpr char kHeadName[] = "lm_head.weight";

}  // namespace

absl::Status VocabTables::LoadEmbedding(WeightLoader& w, const ModelConfig& c, const ShardPlan& plan) {
  E3_ASSIGN_OR_RETURN(embed_tokens,
                      w.LoadSlice(kEmbedName, {c.vocab_size, c.hidden_size}, 0, plan.vocab.begin, plan.vocab.size));
  return absl::OkStatus();
}

absl::Status VocabTables::LoadHead(WeightLoader& w, const ModelConfig& c, const ShardPlan& plan) {
  if (c.tie_word_embeddings) {
    lm_head = embed_tokens;
    return absl::OkStatus();
  }
  E3_ASSIGN_OR_RETURN(lm_head,
                      w.LoadSlice(kHeadName, {c.vocab_size, c.hidden_size}, 0, plan.vocab.begin, plan.vocab.size));
  return absl::OkStatus();
}

absl::Status VocabTables::LoadWhole(const ModelDir& dir, const ModelConfig& c, const ShardPlan& plan,
                                    at::ScalarType dtype) {
  if (!plan.sharded()) {
    full_embed_tokens = embed_tokens;
    full_lm_head = lm_head;
    return absl::OkStatus();
  }
  if (!plan.layout.is_first()) return absl::OkStatus();
  WeightLoader host(dir, dtype, at::kCPU);
  E3_ASSIGN_OR_RETURN(full_embed_tokens, host.Load(kEmbedName, {c.vocab_size, c.hidden_size}));
  full_lm_head = full_embed_tokens;
  if (!c.tie_word_embeddings) {
    E3_ASSIGN_OR_RETURN(full_lm_head, host.Load(kHeadName, {c.vocab_size, c.hidden_size}));
  }
  return absl::OkStatus();
}

}  // namespace e3
