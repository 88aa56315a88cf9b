// The draft's trainable parameters in one flat buffer, with a gradient
// buffer of the same layout. Each parameter becomes a view of its slice
// (its values copied in), in registration order, so that
// - the fast TTT step reads fused weights as single matrices without
//   copies: q_proj, k_proj and v_proj are adjacent rows of one [q + k + v,
//   2H] matrix, gate_proj and up_proj of one [2I, H] matrix, while the
//   export and checkpoints still see the named parameters;
// - the optimizer updates every parameter with one kernel over one buffer
//   (student_trainer/optim/fused_adamw.h), and data parallelism reduces one
//   buffer;
// - gradients accumulate in place (ops::LinearAccumulate adds into views
//   of grad()); AttachGrads() makes each parameter's .grad() its view.
//
// Parameters start with no .grad(), as any module's, so LibTorch's own
// optimizers work on them; LibTorch 1.13's zero_grad() refuses gradients
// that are views, so code that attaches them clears them with ZeroGrad().
//
// The slices follow each other with no gaps, so consecutive parameters of
// one width always form one matrix. With the draft's shapes (multiples of
// 8 elements) every slice is 16-byte aligned; the kernels check alignment
// and take their ATen path where it is not.
#ifndef E3_STUDENT_TRAINER_DRAFT_FLAT_PARAMETERS_H_
#define E3_STUDENT_TRAINER_DRAFT_FLAT_PARAMETERS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"

namespace e3 {

class FlatParameters {
 public:
  // All parameters must share a dtype and a device.
  static absl::StatusOr<FlatParameters> Create(
      const std::vector<std::pair<std::string, at::Tensor>>& params);

  const at::Tensor& data() const { return data_; }
  // Allocated (zeros) on first use: a copy that only ever holds weights
  // (the fp32 master of the fused optimizer) never pays for a gradient.
  const at::Tensor& grad() const {
    EnsureGrad();
    return grad_;
  }
  int64_t numel() const { return data_.numel(); }
  // An input for the fast ops' autograd Functions that requires grad (see
  // ops::LinearAccumulate); its own gradient is never set.
  const at::Tensor& anchor() const { return anchor_; }

  // The named parameter's slice of data() / grad(), shaped as the
  // parameter. Throws c10::Error for an unknown name.
  at::Tensor View(const std::string& name) const;
  at::Tensor GradView(const std::string& name) const;
  // The same slice of another flat tensor of this layout (optimizer moments).
  at::Tensor ViewIn(const at::Tensor& flat, const std::string& name) const;
  // Adjacent 2-D parameters with the same column count as one matrix of
  // their stacked rows (of data() / grad()); InvalidArgument when they are
  // not adjacent in the buffer.
  absl::StatusOr<at::Tensor> Rows(const std::vector<std::string>& names) const;
  absl::StatusOr<at::Tensor> GradRows(const std::vector<std::string>& names) const;

  // Points every parameter's .grad() at its slice of grad().
  void AttachGrads();
  // Zeroes grad() and attaches it.
  void ZeroGrad();

 private:
  void EnsureGrad() const;

  struct Slot {
    int64_t offset = 0;
    std::vector<int64_t> shape;
    at::Tensor param;
  };
  absl::StatusOr<at::Tensor> RowsOf(const at::Tensor& flat,
                                    const std::vector<std::string>& names) const;
  at::Tensor SliceOf(const at::Tensor& flat, const Slot& slot) const;
  const Slot& SlotOf(const std::string& name) const;

  at::Tensor data_, anchor_;
  mutable at::Tensor grad_;  // see grad()
  std::map<std::string, Slot> slots_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_DRAFT_FLAT_PARAMETERS_H_
