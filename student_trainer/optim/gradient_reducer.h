// Data-parallel gradient averaging for the student, overlapped with
// backward, the way torch DDP's reducer does it: parameters are grouped
// into buckets (in reverse registration order, roughly the order backward
// produces their gradients); a hook on each parameter copies its gradient,
// widened to fp32, into its bucket, and a full bucket starts a c10d
// all-reduce at once while backward continues. Buckets are launched in
// index order on every rank, so the collectives match. Finish() waits,
// divides by the world size and writes the averaged fp32 gradients into
// the destination tensors' .grad (the fp32 master weights, or the
// parameters themselves), so every rank steps with identical gradients.
#ifndef E3_STUDENT_TRAINER_OPTIM_GRADIENT_REDUCER_H_
#define E3_STUDENT_TRAINER_OPTIM_GRADIENT_REDUCER_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/torch/process_group.h"
#include "common/torch/torch_core.h"

namespace e3 {

class GradientReducer {
 public:
  // `params`: the tensors backward produces gradients for; `dest`: where
  // the averaged gradients go (same shapes; may be `params` themselves).
  GradientReducer(ProcessGroup* group, std::vector<at::Tensor> params, std::vector<at::Tensor> dest,
                  size_t bucket_bytes = 25u << 20);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the hooks for one backward pass (clears the buckets).
  void Prepare();
  // After backward: launches what is left (a parameter whose hook did not
  // fire sends the gradient it holds), waits, averages into dest.grad;
  // the params' own gradients are cleared when they differ from dest.
  absl::Status Finish();
  size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    at::Tensor flat;             // fp32
    size_t ready = 0;
    std::unique_ptr<PendingCollective> pending;
    absl::Status launch_status;
  };
  void OnGradient(size_t index, const at::Tensor& grad);
  void LaunchReady();

  ProcessGroup* group_;
  std::vector<at::Tensor> params_, dest_;
  std::vector<size_t> bucket_of_, slot_of_;  // each param's bucket and place in it
  std::vector<bool> seen_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;
  bool armed_ = false;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_OPTIM_GRADIENT_REDUCER_H_
