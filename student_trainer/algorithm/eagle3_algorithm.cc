#include "student_trainer/algorithm/eagle3_algorithm.h"

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "student_trainer/draft/draft_export.h"
#include "student_trainer/step/train_step.h"

namespace e3 {

absl::StatusOr<std::unique_ptr<Eagle3Algorithm>> Eagle3Algorithm::Create(const DraftSettings& draft,
                                                                         const ScheduleSettings& schedule,
                                                                         const at::Device& device) {
  std::unique_ptr<Eagle3Algorithm> a(new Eagle3Algorithm(draft, schedule, device));
  TttOptions& ttt = a->ttt_;
  ttt.length = draft.ttt_length;
  E3_ASSIGN_OR_RETURN(ttt.kernels, ParseTttKernels(draft.kernels));
  E3_ASSIGN_OR_RETURN(ttt.positions, ParseTttPositions(draft.ttt_positions));
  E3_ASSIGN_OR_RETURN(ttt.loss, ParseTttLoss(draft.ttt_loss));
  ttt.kl_scale = draft.kl_scale;
  ttt.kl_decay = draft.kl_decay;
  ttt.defer_metrics = true;  // read after the optimizer step: one synchronisation per step
  a->dtype_name_ = ComputeDtypeName(draft, device);
  E3_ASSIGN_OR_RETURN(a->options_.dtype, ParseComputeScalarType(a->dtype_name_));
  return a;
}

absl::StatusOr<TeacherNeeds> Eagle3Algorithm::needs(const ModelConfig& target) const {
  TeacherNeeds needs;
  // fc reads the layers; the target's distribution over the draft vocab
  // comes from last_hidden, and the argmax masks positions whose target
  // token lies outside it.
  E3_ASSIGN_OR_RETURN(needs.features.aux_layer_ids, DraftReadsLayers(settings_, target));
  needs.features.last_hidden = true;
  needs.features.target_argmax = true;
  needs.target_head_rest = NeedsFullTargetHead(ttt_.loss);
  return needs;
}

absl::Status Eagle3Algorithm::MakeOptions(const TeacherInfo& info) {
  ModelConfig target = info.config;
  int64_t intermediate_size = settings_.intermediate_size;
  if (!settings_.init_from.empty() && intermediate_size == 0) {
    // A warm start takes the draft's own width unless one is asked for.
    E3_ASSIGN_OR_RETURN(const Eagle3DraftConfig from,
                        ReadDraftConfig(JoinPath(settings_.init_from, kDraftConfigFile)));
    intermediate_size = from.intermediate_size;
  }
  if (intermediate_size > 0) target.intermediate_size = intermediate_size;
  E3_ASSIGN_OR_RETURN(options_.config, DraftConfigFromTarget(target, info.draft_vocab_size, info.aux_layer_ids));
  options_.config.target = info.target;
  options_.config.fc_norm = options_.config.norm_output = settings_.algorithm == "eagle3.1";
  options_.seed = settings_.init_seed;
  options_.device = device_;
  options_.keep_full_target_head = NeedsFullTargetHead(ttt_.loss);
  return absl::OkStatus();
}

absl::Status Eagle3Algorithm::MoveFrozen(const FrozenWeights& frozen) {
  try {
    frozen_ = {frozen.embed_tokens.to(device_), frozen.target_head.to(device_, options_.target_head_dtype),
               frozen.vocab};
    if (frozen.target_head_rest.defined()) {
      frozen_.target_head_rest = frozen.target_head_rest.to(device_, options_.target_head_dtype);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("moving the frozen weights to ", device_.str(), ": ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status Eagle3Algorithm::Build(const TeacherInfo& info, const FrozenWeights& frozen, ProcessGroup* group) {
  E3_RETURN_IF_ERROR(MakeOptions(info));
  // The frozen tensors go to the device once, so the working draft and the
  // fp32 master share them.
  E3_RETURN_IF_ERROR(MoveFrozen(frozen));
  E3_ASSIGN_OR_RETURN(draft_, CreateEagle3Draft(options_, frozen_));
  if (options_.dtype != at::kFloat) {
    Eagle3DraftOptions master = options_;
    master.dtype = at::kFloat;
    master.keep_full_target_head = false;  // the master is never run
    E3_ASSIGN_OR_RETURN(master_, CreateEagle3Draft(master, frozen_));
  }
  E3_ASSIGN_OR_RETURN(optimizer_, CreateScheduledOptimizer(settings_, schedule_, *draft_,
                                                           master_.has_value() ? &**master_ : nullptr, group));
  return absl::OkStatus();
}

std::string Eagle3Algorithm::Describe() const {
  return absl::StrCat(options_.config.norm_output ? "EAGLE-3.1" : "EAGLE-3", " draft on ", device_.str(), ", compute ", dtype_name_,
                      master_.has_value() ? " with fp32 master weights" : "", ", ",
                      ttt_.kernels == TttKernels::kFast ? "fast" : "reference", " kernels");
}

absl::StatusOr<DraftStepOutput> Eagle3Algorithm::Step(const TeacherBatch* batch, double lr, int64_t step) {
  E3_ASSIGN_OR_RETURN(const TttOutput out, TrainStep(*draft_, *optimizer_, batch, ttt_, lr, step));
  DraftStepOutput s;
  s.loss = out.loss_value;
  s.tau = out.tau;
  s.acc = out.acc;
  s.ploss = out.ploss;
  s.acceptance_rate = out.acceptance_rate;
  return s;
}

absl::Status Eagle3Algorithm::WarmStart(const std::string& export_dir) {
  E3_RETURN_IF_ERROR(trained().LoadExport(export_dir, OtherTarget::kWarn));
  warm_start_ = export_dir;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DraftModel>> Eagle3Algorithm::Initial() const {
  Eagle3DraftOptions initial = options_;
  initial.dtype = (master_.has_value() ? **master_ : *draft_).options().dtype;
  initial.keep_full_target_head = false;  // it only drafts
  E3_ASSIGN_OR_RETURN(Eagle3Draft d, CreateEagle3Draft(initial, frozen_));
  if (!warm_start_.empty()) E3_RETURN_IF_ERROR(d->LoadExport(warm_start_, OtherTarget::kWarn));
  return std::shared_ptr<DraftModel>(d.ptr());
}

}  // namespace e3
