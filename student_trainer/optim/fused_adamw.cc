#include "student_trainer/optim/fused_adamw.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "student_trainer/ops/kernel_switch.h"

namespace e3 {

FusedAdamW::FusedAdamW(DraftModel& work, DraftModel* master, ProcessGroup* group,
                       const DraftOptimizerOptions& options)
    : work_(work), trained_(master != nullptr ? *master : work), group_(group), options_(options) {
  const at::Tensor& data = trained_.flat().data();
  TORCH_CHECK(data.scalar_type() == at::kFloat || data.scalar_type() == at::kDouble,
              "fused AdamW: the trained weights must be fp32 (or fp64), got ",
              c10::toString(data.scalar_type()));
  exp_avg_ = at::zeros_like(data);
  exp_avg_sq_ = at::zeros_like(data);
  lr_dev_ = at::zeros({1}, data.options().dtype(at::kFloat));
  step_dev_ = at::zeros({1}, data.options().dtype(at::kFloat));
  SyncWorkingWeights();
}

void FusedAdamW::BeginStep() { work_.flat().ZeroGrad(); }

absl::StatusOr<at::Tensor> FusedAdamW::ReducedGradients() {
  const at::Tensor& grad = work_.flat().grad();
  if (group_ == nullptr || group_->world_size() == 1) return grad;
  at::Tensor sum = grad.to(at::kFloat);
  E3_ASSIGN_OR_RETURN(auto pending, group_->AllReduceSum(sum));
  E3_RETURN_IF_ERROR(pending->Wait());
  return sum.mul_(1.0 / group_->world_size());
}

at::Tensor FusedAdamW::GradNorm(const at::Tensor& grad) {
#ifdef E3_HAS_CUDA
  if (grad.is_cuda() && ops::StudentKernelsEnabled() &&
      trained_.flat().data().scalar_type() == at::kFloat) {
    kernels::Dtype dt = kernels::Dtype::kBFloat16;
    const bool fp32 = grad.scalar_type() == at::kFloat;
    if (fp32 || ops::StudentKernelDtype(grad, &dt)) {
      at::Tensor partial = at::empty({kernels::AdamWNormBlocks(grad.numel())},
                                     grad.options().dtype(at::kFloat));
      if (kernels::GradSquaredNormPartials(dt, fp32, grad.data_ptr(), grad.numel(),
                                                   partial.data_ptr<float>(),
                                                   ops::StudentKernelStream(grad))) {
        ops::CheckStudentKernelLaunch("GradSquaredNormPartials");
        return partial.sum().sqrt().reshape({1});
      }
    }
  }
#endif
  const at::ScalarType f = trained_.flat().data().scalar_type();
  return grad.to(f).pow(2).sum().sqrt().reshape({1});
}

bool FusedAdamW::UpdateWithKernel(const at::Tensor& grad, double lr) {
#ifdef E3_HAS_CUDA
  const at::Tensor& master = trained_.flat().data();
  if (!master.is_cuda() || !ops::StudentKernelsEnabled() || master.scalar_type() != at::kFloat)
    return false;
  const bool separate_work = &trained_ != &work_;
  kernels::Dtype work_dt = kernels::Dtype::kBFloat16;
  if (separate_work && !ops::StudentKernelDtype(work_.flat().data(), &work_dt)) return false;
  const bool grad_fp32 = grad.scalar_type() == at::kFloat;
  if (!grad_fp32) {
    kernels::Dtype grad_dt;
    if (!ops::StudentKernelDtype(grad, &grad_dt) || grad_dt != work_dt) return false;
  }
  lr_dev_.fill_(lr);
  step_dev_.fill_(static_cast<double>(step_));
  kernels::AdamWScalars s;
  s.lr = lr_dev_.data_ptr<float>();
  s.step = step_dev_.data_ptr<float>();
  s.grad_norm = options_.grad_clip > 0 ? grad_norm_.data_ptr<float>() : nullptr;
  s.max_norm = static_cast<float>(options_.grad_clip);
  s.beta1 = static_cast<float>(options_.beta1);
  s.beta2 = static_cast<float>(options_.beta2);
  s.eps = static_cast<float>(options_.eps);
  s.weight_decay = static_cast<float>(options_.weight_decay);
  void* work = separate_work ? work_.flat().data().data_ptr() : nullptr;
  if (!kernels::AdamWStep(work_dt, grad_fp32, grad.data_ptr(), master.data_ptr<float>(),
                                  exp_avg_.data_ptr<float>(), exp_avg_sq_.data_ptr<float>(), work,
                                  master.numel(), s, ops::StudentKernelStream(master))) {
    return false;
  }
  ops::CheckStudentKernelLaunch("AdamWStep");
  return true;
#else
  (void)grad;
  (void)lr;
  return false;
#endif
}

void FusedAdamW::UpdateWithAten(const at::Tensor& grad, double lr) {
  torch::NoGradGuard no_grad;
  at::Tensor master = trained_.flat().data();
  at::Tensor g = grad.to(master.scalar_type());
  if (options_.grad_clip > 0) g = g * (options_.grad_clip / (grad_norm_ + 1e-6)).clamp_max(1.0);
  // torch::optim::AdamW::step, on one flat parameter.
  master.mul_(1 - lr * options_.weight_decay);
  exp_avg_.mul_(options_.beta1).add_(g, 1 - options_.beta1);
  exp_avg_sq_.mul_(options_.beta2).addcmul_(g, g, 1 - options_.beta2);
  const double bias1 = 1 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bias2 = 1 - std::pow(options_.beta2, static_cast<double>(step_));
  const at::Tensor denom = (exp_avg_sq_.sqrt() / std::sqrt(bias2)).add_(options_.eps);
  master.addcdiv_(exp_avg_, denom, -lr / bias1);
  if (&trained_ != &work_) work_.flat().data().copy_(master);
}

absl::Status FusedAdamW::FinishStep(double lr) {
  try {
    E3_ASSIGN_OR_RETURN(at::Tensor grad, ReducedGradients());
    step_ += 1;
    grad_norm_ = GradNorm(grad);
    if (!UpdateWithKernel(grad, lr)) UpdateWithAten(grad, lr);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("fused AdamW step: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

void FusedAdamW::SyncWorkingWeights() {
  if (&trained_ == &work_) return;
  torch::NoGradGuard no_grad;
  work_.flat().data().copy_(trained_.flat().data());
}

std::vector<NamedMoments> FusedAdamW::Moments() const {
  std::vector<NamedMoments> out;
  const FlatParameters& flat = trained_.flat();
  for (const auto& [name, p] : trained_.ExportedParameters()) {
    out.push_back({name, flat.ViewIn(exp_avg_, name), flat.ViewIn(exp_avg_sq_, name)});
  }
  return out;
}

absl::Status FusedAdamW::Save(const std::string& dir) {
  return WriteAdamWState(JoinPath(dir, kAdamWStateFile), step_, Moments());
}

absl::Status FusedAdamW::Load(const std::string& dir) {
  const std::string path = JoinPath(dir, kAdamWStateFile);
  if (PathExists(path)) {
    E3_ASSIGN_OR_RETURN(step_, ReadAdamWState(path, Moments()));
    return absl::OkStatus();
  }
  // A checkpoint in LibTorch's archive: read it through a torch AdamW over
  // the same parameters, then take its per-parameter state.
  const std::string legacy = JoinPath(dir, kLegacyOptimizerFile);
  torch::optim::AdamW reader(trained_.parameters(), torch::optim::AdamWOptions(1e-4));
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(legacy);
    reader.load(archive);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(dir, ": neither ", kAdamWStateFile, " nor a readable ",
                                            kLegacyOptimizerFile, ": ",
                                            e.what_without_backtrace()));
  }
  const auto moments = MomentsOfTorchAdamW(reader, trained_.ExportedParameters());
  torch::NoGradGuard no_grad;
  const std::vector<NamedMoments> mine = Moments();
  for (size_t i = 0; i < mine.size(); ++i) {
    const NamedMoments& from = moments.second[i];
    if (!from.exp_avg.sizes().equals(mine[i].exp_avg.sizes()) ||
        !from.exp_avg_sq.sizes().equals(mine[i].exp_avg_sq.sizes())) {
      return absl::DataLossError(
          absl::StrCat(legacy, ": the state of ", mine[i].name, " has another shape"));
    }
    mine[i].exp_avg.copy_(from.exp_avg);
    mine[i].exp_avg_sq.copy_(from.exp_avg_sq);
  }
  step_ = moments.first;
  return absl::OkStatus();
}

}  // namespace e3
