// The gated delta rule: the linear attention of Qwen3-Next's and Qwen3.5's
// Gated DeltaNet layers (flash-linear-attention's formulation, as
// transformers runs it). Per head, a state S [Dk, Dv] starts at the
// sequence's initial state (zeros unless given) and at each step t
//   S   <- exp(g_t) S                       (g_t <= 0: the gate's decay)
//   u_t  = beta_t (v_t - S^T k_t)           (the delta: what k_t should
//                                            read, less what it reads)
//   S   <- S + k_t u_t^T
//   o_t  = S^T q_t
// q and k arrive as the model prepares them (L2-normalised, q scaled).
//
// Two statements of it, equal up to rounding:
//   recurrent  the steps above, one token at a time (the reference, and
//              generation's step);
//   chunked    chunks of C tokens at once. With G_i the chunk's cumulative
//              log decay up to row i and S0 the state at the chunk's start,
//              the deltas of a chunk solve a unit lower-triangular system
//                (I + L) U = beta V - diag(beta e^G) K S0,
//                L_ij = beta_i e^(G_i - G_j) k_i . k_j  (j < i),
//              and then
//                O  = diag(e^G) Q S0 + ((Q K^T) o M) U,  M_ij = e^(G_i - G_j) (j <= i),
//                S1 = e^(G_last) S0 + (e^(G_last - G) o K)^T U.
//              Everything but the last three products is independent of
//              S0, so it runs for all chunks at once, and only the short
//              scan over chunks is sequential.
//
// Sequences are packed rows [T, H, *] with cu_seqlens (N + 1 row offsets,
// on the host). Arithmetic in at least fp32 (fp64 for fp64 inputs); the
// output [T, H, Dv] is in that dtype.
#ifndef E3_TEACHER_SERVER_LAYERS_GATED_DELTA_RULE_H_
#define E3_TEACHER_SERVER_LAYERS_GATED_DELTA_RULE_H_

#include <cstdint>
#include <vector>

#include "common/torch/torch_core.h"

namespace e3 {

struct GatedDeltaRuleInputs {
  at::Tensor q, k;  // [T, H, Dk]
  at::Tensor v;     // [T, H, Dv]
  at::Tensor g;     // [T, H]: log decay, <= 0
  at::Tensor beta;  // [T, H]
};

// `state`, where given: [N, H, Dk, Dv] (N = cu_seqlens.size() - 1), each
// sequence's initial state on entry (an undefined tensor: zeros) and its
// final state on return, in the arithmetic dtype.
at::Tensor GatedDeltaRuleRecurrent(const GatedDeltaRuleInputs& in,
                                   const std::vector<int64_t>& cu_seqlens,
                                   at::Tensor* state = nullptr);
at::Tensor GatedDeltaRuleChunked(const GatedDeltaRuleInputs& in,
                                 const std::vector<int64_t>& cu_seqlens,
                                 at::Tensor* state = nullptr, int64_t chunk = 64);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_GATED_DELTA_RULE_H_
