#include "student_trainer/draft/flat_parameters.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace e3 {
namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

absl::StatusOr<FlatParameters> FlatParameters::Create(
    const std::vector<std::pair<std::string, at::Tensor>>& params) {
  if (params.empty()) return absl::InvalidArgumentError("flat parameters: no parameters");
  const at::TensorOptions options = params.front().second.options().requires_grad(false);
  FlatParameters flat;
  int64_t total = 0;
  for (const auto& [name, p] : params) {
    if (p.scalar_type() != params.front().second.scalar_type() ||
        p.device() != params.front().second.device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("flat parameters: ", name, " is ", c10::toString(p.scalar_type()), " on ",
                       p.device().str(), ", unlike ", params.front().first));
    }
    if (flat.slots_.count(name) != 0)
      return absl::InvalidArgumentError(absl::StrCat("flat parameters: ", name, " twice"));
    flat.slots_[name] = {total, p.sizes().vec(), p};
    total += p.numel();
  }
  flat.data_ = at::zeros({total}, options);
  flat.anchor_ = at::zeros({1}, options.dtype(at::kFloat)).requires_grad_(true);
  torch::NoGradGuard no_grad;
  for (auto& [name, slot] : flat.slots_) {
    at::Tensor view = flat.SliceOf(flat.data_, slot);
    view.copy_(slot.param);
    slot.param.set_data(view);
  }
  return flat;
}

at::Tensor FlatParameters::SliceOf(const at::Tensor& flat, const Slot& slot) const {
  return flat.narrow(0, slot.offset, Numel(slot.shape)).view(slot.shape);
}

const FlatParameters::Slot& FlatParameters::SlotOf(const std::string& name) const {
  auto it = slots_.find(name);
  TORCH_CHECK(it != slots_.end(), "flat parameters: no parameter ", name);
  return it->second;
}

at::Tensor FlatParameters::View(const std::string& name) const {
  return SliceOf(data_, SlotOf(name));
}
void FlatParameters::EnsureGrad() const {
  if (!grad_.defined()) grad_ = at::zeros({data_.numel()}, data_.options());
}

at::Tensor FlatParameters::GradView(const std::string& name) const {
  EnsureGrad();
  return SliceOf(grad_, SlotOf(name));
}
at::Tensor FlatParameters::ViewIn(const at::Tensor& flat, const std::string& name) const {
  TORCH_CHECK(flat.numel() == data_.numel(), "flat parameters: a flat tensor of ", flat.numel(),
              " elements for a layout of ", data_.numel());
  return SliceOf(flat, SlotOf(name));
}

absl::StatusOr<at::Tensor> FlatParameters::RowsOf(const at::Tensor& flat,
                                                  const std::vector<std::string>& names) const {
  if (names.empty()) return absl::InvalidArgumentError("flat parameters: no rows asked for");
  int64_t rows = 0, cols = -1, next = -1, first = 0;
  for (const std::string& name : names) {
    auto it = slots_.find(name);
    if (it == slots_.end())
      return absl::InvalidArgumentError(absl::StrCat("flat parameters: no parameter ", name));
    const Slot& s = it->second;
    if (s.shape.size() != 2 || (cols >= 0 && s.shape[1] != cols) ||
        (next >= 0 && s.offset != next)) {
      return absl::InvalidArgumentError(absl::StrCat("flat parameters: [",
                                                     absl::StrJoin(names, ", "),
                                                     "] are not adjacent matrices of one width"));
    }
    if (next < 0) first = s.offset;
    cols = s.shape[1];
    rows += s.shape[0];
    next = s.offset + s.shape[0] * s.shape[1];
  }
  return flat.narrow(0, first, rows * cols).view({rows, cols});
}

absl::StatusOr<at::Tensor> FlatParameters::Rows(const std::vector<std::string>& names) const {
  return RowsOf(data_, names);
}
absl::StatusOr<at::Tensor> FlatParameters::GradRows(const std::vector<std::string>& names) const {
  EnsureGrad();
  return RowsOf(grad_, names);
}

void FlatParameters::AttachGrads() {
  EnsureGrad();
  for (auto& [name, slot] : slots_) {
    if (!slot.param.grad().defined() || !slot.param.grad().is_alias_of(grad_)) {
      slot.param.mutable_grad() = SliceOf(grad_, slot);
    }
  }
}

void FlatParameters::ZeroGrad() {
  torch::NoGradGuard no_grad;
  EnsureGrad();
  grad_.zero_();
  AttachGrads();
}

}  // namespace e3
