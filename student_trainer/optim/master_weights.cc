#include "student_trainer/optim/master_weights.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace e3 {

absl::StatusOr<MasterWeights> MasterWeights::Create(torch::nn::Module& work, torch::nn::Module& master) {
  MasterWeights mw;
  auto w = work.named_parameters();
  auto m = master.named_parameters();
  if (w.size() != m.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("master weights: ", m.size(), " master parameters for ", w.size(), " working ones"));
  }
  for (size_t i = 0; i < w.size(); ++i) {
    const auto& wi = w[i];
    const auto& mi = m[i];
    if (wi.key() != mi.key() || !wi.value().sizes().equals(mi.value().sizes())) {
      return absl::InvalidArgumentError(absl::StrCat("master weights: parameter ", i, " is ", wi.key(), " ",
                                                     c10::str(wi.value().sizes()), " in the working draft but ",
                                                     mi.key(), " ", c10::str(mi.value().sizes()), " in the master"));
    }
    if (mi.value().scalar_type() != at::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat("master weights: ", mi.key(), " is ",
                                                     c10::toString(mi.value().scalar_type()), ", expected float32"));
    }
    mw.work_.push_back(wi.value());
    mw.master_.push_back(mi.value());
  }
  mw.PushWeights();
  return mw;
}

void MasterWeights::PullGradients() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < work_.size(); ++i) {
    at::Tensor& mg = master_[i].mutable_grad();
    const at::Tensor& wg = work_[i].grad();
    if (!mg.defined()) mg = torch::zeros_like(master_[i]);
    if (wg.defined()) {
      mg.copy_(wg);
    } else {
      mg.zero_();
    }
    if (wg.defined()) work_[i].mutable_grad().reset();
  }
}

void MasterWeights::PushWeights() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < work_.size(); ++i) work_[i].copy_(master_[i]);
}

}  // namespace e3
