#include "student_trainer/algorithm/dflash_algorithm.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "student_trainer/draft/dflash_export.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {
namespace {

// The target's full lm_head [V, H] from the rows the teacher sends: the
// draft vocab's (draft id order) and the rest (target id order).
absl::StatusOr<at::Tensor> FullTargetHead(const FrozenWeights& frozen) {
  const VocabMap& vocab = frozen.vocab;
  const int64_t V = vocab.target_vocab_size;
  // A draft vocab of every id lists them in ascending order: target order.
  if (frozen.target_head.size(0) == V) return frozen.target_head;
  if (!frozen.target_head_rest.defined() || frozen.target_head.size(0) + frozen.target_head_rest.size(0) != V) {
    return absl::FailedPreconditionError(
        absl::StrCat("DFlash needs the target's whole lm_head: the teacher sent ", frozen.target_head.size(0),
                     " draft-vocab rows and no complete rest of the ", V));
  }
  std::vector<int64_t> rest;
  for (int64_t id = 0; id < V; ++id) {
    if (!vocab.InDraft(id)) rest.push_back(id);
  }
  at::Tensor full = torch::empty({V, frozen.target_head.size(1)}, frozen.target_head.options());
  full.index_copy_(0, torch::tensor(vocab.TargetIds()), frozen.target_head);
  full.index_copy_(0, torch::tensor(rest), frozen.target_head_rest.to(frozen.target_head.scalar_type()));
  return full;
}

absl::StatusOr<DFlashLabels> ParseLabels(const std::string& name) {
  if (name == "target_argmax") return DFlashLabels::kTargetArgmax;
  if (name == "input_ids") return DFlashLabels::kInputIds;
  if (name == "target_distribution") return DFlashLabels::kTargetDistribution;
  return absl::InvalidArgumentError(
      absl::StrCat("--dflash_labels=", name, ": expected target_argmax, input_ids or target_distribution"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DFlashAlgorithm>> DFlashAlgorithm::Create(const DraftSettings& draft,
                                                                         const ScheduleSettings& schedule,
                                                                         const at::Device& device) {
  std::unique_ptr<DFlashAlgorithm> a(new DFlashAlgorithm(draft, schedule, device));
  a->dtype_name_ = ComputeDtypeName(draft, device);
  E3_ASSIGN_OR_RETURN(a->dtype_, ParseComputeScalarType(a->dtype_name_));
  a->blocks_.block_size = draft.dflash_block_size;
  a->blocks_.num_anchors = draft.dflash_num_anchors;
  E3_ASSIGN_OR_RETURN(a->blocks_.labels, ParseLabels(draft.dflash_labels));
  E3_ASSIGN_OR_RETURN(const TttKernels kernels, ParseTttKernels(draft.kernels));
  a->kernels_ = kernels == TttKernels::kFast ? DFlashKernels::kFast : DFlashKernels::kReference;
  a->loss_.block_size = draft.dflash_block_size;
  a->loss_.weighting = draft.dflash_loss == "dpace" ? ops::DFlashWeighting::kDPace : ops::DFlashWeighting::kDecay;
  a->loss_.gamma = draft.dflash_loss_gamma;
  a->loss_.alpha = draft.dflash_dpace_alpha;
  return a;
}

absl::StatusOr<TeacherNeeds> DFlashAlgorithm::needs(const ModelConfig& target) const {
  TeacherNeeds needs;
  // The context reads the layers; the labels decide the rest: the
  // target's greedy tokens, or its distribution (from last_hidden through
  // the full head), or the data's own tokens.
  E3_ASSIGN_OR_RETURN(needs.features.aux_layer_ids, DraftReadsLayers(settings_, target));
  needs.features.target_argmax = blocks_.labels != DFlashLabels::kInputIds;
  needs.features.last_hidden = blocks_.labels == DFlashLabels::kTargetDistribution;
  // The draft's head is the target's whole lm_head.
  needs.target_head_rest = true;
  return needs;
}

absl::Status DFlashAlgorithm::Build(const TeacherInfo& info, const FrozenWeights& frozen, ProcessGroup* group) {
  const ModelConfig& t = info.config;
  DFlashDraftConfig& c = config_;
  c.hidden_size = t.hidden_size;
  c.intermediate_size = settings_.intermediate_size > 0 ? settings_.intermediate_size : t.intermediate_size;
  c.num_layers = settings_.dflash_layers;
  c.num_heads = t.num_attention_heads;
  c.num_kv_heads = t.num_key_value_heads;
  c.head_dim = t.head_dim;
  c.rms_norm_eps = t.rms_norm_eps;
  c.rope = t.rope;
  c.vocab_size = t.vocab_size;
  c.block_size = settings_.dflash_block_size;
  // The embedding's last row is an unused padding slot in the padded
  // vocabularies of most targets; a tokenizer's own mask token is better.
  c.mask_token_id = settings_.dflash_mask_token_id >= 0 ? settings_.dflash_mask_token_id : t.vocab_size - 1;
  c.target_layer_ids = info.aux_layer_ids;
  c.num_target_layers = t.num_hidden_layers;
  c.max_position_embeddings = t.max_position_embeddings;
  c.target = info.target;
  if (!settings_.init_from.empty()) {
    // A warm start keeps its draft's own shape where the settings leave it.
    E3_ASSIGN_OR_RETURN(const DFlashDraftConfig from, ReadDFlashConfig(JoinPath(settings_.init_from, kDraftConfigFile)));
    if (settings_.intermediate_size == 0) c.intermediate_size = from.intermediate_size;
  }
  blocks_.mask_token_id = c.mask_token_id;
  E3_ASSIGN_OR_RETURN(const at::Tensor head, FullTargetHead(frozen));
  frozen_ = {frozen.embed_tokens.to(device_, dtype_), head.to(device_, dtype_)};
  const auto options = torch::TensorOptions().device(device_).dtype(dtype_);
  E3_ASSIGN_OR_RETURN(draft_, CreateDFlashDraft(c, options, settings_.init_seed, frozen_));
  draft_->set_kernels(kernels_);
  if (dtype_ != at::kFloat) {
    E3_ASSIGN_OR_RETURN(master_, CreateDFlashDraft(c, options.dtype(at::kFloat), settings_.init_seed));
  }
  E3_ASSIGN_OR_RETURN(optimizer_, CreateScheduledOptimizer(settings_, schedule_, *draft_,
                                                           master_.has_value() ? &**master_ : nullptr, group));
  return absl::OkStatus();
}

std::string DFlashAlgorithm::Describe() const {
  return absl::StrCat("DFlash draft on ", device_.str(), ", compute ", dtype_name_,
                      master_.has_value() ? " with fp32 master weights" : "", ", ", config_.num_layers,
                      " layers, blocks of ", config_.block_size, " from target layers [",
                      absl::StrJoin(config_.target_layer_ids, ", "), "], mask token ", config_.mask_token_id);
}

absl::StatusOr<at::Tensor> DFlashAlgorithm::BlockLoss(const TeacherBatch& batch, int64_t step, DraftStepOutput* out) {
  // The anchors of each step differ, and every rank draws its own.
  E3_ASSIGN_OR_RETURN(const DFlashBlockBatch planned,
                      PlanDFlashBlocks(batch, blocks_, settings_.init_seed * 1000003u + static_cast<uint64_t>(step)));
  if (planned.blocks.anchor_rows.empty()) return at::Tensor();
  const int64_t B = config_.block_size;
  const at::Tensor context = draft_->ProjectContext(batch.aux_hidden.to(device_, dtype_));
  const at::Tensor embeds = frozen_.embed_tokens.index_select(0, planned.block_tokens.to(device_));
  const at::Tensor hidden = draft_->Forward(embeds, context, planned.blocks);
  const at::Tensor labels = planned.labels.to(device_);
  at::Tensor target_hidden;  // distillation: the last hidden state of the row predicting each row's token
  if (blocks_.labels == DFlashLabels::kTargetDistribution) {
    target_hidden = batch.last_hidden.index_select(0, planned.source_rows.to(batch.last_hidden.device()))
                        .to(device_, dtype_);
  }
  const ops::DFlashHeadLossOutput head = ops::DFlashHeadLoss(hidden, frozen_.lm_head, labels, target_hidden, loss_);
  // Per drafted row k: the share of supervised rows the draft gets right,
  // and their mean loss (the loss's own, unweighted).
  torch::NoGradGuard no_grad;
  const at::Tensor hits = head.hits.view({-1, B}).to(at::kDouble);
  const at::Tensor supervised = labels.ge(0).view({-1, B}).to(at::kDouble);
  const at::Tensor nll = head.row_loss.view({-1, B}).to(at::kDouble);
  const at::Tensor counts = supervised.sum(0).clamp_min(1.0).to(at::kCPU);
  const at::Tensor acc = (hits * supervised).sum(0).to(at::kCPU) / counts;
  const at::Tensor ploss = (nll * supervised).sum(0).to(at::kCPU) / counts;
  double run = 1.0;
  out->tau = 1.0;
  for (int64_t k = 1; k < B; ++k) {
    out->acc.push_back(acc[k].item<double>());
    out->ploss.push_back(ploss[k].item<double>());
    run *= out->acc.back();
    out->tau += run;
  }
  return head.loss;
}

absl::StatusOr<DraftStepOutput> DFlashAlgorithm::Step(const TeacherBatch* batch, double lr, int64_t step) {
  optimizer_->BeginStep();
  DraftStepOutput out;
  at::Tensor loss;
  try {
    if (batch != nullptr) {
      E3_ASSIGN_OR_RETURN(loss, BlockLoss(*batch, step, &out));
    }
    // No batch, or no anchor in it: zero gradients, in lockstep with the
    // other ranks' reduction.
    if (!loss.defined()) loss = torch::zeros({}, torch::TensorOptions().device(device_).requires_grad(true));
    loss.backward();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("DFlash training step ", step, ": ", e.what_without_backtrace()));
  }
  E3_RETURN_IF_ERROR(optimizer_->FinishStep(lr));
  out.loss = loss.item<double>();
  if (!std::isfinite(out.loss)) return absl::InternalError(absl::StrCat("loss is ", out.loss, " at step ", step));
  return out;
}

absl::Status DFlashAlgorithm::WarmStart(const std::string& export_dir) {
  E3_RETURN_IF_ERROR(trained().LoadExport(export_dir, OtherTarget::kWarn));
  warm_start_ = export_dir;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DraftModel>> DFlashAlgorithm::Initial() const {
  const auto options = torch::TensorOptions().device(device_).dtype(dtype_);
  E3_ASSIGN_OR_RETURN(DFlashDraft d, CreateDFlashDraft(config_, options, settings_.init_seed, frozen_));
  d->set_kernels(kernels_);
  if (!warm_start_.empty()) E3_RETURN_IF_ERROR(d->LoadExport(warm_start_, OtherTarget::kWarn));
  return std::shared_ptr<DraftModel>(d.ptr());
}

}  // namespace e3
