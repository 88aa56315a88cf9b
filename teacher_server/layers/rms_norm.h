// RMSNorm as transformers' LlamaRMSNorm computes it: the statistics in
// fp32, the normalised value cast back to the input dtype, then scaled by
// the weight (in that order, which matters in bf16).
#ifndef E3_TEACHER_SERVER_LAYERS_RMS_NORM_H_
#define E3_TEACHER_SERVER_LAYERS_RMS_NORM_H_

#include "common/torch/torch_core.h"

namespace e3 {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// GPT-OSS's order (GptOssRMSNorm): the weight multiplies the fp32
// normalised value before the cast back to x's dtype. transformers keeps
// these weights in fp32 (_keep_in_fp32_modules), so `weight` should be fp32.
at::Tensor RmsNormWeightInFp32(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_RMS_NORM_H_
