// The rows the draft head trains, in chunks: each TTT step's trained
// positions cut into chunks of about chunk_rows rows (a chunk may span
// steps, a step chunks), gathered into one GEMM's rows per chunk, and
// their outputs and gradients put back in the steps' [T, ...] tensors.
#ifndef E3_STUDENT_TRAINER_OPS_HEAD_ROW_CHUNKS_H_
#define E3_STUDENT_TRAINER_OPS_HEAD_ROW_CHUNKS_H_

#include <cstdint>
#include <vector>

#include "common/torch/torch_core.h"
#include "student_trainer/ops/draft_head_loss.h"

namespace e3::ops {

// A run of one step's trained rows inside a chunk.
struct Segment {
  int64_t step, begin, length;
};

// One chunk of the head's rows: runs of steps' rows, concatenated.
struct Chunk {
  std::vector<Segment> segments;
  // One segment per step, from the same row index of range steps (so their
  // i-th rows read target rows t + j + 1, neighbours): the soft CE visits
  // them interleaved.
  bool interleaved = false;
  std::vector<int64_t> RowRuns() const {
    std::vector<int64_t> runs;
    if (interleaved) {
      for (const Segment& s : segments) runs.push_back(s.length);
    }
    return runs;
  }
};

// Splits the steps' rows into chunks of about `chunk_rows` rows.
// Range steps (long single samples, every position trained) go in
// interleaved chunks: each chunk the same row indices of every step, so
// the steps' soft CE rows that read one target row run together and read
// it from memory once (the target, fp32, has twice the logits' bytes).
// Their rows are gathered into the chunk and their gradient scattered
// back. Other batches: a range step's rows get chunks of their own, of
// near-equal size, so that each chunk is a view of the step's hidden
// states and its gradient is written in place; other steps share chunks
// (a step may span chunks, a chunk several steps).
std::vector<Chunk> Chunks(const std::vector<HeadStepRows>& steps, int64_t chunk_rows);

// The gradient buffer of a step's hidden states: zeros, except that a step
// whose rows are a range leaves those rows unset (every chunk writes them).
at::Tensor StepGradient(const at::Tensor& h, const HeadStepRows& st);

// A chunk's rows of its step's gradient buffer as a view, where the chunk
// is one segment of a range step; else undefined.
at::Tensor ChunkGradientView(const std::vector<Segment>& chunk,
                             const std::vector<HeadStepRows>& steps,
                             const std::vector<at::Tensor>& dh);

// One chunk's rows gathered from the steps' tensors, with their per-row
// data: grad_scale = step_weight / T (the soft CE's), acc_scale =
// step_weight / trained positions (the LK losses' acceptance terms).
struct ChunkRows {
  at::Tensor x, target_rows, row_weight, grad_scale, acc_scale, step_of_row;
};

// The LK losses' normaliser of a step: SpecForge's masked mean clamps the
// count at 1e-8.
double AcceptanceNorm(const HeadStepRows& step);

// Each step's per-row constants over all its rows, made once per call (a
// chunk takes views of them, or one concatenation where it spans steps).
struct StepRowConstants {
  std::vector<at::Tensor> grad_scale, acc_scale, step;
};

StepRowConstants RowConstants(const std::vector<HeadStepRows>& steps, int64_t tokens);

ChunkRows Gather(const std::vector<Segment>& chunk, const std::vector<at::Tensor>& hiddens,
                 const std::vector<HeadStepRows>& steps, const StepRowConstants& k);

// Writes v into a segment's rows of dst (the inverse of SegmentRows).
void PutRows(at::Tensor& dst, const HeadStepRows& st, const Segment& seg, const at::Tensor& v);

// Copies a chunk's rows of `values` into the steps' [T, ...] tensors.
void KeepRows(const std::vector<Segment>& chunk, const std::vector<HeadStepRows>& steps,
                     const at::Tensor& values, std::vector<at::Tensor>* into);

void ScatterRows(const std::vector<Segment>& chunk, const std::vector<HeadStepRows>& steps,
                        const at::Tensor& dx, std::vector<at::Tensor>* dh);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_HEAD_ROW_CHUNKS_H_
