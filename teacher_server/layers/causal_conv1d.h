// The short causal convolution of Qwen3-Next's and Qwen3.5's Gated
// DeltaNet layers: depthwise (one filter of K taps per channel), no bias,
// then SiLU, over packed sequences, with each sequence's last K - 1 inputs
// kept as its state so that generation continues where a prefill stopped:
//   y[t, c] = silu(sum_{i < K} w[c, i] * x[t - K + 1 + i, c]),
// where rows before a sequence's first come from its state (zeros for a
// fresh sequence). w[c, K - 1] weighs the current row, as torch's conv1d
// with K - 1 left padding weighs it.
#ifndef E3_TEACHER_SERVER_LAYERS_CAUSAL_CONV1D_H_
#define E3_TEACHER_SERVER_LAYERS_CAUSAL_CONV1D_H_

#include <cstdint>
#include <vector>

#include "common/torch/torch_core.h"

namespace e3 {

// x [T, C] packed by cu_seqlens (N + 1 row offsets on the host); weight
// [C, K] (the checkpoint's [C, 1, K] with the middle dimension dropped).
// `state`, where given: [N, C, K - 1], each sequence's previous inputs on
// entry (an undefined tensor: zeros) and its last K - 1 inputs on return
// (older rows of the entry state where the sequence is shorter). Sums in
// fp32 (fp64 for fp64 inputs), y rounded once to x's dtype.
at::Tensor CausalConv1dSilu(const at::Tensor& x, const at::Tensor& weight,
                            const std::vector<int64_t>& cu_seqlens, at::Tensor* state = nullptr);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_CAUSAL_CONV1D_H_
