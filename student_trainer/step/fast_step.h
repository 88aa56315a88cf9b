// The fast TTT step: the semantics of ttt_step.h (SpecForge v0.2's training
// forward and loss) computed with fused kernels, flash attention and
// batched work. What differs from the reference op sequence, and why:
//
// - Work that does not change across TTT steps is done once. Step j reads
//   the embeddings of ids shifted by j + 1 within samples, so
//   input_layernorm(embed(ids)) and its product with the embedding half of
//   q/k/v's weights are computed once for all T positions (plus one row for
//   the padding id 0) and each step gathers its rows; each step's q/k/v
//   GEMM then covers only the hidden half.
// - The masks, shifts and row lists are planned on the host from host
//   copies of the [T] tensors, and uploaded in one copy: nothing inside
//   the step waits for the device (step_plan.h).
// - q, k and v come from one GEMM, gate and up from one (views of the flat
//   parameters), residual adds ride in the GEMMs, RMSNorm, rope and SiLU-mul
//   are one kernel each way, and weight gradients accumulate in place
//   (ops/linear.h, ops/rms_norm.h, ops/rope_qkv.h, ops/silu_mul.h).
// - Attention never materialises scores (ops/ttt_attention.h).
// - The head and loss run once over all steps' trained rows, with their
//   gradient computed in the forward (ops/draft_head_loss.h); positions no
//   step trains are skipped.
// - From step 1 on the midlayer runs only over positions some later step
//   still trains (TttOptions::skip_untrained_rows): in chat data a prompt
//   token costs one step's midlayer instead of every step's.
//
// On the CPU, or where a kernel declines, every op runs its ATen statement
// of the same math, which the tests hold to the reference path.
#ifndef E3_STUDENT_TRAINER_STEP_FAST_STEP_H_
#define E3_STUDENT_TRAINER_STEP_FAST_STEP_H_

#include "absl/status/statusor.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {

// RunTtt with TttKernels::kFast lands here; the same contract. Weight
// gradients go into draft.flat().grad() (each parameter's .grad() is a view
// of it): call draft.flat().ZeroGrad() between steps.
absl::StatusOr<TttOutput> RunTttFast(Eagle3DraftImpl& draft, const TeacherBatch& batch,
                                     const TttOptions& options);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STEP_FAST_STEP_H_
