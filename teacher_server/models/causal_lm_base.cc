#include "teacher_server/models/causal_lm_base.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "teacher_server/layers/fused_ops.h"
#include "teacher_server/layers/kv_cache.h"

namespace e3 {

absl::Status CausalLMBase::MakePlan() {
  const TpGroup* tp = options_.tp.get();
  ParallelLayout layout;
  if (tp != nullptr) {
    E3_ASSIGN_OR_RETURN(layout, ParallelLayout::Make(tp->rank(), tp->size(), tp->size(), tp->ep_size()));
  }
  E3_ASSIGN_OR_RETURN(plan_, ShardPlan::Make(config_, layout));
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
  // Under TP over this rank's vocab rows (a shard the kernels do not take
  // finds its answer from logits instead: HeadArgmax).
  if (options_.argmax_fp8) fp8_head_ = Fp8HeadArgmax::Prepare(vocab_.lm_head);
}

void CausalLMBase::Head(const ForwardOptions& options, ForwardOutput* out) {
  if (options.return_argmax && !options.return_logits) {
    out->target_argmax = HeadArgmax(out->last_hidden);
    if (out->target_argmax.defined()) return;
  }
  head_.Apply(options, out);
}

at::Tensor CausalLMBase::HeadArgmax(const at::Tensor& x) {
  if (!plan_.sharded()) {
    at::Tensor argmax;
    if (fp8_head_) argmax = fp8_head_->Argmax(x);
    if (!argmax.defined() && options_.argmax_in_gemm) argmax = LinearArgmax(x, vocab_.lm_head);
    return argmax;
  }
  if (!fp8_head_) return at::Tensor();
  at::Tensor best;
  const at::Tensor local = fp8_head_->Argmax(x, &best);
  if (!local.defined()) return at::Tensor();
  return options_.tp->VocabParallelArgmax(local, best, plan_.vocab.begin);
}

std::string CausalLMBase::HeadTechnique() const {
  if (fp8_head_) return "target argmax by FP8 candidates";
  if (options_.argmax_in_gemm && !plan_.sharded()) {
    return "target argmax in the lm_head GEMM (Hopper bf16; else from logits)";
  }
  return "target argmax from logits";
}

void CausalLMBase::MakeGraphs(const std::string& off_reason) {
  if (options_.cuda_graphs && off_reason.empty()) {
    graphs_ = std::make_unique<ForwardGraphs>(options_.device, options_.graph_token_step, options_.max_cuda_graphs,
                                              options_.graph_min_host_share);
  }
}

std::string CausalLMBase::GraphsTechnique(const std::string& off_reason) const {
  if (graphs_) return "CUDA graphs per token budget";
  if (options_.cuda_graphs) return absl::StrCat("CUDA graphs off (", off_reason, ")");
  return "";
}

std::string CausalLMBase::Techniques() const {
  const TechniqueWords words = ArchitectureTechniques();
  std::vector<std::string> parts;
  parts.push_back(options_.fuse_projections ? words.fused_projections : "separate projections");
  if (!options_.fused_kernels) {
    parts.push_back("reference element-wise ops");
  } else {
    parts.push_back(FusedKernelsRunOn(options_.device) ? words.custom_kernels
                                                       : "custom kernels off (need CUDA, compute capability 8.0+)");
  }
  parts.push_back(words.attention);
  parts.push_back(words.gemms);
  parts.push_back(HeadTechnique());
  for (const std::string& optional :
       {GraphsTechnique(words.graphs_off_reason), words.experts, words.weights}) {
    if (!optional.empty()) parts.push_back(optional);
  }
  if (plan_.sharded()) {
    parts.push_back(absl::StrCat("tp ", plan_.layout.tp_size(), " (ep ", plan_.layout.ep_size(), ")",
                                 words.tp_overlap ? absl::StrCat(", micro-batch overlap from ",
                                                                 options_.tp_overlap_min_tokens, " tokens a half")
                                                  : ""));
  }
  return absl::StrJoin(parts, "; ");
}

std::string CausalLMBase::AttentionTechnique(int64_t head_dim, const std::string& fused) const {
  switch (options_.attention) {
    case AttentionKernel::kEager:
      return "eager attention per sample";
    case AttentionKernel::kSdpa:
      return "SDPA per sample";
    case AttentionKernel::kFlashVarlen:
      break;
  }
  return FlashVarlenAppliesTo(options_.dtype, head_dim, options_.device)
             ? fused
             : "fused attention off (needs CUDA, bf16/fp16): SDPA per sample";
}

std::string CausalLMBase::ExpertsTechnique(int64_t moe, int64_t grouped, const std::string& detail) {
  if (moe == 0) return "";
  return grouped == moe ? absl::StrCat("experts by grouped GEMMs", detail)
                        : absl::StrCat("experts by a loop", detail, " in ", moe - grouped, " of ", moe, " MoE layers");
}

ForwardOutput CausalLMBase::RunGraphedOrEager(const PackedBatch& batch, const ForwardOptions& options,
                                              const ForwardGraphs::RunFn& run) {
  if (graphs_ && options.kv_cache == nullptr) {
    std::optional<ForwardOutput> out = graphs_->Run(batch, options, run);
    if (out) return std::move(*out);
  }
  return run(batch, MakePackedLayout(batch.cu_seqlens, options_.device, options_.attention), options);
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
