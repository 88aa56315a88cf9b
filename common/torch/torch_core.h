// The parts of LibTorch's C++ API this project uses: tensors and their
// factories (torch::randn, torch::tensor, ...), autograd and custom
// functions, the CUDA queries, nn::Module and nn::Linear (the draft), the
// optimizers' Adam/AdamW (the reference optimizer) and the serialize
// archives. Files include this instead of <torch/torch.h>, and it is the
// shared precompiled header (cmake/E3Helpers.cmake): <torch/torch.h> adds
// the whole of nn (every module and functional), data, jit, fft and the
// Python extension headers, which cost each file that includes them about
// 2-4 s of compile time on GCC even from a precompiled header.
#ifndef E3_COMMON_TORCH_TORCH_CORE_H_
#define E3_COMMON_TORCH_TORCH_CORE_H_

#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <torch/types.h>
#include <torch/utils.h>

#endif  // E3_COMMON_TORCH_TORCH_CORE_H_
