#include "student_trainer/ops/step_rows.h"

#include "common/torch/torch_compat.h"
#include "student_trainer/ops/autograd_capsule.h"
#include "student_trainer/ops/kernel_switch.h"
#include "student_trainer/ops/rms_norm.h"

namespace e3::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType SumType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// G = dy^T @ xhat in fp32 or wider: 16-bit inputs multiply with an fp32
// result where LibTorch offers it (the G * norm_weight and W * G sums then
// see no 16-bit rounding of G).
at::Tensor WeightSpaceProduct(const at::Tensor& dy, const at::Tensor& xhat) {
  const bool half = dy.scalar_type() == at::kBFloat16 || dy.scalar_type() == at::kHalf;
  if (compat::kHasMmFloatOut && half && dy.is_cuda()) return compat::MmFloatOut(dy.t(), xhat);
  return at::mm(dy.t(), xhat).to(SumType(dy.scalar_type()));
}

// weight_grad += g * norm_weight (columns scaled), norm_grad += the sum over
// weight's rows of weight * g: one kernel pass on the GPU, else ATen.
void AddNormedProjectionGrads(const at::Tensor& g, const at::Tensor& norm_weight, const at::Tensor& weight,
                              at::Tensor weight_grad, at::Tensor norm_grad) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  const int64_t rows = weight.size(0), cols = weight.size(1);
  if (StudentKernelDtype(weight, &dt) && g.scalar_type() == at::kFloat && g.is_contiguous() &&
      norm_weight.is_contiguous() && norm_weight.scalar_type() == weight.scalar_type() &&
      weight_grad.scalar_type() == weight.scalar_type() && weight.stride(1) == 1 && weight_grad.stride(1) == 1 &&
      weight.stride(0) == weight_grad.stride(0)) {
    at::Tensor partial = at::empty({kernels::NormedProjectionGradBlocks(rows), cols}, g.options());
    if (kernels::NormedProjectionGrads(dt, g.data_ptr<float>(), norm_weight.data_ptr(), weight.data_ptr(),
                                               weight_grad.data_ptr(), weight.stride(0), partial.data_ptr<float>(),
                                               rows, cols, StudentKernelStream(g))) {
      CheckStudentKernelLaunch("NormedProjectionGrads");
      norm_grad.add_(partial.sum(0));
      return;
    }
  }
#endif
  weight_grad.add_(g * norm_weight.to(g.scalar_type()));
  norm_grad.add_((weight.to(g.scalar_type()) * g).sum(0));
}

// RmsNorm(input) @ weight^T once per batch, the input frozen. Its output
// gradient comes from the capsule's StepRowsGradient, which the steps'
// GatherRowsFunction nodes fill before autograd runs this one; its backward
// takes both weights' gradients in weight space.
class ProjectNormedForStepsFunction : public torch::autograd::Function<ProjectNormedForStepsFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& anchor,
                            const at::Tensor& norm_weight, const at::Tensor& norm_grad, const at::Tensor& weight,
                            const at::Tensor& weight_grad, const at::Tensor& capsule, double eps) {
    (void)anchor;
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({input});
    ctx->saved_data["norm_weight"] = norm_weight;
    ctx->saved_data["norm_grad"] = norm_grad;
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["weight_grad"] = weight_grad;
    ctx->saved_data["capsule"] = capsule;
    ctx->saved_data["eps"] = eps;
    return at::mm(RmsNormForward(input, norm_weight, eps).y, weight.t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list /*grads*/) {
    const at::Tensor input = ctx->get_saved_variables()[0];
    auto gradient = FromCapsule<StepRowsGradient>(ctx->saved_data["capsule"].toTensor());
    const at::Tensor dy = gradient->Take(input.scalar_type());
    if (dy.defined()) {
      const at::Tensor norm_weight = ctx->saved_data["norm_weight"].toTensor();
      // With a weight of ones the norm returns its rounded rows as they are.
      const at::Tensor xhat =
          RmsNormForward(input, at::ones_like(norm_weight), ctx->saved_data["eps"].toDouble()).y;
      AddNormedProjectionGrads(WeightSpaceProduct(dy, xhat), norm_weight, ctx->saved_data["weight"].toTensor(),
                               ctx->saved_data["weight_grad"].toTensor(),
                               ctx->saved_data["norm_grad"].toTensor());
    }
    return variable_list(8);
  }
};

class GatherRowsFunction : public torch::autograd::Function<GatherRowsFunction> {
 public:
  // first_row >= 0: rows are [first_row, first_row + rows.numel()).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& projection, const at::Tensor& rows,
                            const at::Tensor& capsule, int64_t first_row) {
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["capsule"] = capsule;
    return first_row >= 0 ? projection.narrow(0, first_row, rows.numel()) : projection.index_select(0, rows);
  }

  // The gradient goes into the shared sum, none through autograd's edge:
  // the edge still orders the projection's backward after this one. A
  // range's rows go through the same scatter-add kernel: their list is on
  // the device anyway.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (grads[0].defined()) {
      FromCapsule<StepRowsGradient>(ctx->saved_data["capsule"].toTensor())
          ->Add(ctx->saved_data["rows"].toTensor(), grads[0]);
    }
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
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
  kernels::Dtype dt;
  if (StudentKernelDtype(dy, &dt) && sum_.scalar_type() == at::kFloat && rows.scalar_type() == at::kLong) {
    const at::Tensor src = dy.contiguous(), index = rows.contiguous();
    if (kernels::ScatterAddRows(dt, src.data_ptr(), index.data_ptr<int64_t>(), sum_.data_ptr<float>(),
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

ProjectedForSteps ProjectNormedForSteps(const at::Tensor& input, const at::Tensor& norm_weight,
                                        const at::Tensor& norm_grad, const at::Tensor& weight,
                                        const at::Tensor& weight_grad, const at::Tensor& anchor, double eps) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 2 && input.size(1) == weight.size(1) &&
                  norm_weight.dim() == 1 && norm_weight.size(0) == input.size(1),
              "ProjectNormedForSteps: input ", input.sizes(), ", norm weight ", norm_weight.sizes(), ", weight ",
              weight.sizes());
  TORCH_CHECK(weight_grad.sizes() == weight.sizes() && norm_grad.sizes() == norm_weight.sizes(),
              "ProjectNormedForSteps: gradients ", weight_grad.sizes(), " and ", norm_grad.sizes(), " for weights ",
              weight.sizes(), " and ", norm_weight.sizes());
  TORCH_CHECK(!input.requires_grad(), "ProjectNormedForSteps: the input must take no gradient");
  ProjectedForSteps p;
  p.gradient = std::make_shared<StepRowsGradient>(input.size(0), weight.size(0), input.options());
  p.projection = ProjectNormedForStepsFunction::apply(input, anchor, norm_weight.detach(), norm_grad.detach(),
                                                      weight.detach(), weight_grad.detach(), CapsuleOf(p), eps);
  return p;
}

at::Tensor GatherStepRows(const ProjectedForSteps& p, const at::Tensor& rows, int64_t first_row) {
  TORCH_CHECK(first_row < 0 || first_row + rows.numel() <= p.projection.size(0), "GatherStepRows: rows [",
              first_row, ", ", first_row + rows.numel(), ") of a projection of ", p.projection.size(0));
  return GatherRowsFunction::apply(p.projection, rows, CapsuleOf(p), first_row);
}

}  // namespace e3::ops
