#include "student_trainer/ops/rope_qkv.h"

#include "common/torch/rope.h"
#include "student_trainer/ops/kernel_switch.h"

namespace e3::ops {

at::Tensor RopeQkvForward(const at::Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t tokens = qkv.size(0), heads = q_heads + 2 * kv_heads;
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == heads * head_dim, "RopeQkv: qkv ", qkv.sizes(),
              " for ", heads, " heads of ", head_dim);
#ifdef E3_HAS_CUDA
  const int64_t rotary_dim = cos.size(-1);
  kernels::Dtype dt;
  if (StudentKernelDtype(qkv, &dt) && qkv.is_contiguous() && cos.is_contiguous() &&
      sin.is_contiguous() && cos.scalar_type() == qkv.scalar_type() &&
      sin.scalar_type() == qkv.scalar_type()) {
    at::Tensor out = at::empty({tokens, heads, head_dim}, qkv.options());
    if (kernels::RopeQkvForward(dt, qkv.data_ptr(), out.data_ptr(), tokens, q_heads,
                                        kv_heads, head_dim, rotary_dim, cos.data_ptr(),
                                        sin.data_ptr(), StudentKernelStream(qkv))) {
      CheckStudentKernelLaunch("RopeQkvForward");
      return out;
    }
  }
#endif
  const at::Tensor x = qkv.view({tokens, heads, head_dim});
  const at::Tensor qk = rope::Apply(x.narrow(1, 0, q_heads + kv_heads), cos, sin);
  return at::cat({qk, x.narrow(1, q_heads + kv_heads, kv_heads)}, 1);
}

at::Tensor RopeQkvBackward(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                           const at::Tensor& cos, const at::Tensor& sin, at::ScalarType dtype) {
  const int64_t tokens = dq.size(0), q_heads = dq.size(1), kv_heads = dk.size(1),
                head_dim = dq.size(2);
  const int64_t heads = q_heads + 2 * kv_heads;
#ifdef E3_HAS_CUDA
  kernels::Dtype dt;
  if (StudentKernelDtype(cos, &dt) && cos.scalar_type() == dtype &&
      dq.scalar_type() == at::kFloat && dk.scalar_type() == at::kFloat &&
      dv.scalar_type() == at::kFloat && dq.is_contiguous() && dk.is_contiguous() &&
      dv.is_contiguous() && cos.is_contiguous() && sin.is_contiguous()) {
    at::Tensor out = at::empty({tokens, heads * head_dim}, cos.options());
    if (kernels::RopeQkvBackward(dt, dq.data_ptr<float>(), dk.data_ptr<float>(),
                                         dv.data_ptr<float>(), out.data_ptr(), tokens, q_heads,
                                         kv_heads, head_dim, cos.size(-1), cos.data_ptr(),
                                         sin.data_ptr(), StudentKernelStream(cos))) {
      CheckStudentKernelLaunch("RopeQkvBackward");
      return out;
    }
  }
#endif
  // The rotation's transpose is the rotation by -sin (cos and sin hold
  // each frequency twice, rotate_half's layout).
  const at::ScalarType f = dq.scalar_type();
  const at::Tensor dqk = rope::Apply(at::cat({dq, dk}, 1), cos.to(f), -sin.to(f));
  return at::cat({dqk, dv}, 1).to(dtype).view({tokens, heads * head_dim});
}

}  // namespace e3::ops
