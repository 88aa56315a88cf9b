// What the architectures in this folder share beneath their layers: the
// config and options they were loaded with, this rank's ShardPlan, the
// vocab tables and the lm_head, and the checks and guards around loading
// and a forward. One level under CausalLM, so that each architecture's
// file (decoder_lm, deepseek_lm, gpt_oss_lm) holds only its own layers and
// their loop.
#ifndef E3_TEACHER_SERVER_MODELS_CAUSAL_LM_BASE_H_
#define E3_TEACHER_SERVER_MODELS_CAUSAL_LM_BASE_H_

#include <functional>
#include <utility>

#include "teacher_server/causal_lm.h"
#include "teacher_server/models/lm_head.h"
#include "teacher_server/models/vocab_tables.h"
#include "teacher_server/parallel/shard_plan.h"

namespace e3 {

class KvCache;

class CausalLMBase : public CausalLM {
 public:
  const ModelConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  at::Tensor embed_tokens() const override { return vocab_.full_embed_tokens; }
  at::Tensor lm_head() const override { return vocab_.full_lm_head; }
  const ShardPlan& shard_plan() const { return plan_; }

 protected:
  CausalLMBase(ModelConfig config, ModelOptions options)
      : config_(std::move(config)), options_(std::move(options)) {}

  // Sets plan_ for this process's rank of options_.tp (without one: the
  // whole model).
  absl::Status MakePlan();
  // The architecture's LoadWeights, after MakePlan; LibTorch's errors come
  // back as a status naming the directory.
  absl::Status LoadCheckpoint(const ModelDir& dir);
  virtual absl::Status LoadWeights(const ModelDir& dir) = 0;
  // head_ over vocab_.lm_head (after vocab_.LoadHead), on this rank's rows.
  void MakeHead(GemmPath gemm, bool fused_argmax);

  // The checks every CheckForward starts with: the aux ids name layers of
  // this model, and the batch has tokens.
  absl::Status CheckAuxIdsAndTokens(const PackedBatch& batch, const ForwardOptions& options) const;
  // A generation's cache: one process, the model's layers, mid-append.
  absl::Status CheckCache(const KvCache& cache) const;
  // run() in inference mode (plain no-grad under TP), its LibTorch errors
  // as a status naming the architecture.
  absl::StatusOr<ForwardOutput> Guarded(const std::function<ForwardOutput()>& run) const;

  // The embedding rows of `ids`; under TP each rank looks up its own vocab
  // rows and the group sums them.
  at::Tensor Embed(const at::Tensor& ids) const;
  // A rank's partial sublayer output summed over the group (unsharded: the
  // output itself).
  at::Tensor Reduced(at::Tensor partial) const;

  ModelConfig config_;
  ModelOptions options_;
  ShardPlan plan_;
  VocabTables vocab_;
  LmHead head_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_CAUSAL_LM_BASE_H_
