#include "student_trainer/ops/step_rows.h"

#include "student_trainer/ops/autograd_capsule.h"
#include "student_trainer/ops/kernel_switch.h"

namespace e3::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType SumType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Its output's gradient comes from the capsule's StepRowsGradient, which
// the steps' GatherRowsFunction nodes fill before autograd runs this one.
class ProjectForStepsFunction : public torch::autograd::Function<ProjectForStepsFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            const at::Tensor& weight, const at::Tensor& weight_grad, const at::Tensor& capsule) {
    (void)anchor;
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["weight_grad"] = weight_grad;
    ctx->saved_data["capsule"] = capsule;
    return at::mm(x, weight.t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list /*grads*/) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    auto gradient = FromCapsule<StepRowsGradient>(ctx->saved_data["capsule"].toTensor());
    const at::Tensor dy = gradient->Take(x.scalar_type());
    at::Tensor dx;
    if (dy.defined()) {
      if (ctx->needs_input_grad(0)) dx = at::mm(dy, ctx->saved_data["weight"].toTensor());
      ctx->saved_data["weight_grad"].toTensor().addmm_(dy.t(), x);
    }
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class GatherRowsFunction : public torch::autograd::Function<GatherRowsFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& projection, const at::Tensor& rows,
                            const at::Tensor& capsule) {
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["capsule"] = capsule;
    return projection.index_select(0, rows);
  }

  // The gradient goes into the shared sum, none through autograd's edge:
  // the edge still orders the projection's backward after this one.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (grads[0].defined()) {
      FromCapsule<StepRowsGradient>(ctx->saved_data["capsule"].toTensor())
          ->Add(ctx->saved_data["rows"].toTensor(), grads[0]);
    }
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The capsule each ProjectedForSteps' nodes share, kept beside it.
at::Tensor CapsuleOf(const ProjectedForSteps& p) { return ToCapsule(p.gradient); }

}  // namespace

StepRowsGradient::StepRowsGradient(int64_t rows, int64_t cols, const at::TensorOptions& options)
    : rows_(rows), cols_(cols), options_(options.dtype(SumType(options.dtype().toScalarType()))) {}

void StepRowsGradient::Add(const at::Tensor& rows, const at::Tensor& dy) {
  TORCH_CHECK(dy.dim() == 2 && dy.size(1) == cols_ && rows.numel() == dy.size(0), "StepRowsGradient: dy ",
              dy.sizes(), " for ", rows.numel(), " rows of ", cols_);
  if (!sum_.defined()) sum_ = at::zeros({rows_, cols_}, options_);
#ifdef E3_HAS_CUDA
  student_kernels::Dtype dt;
  if (StudentKernelDtype(dy, &dt) && sum_.scalar_type() == at::kFloat && rows.scalar_type() == at::kLong) {
    const at::Tensor src = dy.contiguous(), index = rows.contiguous();
    if (student_kernels::ScatterAddRows(dt, src.data_ptr(), index.data_ptr<int64_t>(), sum_.data_ptr<float>(),
                                        src.size(0), cols_, StudentKernelStream(src))) {
      CheckStudentKernelLaunch("ScatterAddRows");
      return;
    }
  }
#endif
  sum_.index_add_(0, rows, dy.to(sum_.scalar_type()));
}

at::Tensor StepRowsGradient::Take(at::ScalarType dtype) {
  at::Tensor out = sum_.defined() ? sum_.to(dtype) : at::Tensor();
  sum_ = at::Tensor();
  return out;
}

ProjectedForSteps ProjectForSteps(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_grad,
                                  const at::Tensor& anchor) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "ProjectForSteps: x ", x.sizes(),
              " does not meet weight ", weight.sizes());
  TORCH_CHECK(weight_grad.sizes() == weight.sizes(), "ProjectForSteps: weight_grad ", weight_grad.sizes(),
              " for weight ", weight.sizes());
  ProjectedForSteps p;
  p.gradient = std::make_shared<StepRowsGradient>(x.size(0), weight.size(0), x.options());
  p.projection = ProjectForStepsFunction::apply(x, anchor, weight.detach(), weight_grad.detach(), CapsuleOf(p));
  return p;
}

at::Tensor GatherStepRows(const ProjectedForSteps& p, const at::Tensor& rows) {
  return GatherRowsFunction::apply(p.projection, rows, CapsuleOf(p));
}

}  // namespace e3::ops
