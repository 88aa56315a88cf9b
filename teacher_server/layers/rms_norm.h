// RMSNorm as transformers' LlamaRMSNorm computes it: the statistics in
// fp32, the normalised value cast back to the input dtype, then scaled by
// the weight (in that order, which matters in bf16).
#ifndef E3_TEACHER_SERVER_LAYERS_RMS_NORM_H_
#define E3_TEACHER_SERVER_LAYERS_RMS_NORM_H_

#include "common/torch/torch_core.h"

namespace e3 {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_RMS_NORM_H_
