#include "teacher_server/layers/rms_norm.h"

namespace e3 {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // https://github.com/huggingface/transformers/blob/main/src/transformers/models/llama/modeling_llama.py
  // (LlamaRMSNorm.forward): variance in fp32, weight applied after the cast.
  at::Tensor h = x.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

at::Tensor RmsNormWeightInFp32(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // https://github.com/huggingface/transformers/blob/main/src/transformers/models/gpt_oss/modeling_gpt_oss.py
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (weight * h).to(x.scalar_type());
}

}  // namespace e3
