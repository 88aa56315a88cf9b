#include "teacher_server/models/causal_lm_base.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "teacher_server/layers/kv_cache.h"

namespace e3 {

absl::Status CausalLMBase::MakePlan() {
  const TpGroup* tp = options_.tp.get();
  E3_ASSIGN_OR_RETURN(plan_, ShardPlan::Make(config_, tp ? tp->rank() : 0, tp ? tp->size() : 1,
                                             tp ? tp->ep_size() : 1));
  return absl::OkStatus();
}

absl::Status CausalLMBase::LoadCheckpoint(const ModelDir& dir) {
  try {
    return LoadWeights(dir);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(dir.path(), ": loading weights failed: ", e.what_without_backtrace()));
  }
}

void CausalLMBase::MakeHead(GemmPath gemm, bool fused_argmax) {
  head_ = LmHead(vocab_.lm_head, LmHeadOptions{config_.vocab_size, plan_.vocab.begin, gemm, fused_argmax,
                                               plan_.sharded() ? options_.tp : nullptr});
}

absl::Status CausalLMBase::CheckAuxIdsAndTokens(const PackedBatch& batch, const ForwardOptions& options) const {
  for (int32_t id : options.aux_layer_ids) {
    if (id < 0 || id >= config_.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("aux layer id ", id, " is outside [0, ",
                                                     config_.num_hidden_layers, ") for ", config_.source));
    }
  }
  if (batch.num_tokens() == 0) return absl::InvalidArgumentError("empty batch");
  return absl::OkStatus();
}

absl::Status CausalLMBase::CheckCache(const KvCache& cache) const {
  if (plan_.sharded()) {
    return absl::UnimplementedError("generation with a KV cache runs in one process; this teacher is sharded "
                                    "(--tp_size > 1)");
  }
  if (!cache.appending() || cache.layers() != config_.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("the KV cache holds ", cache.layers(),
                                                   " layers and must be between BeginAppend and CommitAppend; ",
                                                   config_.source, " has ", config_.num_hidden_layers));
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> CausalLMBase::Guarded(const std::function<ForwardOutput()>& run) const {
  try {
    // Gloo runs collectives on its own threads, outside this thread's
    // InferenceMode, and may not write inference tensors there: a sharded
    // forward uses plain no-grad mode instead.
    c10::InferenceMode inference(!plan_.sharded());
    torch::NoGradGuard no_grad;
    return run();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(config_.architecture_name, " forward failed: ",
                                            e.what_without_backtrace()));
  }
}

at::Tensor CausalLMBase::Embed(const at::Tensor& ids) const {
  if (!plan_.sharded()) return at::embedding(vocab_.embed_tokens, ids);
  return options_.tp->VocabParallelEmbedding(ids, vocab_.embed_tokens, plan_.vocab.begin);
}

at::Tensor CausalLMBase::Reduced(at::Tensor partial) const {
  if (plan_.sharded()) {
    // The collective writes the sum in place, over contiguous memory.
    partial = partial.contiguous();
    options_.tp->AllReduceSum(partial);
  }
  return partial;
}

}  // namespace e3
