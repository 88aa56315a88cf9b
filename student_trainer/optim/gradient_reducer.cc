#include "student_trainer/optim/gradient_reducer.h"

#include "absl/strings/str_cat.h"

namespace e3 {

GradientReducer::GradientReducer(ProcessGroup* group, std::vector<at::Tensor> params, std::vector<at::Tensor> dest,
                                 size_t bucket_bytes)
    : group_(group), params_(std::move(params)), dest_(std::move(dest)) {
  TORCH_CHECK(params_.size() == dest_.size(), "gradient reducer: ", params_.size(), " params, ", dest_.size(), " dests");
  bucket_of_.resize(params_.size());
  slot_of_.resize(params_.size());
  seen_.resize(params_.size());
  // Reverse order: backward reaches the last layers first.
  Bucket current;
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    current.offsets.push_back(current.offsets.empty() ? 0
                                                      : current.offsets.back() + params_[current.params.back()].numel());
    slot_of_[k] = current.params.size();
    current.params.push_back(k);
    bucket_of_[k] = buckets_.size();
    bytes += static_cast<size_t>(params_[k].numel()) * 4;
    if (bytes >= bucket_bytes) {
      buckets_.push_back(std::move(current));
      current = Bucket();
      bytes = 0;
    }
  }
  if (!current.params.empty()) buckets_.push_back(std::move(current));
  for (Bucket& b : buckets_) {
    const int64_t n = b.offsets.back() + params_[b.params.back()].numel();
    b.flat = torch::zeros({n}, params_[b.params.front()].options().dtype(at::kFloat));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].register_hook([this, i](const at::Tensor& grad) { OnGradient(i, grad); });
  }
}

void GradientReducer::Prepare() {
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.pending.reset();
    b.launch_status = absl::OkStatus();
  }
  std::fill(seen_.begin(), seen_.end(), false);
  next_launch_ = 0;
  armed_ = true;
}

void GradientReducer::OnGradient(size_t index, const at::Tensor& grad) {
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[index]];
  torch::NoGradGuard no_grad;
  b.flat.narrow(0, b.offsets[slot_of_[index]], grad.numel()).copy_(grad.reshape({-1}));
  if (!seen_[index]) {
    seen_[index] = true;
    ++b.ready;
  }
  LaunchReady();
}

void GradientReducer::LaunchReady() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == buckets_[next_launch_].params.size()) {
    Bucket& b = buckets_[next_launch_++];
    auto pending = group_->AllReduceSum(b.flat);
    if (pending.ok()) {
      b.pending = std::move(pending).value();
    } else {
      b.launch_status = pending.status();
    }
  }
}

absl::Status GradientReducer::Finish() {
  armed_ = false;
  // A parameter whose hook did not fire contributes the gradient it holds:
  // zeros when backward did not reach it (the optimizer cleared it), or
  // what the fast TTT step accumulated into it outside autograd.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (seen_[i]) continue;
    Bucket& b = buckets_[bucket_of_[i]];
    at::Tensor slot = b.flat.narrow(0, b.offsets[slot_of_[i]], params_[i].numel());
    const at::Tensor& held = params_[i].grad();
    if (held.defined()) {
      slot.copy_(held.reshape({-1}));
    } else {
      slot.zero_();
    }
    seen_[i] = true;
    ++b.ready;
  }
  LaunchReady();
  torch::NoGradGuard no_grad;
  const double scale = 1.0 / group_->world_size();
  for (Bucket& b : buckets_) {
    if (!b.launch_status.ok()) return b.launch_status;
    if (b.pending == nullptr) return absl::InternalError("gradient reducer: a bucket was never launched");
    absl::Status st = b.pending->Wait();
    if (!st.ok()) return st;
    b.flat.mul_(scale);
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      const size_t i = b.params[slot];
      at::Tensor avg = b.flat.narrow(0, b.offsets[slot], params_[i].numel()).view(params_[i].sizes());
      at::Tensor& g = dest_[i].mutable_grad();
      if (!g.defined()) g = torch::zeros_like(dest_[i]);
      g.copy_(avg);
      if (!params_[i].is_same(dest_[i]) && params_[i].grad().defined()) params_[i].mutable_grad().reset();
    }
  }
  return absl::OkStatus();
}

}  // namespace e3
