#include "student_trainer/ops/silu_mul.h"

#include "student_trainer/ops/kernel_switch.h"

namespace e3::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class SiluMulFunction : public torch::autograd::Function<SiluMulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    return SiluMulForward(gate_up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {SiluMulBackward(grads[0], ctx->get_saved_variables()[0])};
  }
};

}  // namespace

at::Tensor SiluMulForward(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "SiluMul: gate_up ", gate_up.sizes());
  const int64_t cols = gate_up.size(1) / 2;
#ifdef E3_HAS_CUDA
  const int64_t rows = gate_up.size(0);
  kernels::Dtype dt;
  if (StudentKernelDtype(gate_up, &dt) && gate_up.is_contiguous()) {
    at::Tensor out = at::empty({rows, cols}, gate_up.options());
    if (kernels::SiluMulForward(dt, gate_up.data_ptr(), out.data_ptr(), rows, cols,
                                        StudentKernelStream(gate_up))) {
      CheckStudentKernelLaunch("SiluMulForward");
      return out;
    }
  }
#endif
  return at::silu(gate_up.narrow(1, 0, cols)) * gate_up.narrow(1, cols, cols);
}

at::Tensor SiluMulBackward(const at::Tensor& dout, const at::Tensor& gate_up) {
  const int64_t cols = gate_up.size(1) / 2;
#ifdef E3_HAS_CUDA
  const int64_t rows = gate_up.size(0);
  kernels::Dtype dt;
  if (StudentKernelDtype(gate_up, &dt) && gate_up.is_contiguous() &&
      dout.scalar_type() == gate_up.scalar_type()) {
    const at::Tensor d = dout.contiguous();
    at::Tensor grad = at::empty_like(gate_up);
    if (kernels::SiluMulBackward(dt, d.data_ptr(), gate_up.data_ptr(), grad.data_ptr(),
                                         rows, cols, StudentKernelStream(gate_up))) {
      CheckStudentKernelLaunch("SiluMulBackward");
      return grad;
    }
  }
#endif
  const at::ScalarType f = gate_up.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor gate = gate_up.narrow(1, 0, cols), up = gate_up.narrow(1, cols, cols);
  const at::Tensor g = gate.to(f), s = at::sigmoid(g), df = dout.to(f);
  const at::Tensor d_gate = df * up.to(f) * s * (1 + g * (1 - s));
  const at::Tensor d_up = df * at::silu(gate).to(f);
  return at::cat({d_gate, d_up}, 1).to(gate_up.scalar_type());
}

at::Tensor SiluMul(const at::Tensor& gate_up) { return SiluMulFunction::apply(gate_up); }

}  // namespace e3::ops
