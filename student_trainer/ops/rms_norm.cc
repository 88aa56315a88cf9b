#include "student_trainer/ops/rms_norm.h"

#include <tuple>

#include "student_trainer/ops/kernel_switch.h"

namespace e3::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType StatsType(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

#ifdef E3_HAS_CUDA
bool KernelTakes(const at::Tensor& x, const at::Tensor& weight) {
  return x.dim() == 2 && x.stride(1) == 1 && weight.is_contiguous() &&
         weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1);
}

// Whether the backward kernel takes these tensors, and its dtype.
bool BackwardKernelTakes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rstd,
                         kernels::Dtype* dt) {
  return StudentKernelDtype(x, dt) && KernelTakes(x, weight) && rstd.scalar_type() == at::kFloat;
}
#endif

RmsNormResult ForwardAten(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(StatsType(x));
  const at::Tensor rstd = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return {weight * (xf * rstd).to(x.scalar_type()), rstd.squeeze(-1)};
}

std::pair<at::Tensor, at::Tensor> BackwardAten(const at::Tensor& dy, const at::Tensor& x,
                                               const at::Tensor& rstd, const at::Tensor& weight,
                                               const at::Tensor& dresidual) {
  const at::ScalarType f = rstd.scalar_type();
  const at::Tensor xf = x.to(f), dyf = dy.to(f), r = rstd.unsqueeze(-1);
  const at::Tensor g = dyf * weight.to(f);
  const at::Tensor mean_gx = (g * xf).mean(-1, /*keepdim=*/true);
  at::Tensor dxf = r * g - xf * (r * r * r) * mean_gx;
  if (dresidual.defined()) dxf = dxf + dresidual.to(f);
  const at::Tensor dx = dxf.to(x.scalar_type());
  const at::Tensor dw = (dyf * (xf * r).to(x.scalar_type()).to(f)).sum(0);
  return {dx, dw};
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            const at::Tensor& weight, const at::Tensor& weight_grad, double eps) {
    (void)anchor;
    RmsNormResult r = RmsNormForward(x, weight, eps);
    ctx->save_for_backward({x, r.rstd});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["weight_grad"] = weight_grad;
    return r.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    auto [dx, dw] = RmsNormBackward(grads[0], saved[0], saved[1], weight);
    if (ctx->needs_input_grad(1)) ctx->saved_data["weight_grad"].toTensor().add_(dw);
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

class RmsNormTrainableFunction : public torch::autograd::Function<RmsNormTrainableFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const at::Tensor rows = x.reshape({-1, x.size(-1)});
    RmsNormResult r = RmsNormForward(rows, weight, eps);
    ctx->save_for_backward({rows, r.rstd, weight});
    return r.y.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dy = grads[0].reshape({-1, saved[0].size(1)});
    auto [dx, dw] = RmsNormBackward(dy, saved[0], saved[1], saved[2]);
    return {dx.view(grads[0].sizes()), dw.to(saved[2].scalar_type()), at::Tensor()};
  }
};

// Outputs {RmsNorm(x), x}; its backward gets both outputs' gradients at
// once and adds the second into the first's dx in the norm's kernel.
class RmsNormWithResidualFunction
    : public torch::autograd::Function<RmsNormWithResidualFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                               const at::Tensor& weight, const at::Tensor& weight_grad,
                               double eps) {
    (void)anchor;
    RmsNormResult r = RmsNormForward(x, weight, eps);
    ctx->save_for_backward({x, r.rstd});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["weight_grad"] = weight_grad;
    // x returned as is: autograd hands back a view of it whose gradient
    // comes to this function's backward.
    return {r.y, x};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& dnormed = grads[0];
    const at::Tensor& dresidual = grads[1];
    at::Tensor dx;
    if (dnormed.defined()) {
      const at::Tensor weight = ctx->saved_data["weight"].toTensor();
      at::Tensor dw;
      std::tie(dx, dw) = RmsNormBackward(dnormed, x, saved[1], weight,
                                         dresidual.defined() ? dresidual.to(x.scalar_type()) : dresidual);
      if (ctx->needs_input_grad(1)) ctx->saved_data["weight_grad"].toTensor().add_(dw);
    } else {
      dx = dresidual;
    }
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

RmsNormResult RmsNormForward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1), "RmsNorm: x ",
              x.sizes(), ", weight ", weight.sizes());
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (StudentKernelDtype(x, &dt) && KernelTakes(x, weight)) {
    RmsNormResult r;
    r.y = at::empty(x.sizes(), x.options());
    r.rstd = at::empty({x.size(0)}, x.options().dtype(at::kFloat));
    if (kernels::RmsNormForward(dt, x.data_ptr(), x.stride(0), weight.data_ptr(),
                                        r.y.data_ptr(), r.y.stride(0), r.rstd.data_ptr<float>(),
                                        x.size(0), x.size(1), static_cast<float>(eps),
                                        StudentKernelStream(x))) {
      CheckStudentKernelLaunch("RmsNormForward");
      return r;
    }
  }
#endif
  return ForwardAten(x, weight, eps);
}

at::Tensor RmsNormBackwardInto(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& rstd,
                               const at::Tensor& weight, const at::Tensor& dx,
                               const at::Tensor& dresidual) {
  TORCH_CHECK(dx.sizes() == x.sizes() && dx.scalar_type() == x.scalar_type() && dx.is_contiguous(),
              "RmsNormBackwardInto: dx ", dx.sizes(), " ", dx.scalar_type(),
              " must be contiguous and shaped and typed as x ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(!dresidual.defined() ||
                  (dresidual.sizes() == x.sizes() && dresidual.scalar_type() == x.scalar_type()),
              "RmsNormBackwardInto: dresidual ", dresidual.sizes(), " ", dresidual.scalar_type(),
              " must be shaped and typed as x ", x.sizes(), " ", x.scalar_type());
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (BackwardKernelTakes(x, weight, rstd, &dt)) {
    const at::Tensor dyc = dy.contiguous();
    const at::Tensor drc = dresidual.defined() ? dresidual.contiguous() : dresidual;
    at::Tensor partial = at::empty({kernels::RmsNormBackwardBlocks(x.size(0)), x.size(1)},
                                   x.options().dtype(at::kFloat));
    if (kernels::RmsNormBackward(dt, dyc.data_ptr(), x.data_ptr(), x.stride(0),
                                         weight.data_ptr(), rstd.data_ptr<float>(),
                                         drc.defined() ? drc.data_ptr() : nullptr, dx.data_ptr(),
                                         partial.data_ptr<float>(), x.size(0), x.size(1),
                                         StudentKernelStream(x))) {
      CheckStudentKernelLaunch("RmsNormBackward");
      return partial.sum(0);
    }
  }
#endif
  auto [dx_aten, dw] = BackwardAten(dy, x, rstd, weight, dresidual);
  dx.copy_(dx_aten);
  return dw;
}

std::pair<at::Tensor, at::Tensor> RmsNormBackward(const at::Tensor& dy, const at::Tensor& x,
                                                  const at::Tensor& rstd, const at::Tensor& weight,
                                                  const at::Tensor& dresidual) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (BackwardKernelTakes(x, weight, rstd, &dt)) {
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor dw = RmsNormBackwardInto(dy, x, rstd, weight, dx, dresidual);
    return {dx, dw};
  }
#endif
  return BackwardAten(dy, x, rstd, weight, dresidual);
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_grad,
                   const at::Tensor& anchor, double eps) {
  return RmsNormFunction::apply(x, anchor, weight.detach(), weight_grad.detach(), eps);
}

at::Tensor RmsNormTrainable(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormTrainableFunction::apply(x, weight, eps);
}

NormedWithResidual RmsNormWithResidual(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& weight_grad, const at::Tensor& anchor,
                                       double eps) {
  variable_list out =
      RmsNormWithResidualFunction::apply(x, anchor, weight.detach(), weight_grad.detach(), eps);
  return {out[0], out[1]};
}

}  // namespace e3::ops
