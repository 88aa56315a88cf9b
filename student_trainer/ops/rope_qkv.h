// Rotary embedding of the draft's fused q/k/v projection for the fast TTT
// step: one kernel ropes every q and k head and copies the v heads, so the
// step keeps one roped [tokens, q_heads + 2 kv_heads, head_dim] tensor
// (what later TTT steps attend to) and frees the raw projection.
#ifndef E3_STUDENT_TRAINER_OPS_ROPE_QKV_H_
#define E3_STUDENT_TRAINER_OPS_ROPE_QKV_H_

#include "common/torch/torch_core.h"

namespace e3::ops {

// qkv [tokens, (q_heads + 2 kv_heads) * head_dim] contiguous; cos/sin
// [tokens, rotary_dim] (rope::CosSin). Returns [tokens, q_heads + 2
// kv_heads, head_dim] with the first rotary_dim features of each q and k
// head rotated (rotate_half, as rope::Apply).
at::Tensor RopeQkvForward(const at::Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, const at::Tensor& cos, const at::Tensor& sin);
// The gradient of qkv, [tokens, (q_heads + 2 kv_heads) * head_dim] in
// `dtype`, from the gradients of the roped q, k and v (dq [tokens, q_heads,
// head_dim], dk and dv [tokens, kv_heads, head_dim], all one float dtype,
// contiguous).
at::Tensor RopeQkvBackward(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                           const at::Tensor& cos, const at::Tensor& sin, at::ScalarType dtype);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_ROPE_QKV_H_
