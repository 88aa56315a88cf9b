#include "student_trainer/ops/linear.h"

#include "common/torch/gemm.h"

namespace e3::ops {
namespace {

// residual + x @ weight^T. On the GPU through cuBLASLt with the residual
// as the epilogue's C and a new output D: at::addmm would first copy the
// residual into its output (a read and a write of every output element).
at::Tensor ResidualLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual) {
  if (x.is_cuda()) return Gemm(x, weight, at::Tensor(), residual, GemmPath::kCublasLt);
  return at::addmm(residual, x, weight.t());
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class LinearAccumulateFunction : public torch::autograd::Function<LinearAccumulateFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                            const at::Tensor& anchor, const at::Tensor& weight,
                            const at::Tensor& weight_grad) {
    (void)anchor;
    ctx->save_for_backward({x});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["weight_grad"] = weight_grad;
    const bool has_residual = residual.numel() > 0;
    ctx->saved_data["has_residual"] = has_residual;
    return has_residual ? ResidualLinear(x, weight, residual) : at::mm(x, weight.t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const at::Tensor& dy = grads[0];
    at::Tensor dx, dresidual;
    if (ctx->needs_input_grad(0)) dx = at::mm(dy, weight);
    if (ctx->needs_input_grad(1) && ctx->saved_data["has_residual"].toBool()) dresidual = dy;
    if (ctx->needs_input_grad(2)) {
      at::Tensor weight_grad = ctx->saved_data["weight_grad"].toTensor();
      weight_grad.addmm_(dy.t(), x);
    }
    return {dx, dresidual, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LinearAccumulate(const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& weight_grad, const at::Tensor& anchor,
                            const at::Tensor& residual) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "LinearAccumulate: x ", x.sizes(), " does not meet weight ", weight.sizes());
  TORCH_CHECK(weight_grad.sizes() == weight.sizes(), "LinearAccumulate: weight_grad ",
              weight_grad.sizes(), " for weight ", weight.sizes());
  // LibTorch 1.13's Function::apply takes no undefined inputs: an empty
  // tensor stands for "no residual".
  static const at::Tensor kNoResidual = at::empty({0});
  return LinearAccumulateFunction::apply(x, residual.defined() ? residual : kNoResidual, anchor,
                                         weight.detach(), weight_grad.detach());
}

}  // namespace e3::ops
