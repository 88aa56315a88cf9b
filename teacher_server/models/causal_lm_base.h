// What the architectures in this folder share beneath their layers: the
// config and options they were loaded with, this rank's ShardPlan, the
// vocab tables and the lm_head, and the checks and guards around loading
// and a forward. One level under CausalLM, so that each architecture's
// file (decoder_lm, deepseek_lm, gpt_oss_lm) holds only its own layers and
// their loop.
#ifndef E3_TEACHER_SERVER_MODELS_CAUSAL_LM_BASE_H_
#define E3_TEACHER_SERVER_MODELS_CAUSAL_LM_BASE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "teacher_server/layers/fp8_head_argmax.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/models/forward_graphs.h"
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
  // How the forward runs, in one order for every architecture: projections,
  // element-wise ops, attention, GEMMs, the head, graphs, experts, weight
  // conversion, sharding. Each architecture gives only its own words
  // (ArchitectureTechniques).
  std::string Techniques() const final;

 protected:
  // The words of Techniques() that differ by architecture.
  struct TechniqueWords {
    std::string fused_projections;  // with options_.fuse_projections
    std::string custom_kernels;     // where the fused kernels run
    std::string attention;
    std::string gemms;
    std::string graphs_off_reason;  // why the forward cannot be captured
    std::string experts;            // empty: no MoE layers
    std::string weights;            // a conversion made at load, if any
    bool tp_overlap = false;        // whether sharding overlaps micro-batches
  };
  virtual TechniqueWords ArchitectureTechniques() const = 0;
  // The attention words shared by the architectures whose attention takes
  // options_.attention as it is: `fused` where the fused varlen kernel
  // applies to `head_dim`.
  std::string AttentionTechnique(int64_t head_dim, const std::string& fused) const;
  // "experts by grouped GEMMs" when all `moe` MoE layers group their
  // experts, else how many loop; empty without MoE layers.
  static std::string ExpertsTechnique(int64_t moe, int64_t grouped, const std::string& detail = "");

  CausalLMBase(ModelConfig config, ModelOptions options)
      : config_(std::move(config)), options_(std::move(options)) {}

  // Sets plan_ for this process's rank of options_.tp (without one: the
  // whole model).
  absl::Status MakePlan();
  // The architecture's LoadWeights, after MakePlan; LibTorch's errors come
  // back as a status naming the directory.
  absl::Status LoadCheckpoint(const ModelDir& dir);
  virtual absl::Status LoadWeights(const ModelDir& dir) = 0;
  // head_ over vocab_.lm_head (after vocab_.LoadHead), on this rank's rows;
  // with options_.argmax_fp8, also the FP8 candidate search over them where
  // it applies (fp8_head_).
  void MakeHead(GemmPath gemm, bool fused_argmax);
  // The lm_head's outputs for out->last_hidden: the target argmax and/or
  // the logits, as `options` asks; HeadArgmax's where it answers, else
  // head_'s (from chunked logits).
  void Head(const ForwardOptions& options, ForwardOutput* out);
  // The target argmax of x [T, H] (after the final norm) by the sgl
  // kernels that never write the logits, or undefined where none applies
  // (Head then asks head_, whose chunked logits give the same answer). One
  // process: the FP8 candidate search, else the argmax GEMM
  // (options_.argmax_in_gemm). Under TP: each rank's best column among its
  // vocab rows by the FP8 search, combined by TpGroup::VocabParallelArgmax;
  // a rank without the search leaves it to head_, which issues that same
  // collective, so every rank issues the same collectives however it found
  // its answer.
  at::Tensor HeadArgmax(const at::Tensor& x);
  // Techniques()'s words for how Head finds the target argmax.
  std::string HeadTechnique() const;

  // CUDA graphs (graphs_) where options_.cuda_graphs asks for them and
  // `off_reason` (why this model's forward cannot be captured) is empty.
  void MakeGraphs(const std::string& off_reason);
  // Techniques()'s words for the graphs: on, off and why, or nothing when
  // not asked for.
  std::string GraphsTechnique(const std::string& off_reason) const;
  // run over the batch: through graphs_ where they take it (no KV cache),
  // else eagerly with the batch's own attention layout.
  ForwardOutput RunGraphedOrEager(const PackedBatch& batch, const ForwardOptions& options,
                                  const ForwardGraphs::RunFn& run);

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
  // The FP8 candidate search over vocab_.lm_head (MakeHead, where
  // options_.argmax_fp8 asks and it applies; else null).
  std::unique_ptr<Fp8HeadArgmax> fp8_head_;
  // Captured forwards per token budget (MakeGraphs; else null).
  std::unique_ptr<ForwardGraphs> graphs_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_CAUSAL_LM_BASE_H_
