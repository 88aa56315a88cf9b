#include "student_trainer/optim/draft_optimizer.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "student_trainer/optim/adamw_state_file.h"
#include "student_trainer/optim/fused_adamw.h"
#include "student_trainer/optim/gradient_reducer.h"
#include "student_trainer/optim/master_weights.h"

namespace e3 {
namespace {

// LibTorch's AdamW and clip_grad_norm_ over the named parameters.
class ReferenceOptimizer : public DraftOptimizer {
 public:
  ReferenceOptimizer(DraftModel& work, DraftModel* master, ProcessGroup* group,
                     const DraftOptimizerOptions& options,
                     std::optional<MasterWeights> master_weights)
      : work_(work),
        trained_(master != nullptr ? *master : work),
        params_(trained_.ExportedParameters()),
        options_(options),
        master_weights_(std::move(master_weights)),
        optimizer_(trained_.parameters(), torch::optim::AdamWOptions(1e-4)
                                              .betas({options.beta1, options.beta2})
                                              .eps(options.eps)
                                              .weight_decay(options.weight_decay)) {
    if (group != nullptr && group->world_size() > 1) {
      reducer_ = std::make_unique<GradientReducer>(group, work.parameters(), trained_.parameters());
    }
  }

  void BeginStep() override {
    // Not optimizer_.zero_grad(): LibTorch 1.13's detaches each gradient in
    // place, which the flat buffer's views refuse.
    trained_.flat().ZeroGrad();
    if (&work_ != &trained_) work_.flat().ZeroGrad();
    if (reducer_ != nullptr) reducer_->Prepare();
  }

  absl::Status FinishStep(double lr) override {
    for (auto& group : optimizer_.param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    try {
      if (reducer_ != nullptr) {
        E3_RETURN_IF_ERROR(reducer_->Finish());
      } else if (master_weights_.has_value()) {
        master_weights_->PullGradients();
      }
      if (options_.grad_clip > 0)
        torch::nn::utils::clip_grad_norm_(trained_.parameters(), options_.grad_clip);
      optimizer_.step();
      if (master_weights_.has_value()) master_weights_->PushWeights();
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("optimizer step: ", e.what_without_backtrace()));
    }
    return absl::OkStatus();
  }

  void SyncWorkingWeights() override {
    if (master_weights_.has_value()) master_weights_->PushWeights();
  }

  absl::Status Save(const std::string& dir) override {
    const auto moments = MomentsOfTorchAdamW(optimizer_, params_);
    return WriteAdamWState(JoinPath(dir, kAdamWStateFile), moments.first, moments.second);
  }

  absl::Status Load(const std::string& dir) override {
    const std::string path = JoinPath(dir, kAdamWStateFile);
    if (PathExists(path)) {
      const std::vector<NamedMoments> moments = ZeroMoments(params_);
      E3_ASSIGN_OR_RETURN(int64_t step, ReadAdamWState(path, moments));
      if (step > 0) SetTorchAdamWMoments(optimizer_, params_, step, moments);
      return absl::OkStatus();
    }
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(JoinPath(dir, kLegacyOptimizerFile));
      optimizer_.load(archive);
    } catch (const c10::Error& e) {
      return absl::DataLossError(absl::StrCat(dir, ": neither ", kAdamWStateFile,
                                              " nor a readable ", kLegacyOptimizerFile, ": ",
                                              e.what_without_backtrace()));
    }
    return absl::OkStatus();
  }

  const char* name() const override { return "reference"; }

 private:
  DraftModel& work_;
  DraftModel& trained_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  DraftOptimizerOptions options_;
  std::optional<MasterWeights> master_weights_;
  torch::optim::AdamW optimizer_;
  std::unique_ptr<GradientReducer> reducer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DraftOptimizer>> CreateDraftOptimizer(
    DraftOptimizerKind kind, DraftModel& work, DraftModel* master, ProcessGroup* group,
    const DraftOptimizerOptions& options) {
  try {
    if (kind == DraftOptimizerKind::kFused)
      return std::make_unique<FusedAdamW>(work, master, group, options);
    std::optional<MasterWeights> mw;
    if (master != nullptr) {
      E3_ASSIGN_OR_RETURN(MasterWeights m, MasterWeights::Create(work, *master));
      mw = std::move(m);
    }
    return std::make_unique<ReferenceOptimizer>(work, master, group, options, std::move(mw));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("creating the optimizer: ", e.what_without_backtrace()));
  }
}

}  // namespace e3
