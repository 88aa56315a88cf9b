// The student's fast-path CUDA kernels (nvcc, one op per kernels/*.cu),
// behind a plain C++ interface: no LibTorch in the .cu files, no CUDA
// headers here. Pointers are device pointers, `stream` is a cudaStream_t.
// Built only when LibTorch has CUDA (E3_HAS_CUDA); student_trainer/ops/
// are the only callers, and each op keeps an ATen statement of the same
// math that runs on the CPU and wherever a kernel declines its arguments.
//
// Every launcher returns false, launching nothing, when the shape, the
// dtype or the alignment is outside what its kernel handles; the op then
// takes its ATen path. Arithmetic is fp32; activations are stored in the
// 16-bit dtype, gradient accumulators in fp32 where noted.
#ifndef E3_KERNELS_STUDENT_OPS_H_
#define E3_KERNELS_STUDENT_OPS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace e3::kernels {

// ---------------------------------------------------------------------------
// RMSNorm (transformers' LlamaRMSNorm: statistics in fp32, the normalised
// row rounded to the dtype, then multiplied by the weight in the dtype).
//
// Forward: y[r] = dtype(w * dtype(x[r] * rstd[r])), rstd[r] =
// rsqrt(mean(x[r]^2) + eps), written to rstd (fp32 [rows]). Rows of x and
// y start `x_stride` / `y_stride` elements apart (y may be a column block
// of a wider tensor). Requires cols % 8 == 0, cols <= 16384, 16-byte
// aligned rows.
bool RmsNormForward(Dtype dtype, const void* x, int64_t x_stride, const void* weight, void* y,
                    int64_t y_stride, float* rstd, int64_t rows, int64_t cols, float eps,
                    void* stream);
// Backward, given dy [rows, cols] (contiguous) and the forward's x and
// rstd: with g = dy * w in fp32,
//   dx = dtype(rstd * g - x * rstd^3 * mean(g * x) + dresidual),
// where dresidual [rows, cols] (contiguous, or null for none) is the
// gradient of a residual path that also read x, added before the one
// rounding,
//   dw_partial[b, c] = sum over the rows block b took of dy * dtype(x * rstd),
// fp32 [blocks, cols], where blocks = RmsNormBackwardBlocks(rows); the
// caller sums it over b (a fixed order, so the result is deterministic).
// dx may alias dy or dresidual.
int64_t RmsNormBackwardBlocks(int64_t rows);
bool RmsNormBackward(Dtype dtype, const void* dy, const void* x, int64_t x_stride,
                     const void* weight, const float* rstd, const void* dresidual, void* dx,
                     float* dw_partial, int64_t rows, int64_t cols, void* stream);

// ---------------------------------------------------------------------------
// SiLU-mul over a fused gate/up projection: gate_up [rows, 2 * cols]
// (gate columns, then up columns), contiguous.
// Forward: out[r, c] = dtype(dtype(silu(gate)) * up).
// Backward, given dout [rows, cols]: d_gate_up [rows, 2 * cols] with
//   d_gate = dtype(dout * up * silu'(gate)),  d_up = dtype(dout * dtype(silu(gate))).
// Requires cols % 8 == 0 and 16-byte aligned tensors.
bool SiluMulForward(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t cols,
                    void* stream);
bool SiluMulBackward(Dtype dtype, const void* dout, const void* gate_up, void* d_gate_up,
                     int64_t rows, int64_t cols, void* stream);

// ---------------------------------------------------------------------------
// Row scatter-add into an fp32 sum: sum[rows[i], c] += src[i, c] for src
// [n, cols] contiguous (16-bit), rows int64 [n] DISTINCT (any order; no
// atomics, so a repeated row would race), sum fp32 [*, cols] contiguous.
// Requires cols % 8 == 0 and 16-byte aligned src and sum.
bool ScatterAddRows(Dtype dtype, const void* src, const int64_t* rows, float* sum, int64_t n,
                    int64_t cols, void* stream);

// The weight gradients of P = y @ W^T where y = dtype(w * xhat) is an
// RMSNorm's output over an input that takes no gradient (the frozen
// embeddings), given G = dP^T @ xhat (fp32 [rows, cols] contiguous; rows
// = W's rows): dW = G * w and dw = sum over W's rows of W * G. The norm
// weight's gradient is summed over W's rows instead of the tokens, which
// spares the GEMM dy = dP @ W and the norm's backward.
//   weight_grad[n, c] = dtype(fma(G[n, c], w[c], weight_grad[n, c]))  (one rounding)
//   dw_partial[b, c]  = sum over row block b of W[n, c] * G[n, c]
// dw_partial is fp32 [NormedProjectionGradBlocks(rows), cols]; the caller
// sums it over b. Rows of W and weight_grad start `ld` elements apart (a
// column block of a wider matrix). Requires cols and ld multiples of 8 and
// 16-byte aligned tensors.
int64_t NormedProjectionGradBlocks(int64_t rows);
bool NormedProjectionGrads(Dtype dtype, const float* g, const void* norm_weight, const void* weight,
                           void* weight_grad, int64_t ld, float* dw_partial, int64_t rows, int64_t cols,
                           void* stream);

// x *= *scale in place: x 16-bit [n] contiguous, scale one fp32 value on
// the device (read by the kernel: no host synchronisation). Requires
// n % 8 == 0 and x 16-byte aligned. Each element: dtype(float(x) * scale).
bool ScaleByDeviceScalar(Dtype dtype, void* x, int64_t n, const float* scale, void* stream);

// y += x * *scale in place: x and y 16-bit [n] contiguous, the same
// requirements. Each element: dtype(fma(float(x), scale, float(y))), one
// rounding (ATen's y.add_(x * g) rounds the product first).
bool AddScaledByDeviceScalar(Dtype dtype, void* y, const void* x, int64_t n, const float* scale,
                             void* stream);

// ---------------------------------------------------------------------------
// Rotary embedding of a fused q/k/v projection, rotate_half convention
// (transformers' apply_rotary_pos_emb): qkv [tokens, q_heads + 2 *
// kv_heads, head_dim] contiguous, q heads, then k heads, then v heads;
// cos/sin [tokens, rotary_dim] contiguous in the same dtype.
// Forward: out = qkv with the first rotary_dim features of every q and k
// head rotated (fp32 arithmetic, one rounding) and the v heads copied.
// Backward: the transposed rotation (the rotation by -sin) of dq (fp32
// [tokens, q_heads, head_dim]) and dk (fp32 [tokens, kv_heads, head_dim]),
// and dv (fp32 [tokens, kv_heads, head_dim]) copied, written as d_qkv in
// the dtype, laid out as qkv. Requires head_dim % 8 == 0, rotary_dim even
// and <= head_dim.
bool RopeQkvForward(Dtype dtype, const void* qkv, void* out, int64_t tokens, int64_t q_heads,
                    int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, const void* cos,
                    const void* sin, void* stream);
bool RopeQkvBackward(Dtype dtype, const float* dq, const float* dk, const float* dv, void* d_qkv,
                     int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                     int64_t rotary_dim, const void* cos, const void* sin, void* stream);

// ---------------------------------------------------------------------------
// TTT attention's diagonal keys: at TTT step j the query at t also attends
// to the keys of steps 1..j at t. The causal block over the step-0 keys
// comes from flash attention as (o_blk, lse_blk); these kernels merge the
// diagonal keys into it through the log-sum-exp and give their backward.
//
// Layouts: q is the q part of a roped qkv tensor, element (t, h, d) at
// q + t * qkv_row + h * head_dim + d; key i (i < num_diag) likewise at
// keys[i] + t * qkv_row + kvh * head_dim + d and value i at values[i] + ...
// (the k and v parts of step i's roped qkv); query head h reads kv head
// h / (q_heads / kv_heads). o and o_blk are [tokens, q_heads, head_dim]
// contiguous; lse and lse_blk are fp32 [q_heads, tokens] (flash
// attention's varlen layout).
constexpr int kMaxDiagKeys = 16;
struct DiagKeys {
  const void* keys[kMaxDiagKeys];
  const void* values[kMaxDiagKeys];
  int num_diag = 0;
};
struct TttAttentionShape {
  int64_t tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t qkv_row = 0;  // elements between a token's rows of qkv
  float scale = 1.f;    // softmax scale (1 / sqrt(head_dim))
};
// s_i = scale * q . k_i, lse = log(exp(lse_blk) + sum_i exp(s_i)),
// o = dtype(exp(lse_blk - lse) * o_blk + sum_i exp(s_i - lse) * v_i).
// Requires head_dim a multiple of 32 up to 256, num_diag in [1, 16].
bool TttDiagForward(Dtype dtype, const TttAttentionShape& shape, const void* q,
                    const DiagKeys& diag, const void* o_blk, const float* lse_blk, void* o,
                    float* lse, void* stream);
// Backward of the merge, given do_ (contiguous like o) and the merged o and
// lse: with D = do . o and p_i = exp(s_i - lse), ds_i = p_i (do . v_i - D):
//   dq = dq_blk + scale * sum_i ds_i k_i                       (fp32 out)
//   dk_i += scale * sum over the query heads of kv head: ds_i q  (fp32 accumulators)
//   dv_i += sum over the query heads of kv head: p_i do          (fp32 accumulators)
// dq_blk is flash attention's dq (dtype, [tokens, q_heads, head_dim]);
// dk[i] and dv[i] are fp32 [tokens, kv_heads, head_dim] contiguous. With
// num_diag 0 it converts dq_blk to fp32. `scratch` is fp32 [2, 16,
// tokens, q_heads] (TttDiagScratchFloats).
int64_t TttDiagScratchFloats(const TttAttentionShape& shape);
bool TttDiagBackward(Dtype dtype, const TttAttentionShape& shape, const void* q,
                     const DiagKeys& diag, const void* o, const float* lse, const void* do_,
                     const void* dq_blk, float* dq, float* const* dk, float* const* dv,
                     float* scratch, void* stream);

// ---------------------------------------------------------------------------
// Soft cross-entropy of draft logits against the target distribution, with
// the gradient written over the logits (the loss is the graph's end, so
// its gradient is known in the forward; the logits are read twice and
// never stored in fp32). For row r of logits [rows, cols] (row stride
// cols), its weight w = row_weight[r], its gradient scale
// s = row_grad_scale[r] and its target row t = target_row[r] of
// target_logits (fp32 [*, cols]) with target_lse[t] that row's own
// log-sum-exp, p = exp(target - lse_t) (so sum_v p_v = 1, which the kernel
// takes as exact):
//   loss[r]   = -w * sum_v p_v (z_v - lse(z))
//   argmax[r] = the first index of max z (at::argmax's choice)
//   z        <- dtype(s * w * (softmax(z) * sum_v p_v - p))
// Rows of weight 0 read no target (target_row may be anything there) and
// get a zero gradient. Requires cols % 8 == 0 and 16-byte aligned rows.
//
// With `acceptance` (the LK losses, student_trainer/step/ttt_step.h) the row also
// gets the expected acceptance rate of a draft token drawn from
// q = softmax(z) against the target's full-vocabulary probabilities
// P = p * exp(target_log_mass[t]):
//   alpha[r] = sum_v min(P_v, q_v)          (0 in rows of weight 0)
// and, unless !write_grad (then z is left as it is), the gradient gains
// a * w * d alpha / dz_u = a * w * q_u ([q_u < P_u] - S), S = sum_v [q_v < P_v] q_v
// (ties count one half, as at::minimum's gradient), a = acc_grad_scale[r],
// divided by alpha in log_form (the gradient of log alpha; 0 where alpha is 0).
struct AcceptanceArgs {
  const float* target_log_mass = nullptr;  // [target rows]
  const float* acc_grad_scale = nullptr;   // [rows]
  bool log_form = false;
  bool write_grad = true;
  float* alpha = nullptr;  // [rows] out
};
//
// `row_runs` (optional): the rows are runs, one per TTT step, of the same
// positions, so that the runs' i-th rows read neighbouring target rows
// (t + j + 1 for step j). The kernel then visits row i of every run before
// row i + 1 of any, so each target row comes from memory once and from L2
// for the other runs. The order changes no result. The lengths must sum to
// rows; more than kMaxRowRuns runs are refused.
constexpr int kMaxRowRuns = 16;
struct RowRuns {
  int count = 0;
  int64_t length[kMaxRowRuns] = {};
};
bool SoftCrossEntropy(Dtype dtype, void* logits, int64_t rows, int64_t cols,
                      const float* target_logits, const float* target_lse,
                      const int64_t* target_row, const float* row_weight,
                      const float* row_grad_scale, float* loss, int64_t* argmax,
                      const AcceptanceArgs* acceptance, const RowRuns* row_runs, void* stream);

// The target distribution's row statistics in one read of its fp32 logits
// x [rows, cols] (row stride cols): lse[r] = log sum_v exp x_v and
// argmax[r] = the first index of the row's max (at::argmax's choice for
// rows without NaN). Requires cols % 8 == 0 and 16-byte aligned rows.
bool RowLogSumExpArgmax(const float* x, int64_t rows, int64_t cols, float* lse, int64_t* argmax, void* stream);

// ---------------------------------------------------------------------------
// AdamW over flat buffers, as torch.optim.AdamW computes it (decoupled
// weight decay, bias corrections), with global-norm clipping folded in and
// every scalar read on the device, so a step needs no host synchronisation.
//
// GradSquaredNormPartials: partial[b] = sum of grad^2 over block b's share,
// fp32 [AdamWNormBlocks(n)]; the caller sums the partials in a fixed order.
// The gradients are fp32 (grad_fp32) or of grad_dtype.
int64_t AdamWNormBlocks(int64_t n);
bool GradSquaredNormPartials(Dtype grad_dtype, bool grad_fp32, const void* grad, int64_t n,
                             float* partial, void* stream);
struct AdamWScalars {
  const float* lr;         // device: this step's learning rate
  const float* step;       // device: this step's count (1 for the first)
  const float* grad_norm;  // device: the global grad norm, or null (no clipping)
  float max_norm = 0.f;    // clip to this norm (with grad_norm)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
};
// grad is fp32 (grad_fp32) or of the working dtype; work (may be null)
// receives work_dtype(master) after the update.
bool AdamWStep(Dtype work_dtype, bool grad_fp32, const void* grad, float* master, float* exp_avg,
               float* exp_avg_sq, void* work, int64_t n, const AdamWScalars& scalars, void* stream);

// ---------------------------------------------------------------------------
// The softmax of one chunk of DFlash's block attention, context part
// (student_trainer/ops/dflash_block_attention.h): `rows` score rows of
// `keys` fp32 values each (contiguous, the GEMM's output q k^T, unscaled),
// row i seeing keys [0, limits[i % period]) and no other (limits int64).
// Forward: lse[i] = log sum over seen j of exp(scale * s[i, j]) (-inf for
// a row that sees none) and probs[i, j] = dtype(exp(scale * s[i, j] -
// lse[i])) where seen, 0 elsewhere.
// Backward, given dp = dout v^T (fp32, same layout) and per row the merged
// log-sum-exp lse and delta = rowsum(dout * out): with P = exp(scale * s
// - lse) where seen, 0 elsewhere, probs = dtype(P) and dscores = dtype(P *
// (dp - delta) * scale).
bool DFlashChunkSoftmaxForward(Dtype dtype, const float* scores, const int64_t* limits, int64_t period,
                               int64_t rows, int64_t keys, float scale, void* probs, float* lse, void* stream);
bool DFlashChunkSoftmaxBackward(Dtype dtype, const float* scores, const float* dp, const float* lse,
                                const float* delta, const int64_t* limits, int64_t period, int64_t rows, int64_t keys,
                                float scale, void* probs, void* dscores, void* stream);

// ---------------------------------------------------------------------------
// DFlash block attention, context part, flash-style
// (student_trainer/ops/dflash_block_attention.h): the B query rows of block
// i under every query head see the context rows [context_begin[i],
// context_end[i]) of their key/value head, and no score or probability
// leaves the chip. q and dout are [blocks * B, q_heads, D], k and v
// [context_rows, kv_heads, D], all contiguous in the dtype; lse, delta are
// fp32 [blocks * B, q_heads]; out, dq fp32 [blocks * B, q_heads, D]; dk, dv
// fp32 [context_rows, kv_heads, D].
struct DFlashContextShape {
  int64_t blocks = 0, block_size = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t context_rows = 0;  // T
  int64_t key_tiles = 0;     // key tiles the backward visits: ceil(max context_end / kDFlashBackwardKeyTile)
  float scale = 1.f;         // softmax scale
};
// The backward's tiles of context rows: tile j is rows [j * kDFlashBackwardKeyTile, (j + 1) * kDFlashBackwardKeyTile).
constexpr int64_t kDFlashBackwardKeyTile = 128;
// Device int32 arrays: context_begin, context_end [blocks]; for key tile j,
// tile_first_block[j] and tile_end_block[j] bound
// a run of blocks that holds every block whose context meets the tile
// (first == end: none).
struct DFlashContextBlocks {
  const int32_t* context_begin = nullptr;
  const int32_t* context_end = nullptr;
  const int32_t* tile_first_block = nullptr;
  const int32_t* tile_end_block = nullptr;
};
// The kernels take head_dim 64 or 128 and (q_heads / kv_heads) * B a
// multiple of 16 up to 128.
bool DFlashContextAttentionTakes(const DFlashContextShape& shape);
// Forward: for each row with context, out = softmax(scale q k^T) v over
// its keys (fp32 accumulators, P rounded to the dtype before the product)
// and lse its log-sum-exp; rows without context are left as they are (the
// caller's zeros and -inf).
bool DFlashContextForward(Dtype dtype, const DFlashContextShape& shape, const DFlashContextBlocks& blocks,
                          const void* q, const void* k, const void* v, float* out, float* lse, void* stream);
// Backward, given the merged lse and delta = rowsum(dout * out): with P =
// exp(scale q k^T - lse) and dS = P (dout v^T - delta), rounded to the
// dtype before their products,
//   dq += scale * dS k,   dk += scale * dS^T q,   dv += P^T dout
// (GQA: dk, dv sum over the query heads of their key/value head).
// Deterministic: every output element has one writer.
bool DFlashContextBackward(Dtype dtype, const DFlashContextShape& shape, const DFlashContextBlocks& blocks,
                           const void* q, const void* k, const void* v, const void* dout, const float* lse,
                           const float* delta, float* dq, float* dk, float* dv, void* stream);

}  // namespace e3::kernels

#endif  // E3_KERNELS_STUDENT_OPS_H_
