// AdamW's state as checkpoints store it, `optimizer.safetensors`: per
// trained parameter `exp_avg.<name>` and `exp_avg_sq.<name>` (fp32, the
// parameter's shape) and the step count in the metadata. Both optimizer
// implementations (draft_optimizer.h) write and read this one format, so
// a run may resume with either. Checkpoints from before it hold LibTorch's
// archive, `optimizer.pt`, which both still read.
#ifndef E3_STUDENT_TRAINER_OPTIM_ADAMW_STATE_FILE_H_
#define E3_STUDENT_TRAINER_OPTIM_ADAMW_STATE_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"

namespace e3 {

constexpr char kAdamWStateFile[] = "optimizer.safetensors";
constexpr char kLegacyOptimizerFile[] = "optimizer.pt";

struct NamedMoments {
  std::string name;
  at::Tensor exp_avg, exp_avg_sq;
};

absl::Status WriteAdamWState(const std::string& path, int64_t step,
                             const std::vector<NamedMoments>& moments);
// Copies the file's moments into `into` (every name must be there, with
// its shape) and returns the step. DataLoss names the file and the tensor.
// Every check precedes the first copy: a file that fails leaves `into` as
// it was (a checkpoint then falls back to an older one, checkpoint.h).
absl::StatusOr<int64_t> ReadAdamWState(const std::string& path,
                                       const std::vector<NamedMoments>& into);
// The checks alone, against the trained parameters (moments have their
// shapes): the file opens whole, holds the step and both moments of every
// parameter with its shape.
absl::Status CheckAdamWState(const std::string& path,
                             const std::vector<std::pair<std::string, at::Tensor>>& params);

// Zero moments (fp32, or fp64 for fp64 parameters) shaped as `params`.
std::vector<NamedMoments> ZeroMoments(const std::vector<std::pair<std::string, at::Tensor>>& params);

// The per-parameter state of a torch::optim::AdamW over `params`, as moments
// (zeros and step 0 before its first step), and back.
std::pair<int64_t, std::vector<NamedMoments>> MomentsOfTorchAdamW(
    torch::optim::AdamW& optimizer, const std::vector<std::pair<std::string, at::Tensor>>& params);
void SetTorchAdamWMoments(torch::optim::AdamW& optimizer,
                          const std::vector<std::pair<std::string, at::Tensor>>& params,
                          int64_t step, const std::vector<NamedMoments>& moments);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_OPTIM_ADAMW_STATE_FILE_H_
