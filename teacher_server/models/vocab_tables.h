// The vocabulary-sized tables every architecture loads alike: the input
// embedding and the lm_head (the embedding itself when
// tie_word_embeddings), as this rank's rows for the forward
// (ShardPlan::vocab) and whole for GetWeights (DESIGN.md, "Data flow",
// step 5: the student gets them from the teacher, never from the files).
#ifndef E3_TEACHER_SERVER_MODELS_VOCAB_TABLES_H_
#define E3_TEACHER_SERVER_MODELS_VOCAB_TABLES_H_

#include "absl/status/status.h"
#include "common/model/model_config.h"
#include "common/model/model_dir.h"
#include "common/torch/torch_core.h"
#include "teacher_server/parallel/shard_plan.h"

namespace e3 {

class WeightLoader;

struct VocabTables {
  at::Tensor embed_tokens;  // this rank's vocab rows
  at::Tensor lm_head;       // this rank's vocab rows (embed_tokens when tied)
  // The whole tables, for GetWeights: the local ones when unsharded; on a
  // sharded rank 0 a host copy; undefined on other sharded ranks.
  at::Tensor full_embed_tokens, full_lm_head;

  // The three steps are apart so that each model keeps its checkpoint's
  // load order (which tensor a broken checkpoint is reported missing first).
  // This rank's rows of model.embed_tokens.weight, through `w`.
  absl::Status LoadEmbedding(WeightLoader& w, const ModelConfig& c, const ShardPlan& plan);
  // This rank's rows of lm_head.weight, or the embedding's when tied; after
  // LoadEmbedding.
  absl::Status LoadHead(WeightLoader& w, const ModelConfig& c, const ShardPlan& plan);
  // The whole tables in `dtype`; after LoadHead. A sharded rank 0 reads
  // them again onto the host, since it serves GetWeights.
  absl::Status LoadWhole(const ModelDir& dir, const ModelConfig& c, const ShardPlan& plan, at::ScalarType dtype);
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_VOCAB_TABLES_H_
