#include "teacher_server/layers/fused_ops.h"

#include <atomic>

#include "teacher_server/layers/rms_norm.h"
#include "teacher_server/layers/rotary.h"

#ifdef E3_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/hopper_gemm.h"
#include "kernels/teacher_ops.h"
#include "teacher_server/layers/kernel_launch.h"
#endif

namespace e3 {
namespace {

std::atomic<int64_t> g_launches{0};

#ifdef E3_HAS_CUDA
// The kernels' dtype for t, or false when no kernel takes it.
bool KernelDtype(const at::Tensor& t, kernels::Dtype* out) {
  if (!FusedKernelsRunOn(t.device())) return false;
  if (t.scalar_type() == at::kBFloat16) {
    *out = kernels::Dtype::kBFloat16;
    return true;
  }
  if (t.scalar_type() == at::kHalf) {
    *out = kernels::Dtype::kFloat16;
    return true;
  }
  return false;
}

// Whether the add+norm kernel takes these tensors: a contiguous [rows,
// cols] stream, a delta of the same layout (or none), weights of the
// stream's dtype (kernels::AddRmsNorm checks widths and alignment).
bool NormKernelTakes(const at::Tensor& h, const at::Tensor& delta, const at::Tensor& weight) {
  const bool delta_ok = !delta.defined() || (delta.is_contiguous() && delta.sizes() == h.sizes() &&
                                             delta.scalar_type() == h.scalar_type());
  return h.dim() == 2 && h.is_contiguous() && weight.scalar_type() == h.scalar_type() && weight.is_contiguous() &&
         weight.numel() == h.size(1) && delta_ok;
}

// Whether the kernels take `limit` as the device-side row count of t's
// rows: none (undefined), or one int32 on t's device for a 2-D t.
bool RowLimitTakes(const at::Tensor& limit, const at::Tensor& t) {
  return !limit.defined() ||
         (limit.scalar_type() == at::kInt && limit.numel() == 1 && limit.device() == t.device() && t.dim() == 2);
}

// The kernels' row_limit argument: null for no limit.
const int32_t* RowLimitData(const at::Tensor& limit) { return limit.defined() ? limit.data_ptr<int32_t>() : nullptr; }

// After a launcher accepted its arguments: checks the launch and counts it.
void CheckLaunch(const char* what) {
  CheckKernelLaunch(/*launched=*/true, what);
  g_launches.fetch_add(1, std::memory_order_relaxed);
}
#endif

}  // namespace

int64_t FusedKernelLaunches() { return g_launches.load(std::memory_order_relaxed); }

bool FusedKernelsRunOn(const at::Device& device) {
#ifdef E3_HAS_CUDA
  if (!device.is_cuda()) return false;
  // LibTorch reads each device's properties once and caches them.
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  return at::cuda::getDeviceProperties(index)->major >= 8;
#else
  (void)device;
  return false;
#endif
}

bool FusedKernelsBuilt() {
#ifdef E3_HAS_CUDA
  return true;
#else
  return false;
#endif
}

at::Tensor AddRmsNorm(at::Tensor* h, const at::Tensor& delta, const at::Tensor& weight, double eps, bool fused) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (fused && KernelDtype(*h, &dt) && NormKernelTakes(*h, delta, weight)) {
    const c10::cuda::CUDAGuard guard(h->device());
    at::Tensor sum = delta.defined() ? torch::empty_like(*h) : at::Tensor();
    at::Tensor out = torch::empty_like(*h);
    if (kernels::AddRmsNorm(dt, h->data_ptr(), delta.defined() ? delta.data_ptr() : nullptr, weight.data_ptr(),
                            delta.defined() ? sum.data_ptr() : nullptr, out.data_ptr(), h->size(0), h->size(1),
                            static_cast<float>(eps), CurrentStream(*h))) {
      CheckLaunch("add+RMSNorm");
      if (delta.defined()) *h = sum;
      return out;
    }
  }
#endif
  (void)fused;
  if (delta.defined()) *h = *h + delta;
  return RmsNorm(*h, weight, eps);
}

at::Tensor SiluMul(const at::Tensor& gate_up, bool fused, const at::Tensor& row_limit) {
  const int64_t I = gate_up.size(-1) / 2;
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (fused && I > 0 && KernelDtype(gate_up, &dt) && gate_up.is_contiguous() && RowLimitTakes(row_limit, gate_up)) {
    const c10::cuda::CUDAGuard guard(gate_up.device());
    std::vector<int64_t> shape = gate_up.sizes().vec();
    shape.back() = I;
    at::Tensor out = torch::empty(shape, gate_up.options());
    if (kernels::SiluMul(dt, gate_up.data_ptr(), out.data_ptr(), gate_up.numel() / (2 * I), I,
                         RowLimitData(row_limit), CurrentStream(gate_up))) {
      CheckLaunch("SiLU-and-multiply");
      return out;
    }
  }
#endif
  (void)fused;
  (void)row_limit;
  return at::silu(gate_up.narrow(-1, 0, I)) * gate_up.narrow(-1, I, I);
}

void SetSiluMulByTable(bool on) {
#ifdef E3_HAS_CUDA
  kernels::SetSiluMulByTable(on);
#else
  (void)on;
#endif
}

bool SiluMulByTable(const at::Device& device) {
#ifdef E3_HAS_CUDA
  if (!FusedKernelsRunOn(device)) return false;
  const c10::cuda::CUDAGuard guard(device);
  return kernels::SiluMulByTable(c10::cuda::getCurrentCUDAStream().stream());
#else
  (void)device;
  return false;
#endif
}

at::Tensor GatherRows(const at::Tensor& x, const at::Tensor& index, const at::Tensor& row_limit, bool fused) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (fused && KernelDtype(x, &dt) && x.dim() == 2 && x.is_contiguous() && index.dim() == 1 &&
      index.scalar_type() == at::kLong && index.is_contiguous() && index.device() == x.device() &&
      index.numel() > 0 && RowLimitTakes(row_limit, x)) {
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = torch::empty({index.numel(), x.size(1)}, x.options());
    if (kernels::GatherRows(dt, x.data_ptr(), index.data_ptr<int64_t>(), out.data_ptr(), index.numel(), x.size(1),
                            RowLimitData(row_limit), CurrentStream(x))) {
      CheckLaunch("row gather");
      return out;
    }
  }
#endif
  (void)fused;
  (void)row_limit;
  return x.index_select(0, index);
}

at::Tensor BiasClampedSwiGlu(const at::Tensor& gate_up, const at::Tensor& bias, const at::Tensor& row_expert,
                             const ClampedSwiGlu& act, bool fused, const at::Tensor& row_limit) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  const int64_t I = gate_up.size(-1) / 2;
  const bool bias_ok = !bias.defined() || (bias.scalar_type() == gate_up.scalar_type() && bias.is_contiguous() &&
                                           bias.dim() == 2 && bias.size(1) == 2 * I && row_expert.defined() &&
                                           row_expert.scalar_type() == at::kLong && row_expert.is_contiguous() &&
                                           row_expert.numel() == gate_up.size(0));
  if (fused && I > 0 && KernelDtype(gate_up, &dt) && gate_up.dim() == 2 && gate_up.is_contiguous() && bias_ok &&
      RowLimitTakes(row_limit, gate_up)) {
    const c10::cuda::CUDAGuard guard(gate_up.device());
    at::Tensor out = torch::empty({gate_up.size(0), I}, gate_up.options());
    if (kernels::ClampedSwiGlu(dt, gate_up.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr,
                               bias.defined() ? row_expert.data_ptr<int64_t>() : nullptr, out.data_ptr(),
                               gate_up.size(0), I, static_cast<float>(act.alpha), static_cast<float>(act.limit),
                               RowLimitData(row_limit), CurrentStream(gate_up))) {
      CheckLaunch("clamped SwiGLU");
      return out;
    }
  }
#endif
  (void)fused;
  (void)row_limit;
  return ClampedSwiGluActivation(bias.defined() ? gate_up + bias.index_select(0, row_expert) : gate_up, act);
}

at::Tensor MoeCombine(const at::Tensor& y, const at::Tensor& rows, const at::Tensor& weights, const at::Tensor& valid,
                      bool fused) {
  const int64_t T = rows.size(0), k = rows.size(1), H = y.size(1);
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  const bool fp32_weights = weights.scalar_type() == at::kFloat;
  if (fused && KernelDtype(y, &dt) && y.is_contiguous() && rows.scalar_type() == at::kLong && rows.is_contiguous() &&
      (weights.scalar_type() == y.scalar_type() || fp32_weights) && weights.is_contiguous() &&
      (!valid.defined() || (valid.scalar_type() == at::kBool && valid.is_contiguous()))) {
    const c10::cuda::CUDAGuard guard(y.device());
    at::Tensor out = torch::empty({T, H}, y.options());
    if (kernels::MoeCombine(dt, y.data_ptr(), rows.data_ptr<int64_t>(), weights.data_ptr(), fp32_weights,
                            valid.defined() ? static_cast<const uint8_t*>(valid.data_ptr()) : nullptr,
                            out.data_ptr(), T, k, H, CurrentStream(y))) {
      CheckLaunch("MoE combine");
      return out;
    }
  }
#endif
  (void)fused;
  at::Tensor out = torch::zeros({T, H}, y.options());
  for (int64_t r = 0; r < k; ++r) {
    // Rounded to y's dtype before the add (a no-op for weights in that
    // dtype; fp32 weights give an fp32 product, rounded as the loop does).
    at::Tensor part = (y.index_select(0, rows.select(1, r)) * weights.select(1, r).unsqueeze(-1)).to(y.scalar_type());
    // A choice that does not count adds nothing (its row of y may hold no value).
    if (valid.defined()) part = at::where(valid.select(1, r).unsqueeze(-1), part, at::zeros({}, part.options()));
    out.add_(part);
  }
  return out;
}

void RopeInPlace(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool fused) {
  const int64_t rotary_dim = cos.size(-1);
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (fused && KernelDtype(x, &dt) && x.dim() == 3 && x.stride(2) == 1 && cos.dim() == 2 && cos.is_contiguous() &&
      sin.is_contiguous() && sin.sizes() == cos.sizes() && cos.scalar_type() == x.scalar_type() &&
      sin.scalar_type() == x.scalar_type() && cos.size(0) == x.size(0) && rotary_dim <= x.size(2)) {
    const c10::cuda::CUDAGuard guard(x.device());
    if (kernels::RopeInPlace(dt, x.data_ptr(), x.size(0), x.size(1), x.stride(0), x.stride(1), rotary_dim,
                             cos.data_ptr(), sin.data_ptr(), CurrentStream(x))) {
      CheckLaunch("rotary");
      return;
    }
  }
#endif
  (void)fused;
  at::Tensor rot = x.narrow(-1, 0, rotary_dim);
  rot.copy_(ApplyRotary(rot, cos, sin));
}

at::Tensor HeadRmsNormRope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                           const at::Tensor& sin, bool fused) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (fused && KernelDtype(x, &dt) && x.dim() == 3 && x.stride(2) == 1 && weight.scalar_type() == x.scalar_type() &&
      weight.is_contiguous() && weight.numel() == x.size(2) && cos.dim() == 2 && cos.is_contiguous() &&
      sin.is_contiguous() && sin.sizes() == cos.sizes() && cos.scalar_type() == x.scalar_type() &&
      sin.scalar_type() == x.scalar_type() && cos.size(0) == x.size(0) && cos.size(1) <= x.size(2)) {
    const c10::cuda::CUDAGuard guard(x.device());
    if (kernels::HeadRmsNormRopeInPlace(dt, x.data_ptr(), x.size(0), x.size(1), x.stride(0), x.stride(1), x.size(2),
                                        weight.data_ptr(), static_cast<float>(eps), cos.size(1), cos.data_ptr(),
                                        sin.data_ptr(), CurrentStream(x))) {
      CheckLaunch("q/k norm + rotary");
      return x;
    }
  }
#endif
  at::Tensor y = RmsNorm(x, weight, eps);
  RopeInPlace(y, cos, sin, fused);
  return y;
}

at::Tensor RowArgmax(const at::Tensor& logits, bool fused) {
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (fused && KernelDtype(logits, &dt) && logits.dim() == 2 && logits.size(0) > 0 && logits.size(1) > 0 &&
      logits.stride(1) == 1) {
    const c10::cuda::CUDAGuard guard(logits.device());
    at::Tensor out = torch::empty({logits.size(0)}, logits.options().dtype(at::kInt));
    if (kernels::RowArgmax(dt, logits.data_ptr(), logits.size(0), logits.size(1), logits.stride(0),
                           out.data_ptr<int32_t>(), CurrentStream(logits))) {
      CheckLaunch("row argmax");
      return out;
    }
  }
#endif
  (void)fused;
  return logits.argmax(-1).to(at::kInt);
}

at::Tensor LinearArgmax(const at::Tensor& x, const at::Tensor& w) {
#ifdef E3_HAS_CUDA
  const bool layout_ok = x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && x.size(0) > 0 &&
                         x.stride(1) == 1 && w.stride(1) == 1 && x.scalar_type() == at::kBFloat16 &&
                         w.scalar_type() == at::kBFloat16 && x.device() == w.device();
  if (layout_ok && FusedKernelsRunOn(x.device())) {
    const c10::cuda::CUDAGuard guard(x.device());  // the kernel runs on the current device
    at::Tensor keys = torch::empty({x.size(0)}, x.options().dtype(at::kLong));
    at::Tensor out = torch::empty({x.size(0)}, x.options().dtype(at::kInt));
    // It declines, launching nothing, off sm_90 devices and for a layout
    // it cannot read; the caller then computes the logits.
    if (kernels::LinearArgmaxBf16(x.data_ptr(), x.stride(0), w.data_ptr(), w.stride(0), x.size(0), w.size(0),
                                  x.size(1), keys.data_ptr(), out.data_ptr<int32_t>(), CurrentStream(x))) {
      CheckLaunch("lm_head argmax GEMM");
      return out;
    }
  }
#endif
  (void)x;
  (void)w;
  return at::Tensor();
}

}  // namespace e3
