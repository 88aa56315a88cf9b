// The DFlash draft's attention without the dense mask.
//
// A block's B query rows see two sets of keys: the context rows of their
// sample strictly before the anchor (shared by every block of the
// sample), and the block's own B rows (bidirectional). The plain
// formulation (draft/dflash_draft.h) concatenates all of them and masks a
// [rows, T + rows] score matrix per head, whose size grows with the
// number of blocks times the tokens, and keeps it for the backward.
//
// Here the two sets are separate softmax parts merged by their
// log-sum-exp, as flash attention merges key tiles:
//   context part  on a CUDA device, flash kernels
//                 (kernels/dflash_context_attention.cu): every block walks
//                 tiles of its context rows in shared memory and no score
//                 leaves the chip; elsewhere (CPU, fp64, a head size the
//                 kernels do not take) the blocks in chunks of consecutive
//                 anchors, a chunk's queries against the context rows up
//                 to its last anchor as two GEMMs, its scores never more
//                 than `chunk_scores` elements;
//   block part    every block's B x B scores at once, [blocks, heads, B, B].
// The forward keeps only the output and the merged log-sum-exp; the
// backward recomputes each chunk's scores and takes both parts'
// gradients from the merged values, so memory beyond the inputs is
// O(rows + chunk_scores) for any number of tokens. Queries are grouped by
// their key/value head (GQA without repeating keys or values).
//
// Arithmetic: GEMM operands in the inputs' dtype; scores, softmax and
// accumulated gradients in at least fp32 (fp64 for fp64 inputs, where the
// tests hold it to the plain formulation).
#ifndef E3_STUDENT_TRAINER_OPS_DFLASH_BLOCK_ATTENTION_H_
#define E3_STUDENT_TRAINER_OPS_DFLASH_BLOCK_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/torch/torch_core.h"

namespace e3::ops {

// Where each block's queries look: the B rows of block i see the context
// rows [context_begin[i], context_end[i]) and block i's own B rows. Blocks
// of one sample come in ascending context_end (ascending anchors), which
// keeps a chunk's keys close to what each of its blocks needs.
struct DFlashAttentionBlocks {
  int64_t block_size = 16;
  std::vector<int64_t> context_begin, context_end;
  // T, the context rows there are (0: unknown). Where known, a chunk's keys
  // are padded to a multiple of 64 within them: the padded keys are
  // masked, and the GEMMs over the chunk get aligned rows.
  int64_t context_rows = 0;
  int64_t num_blocks() const { return static_cast<int64_t>(context_end.size()); }
};

struct DFlashAttentionOptions {
  // The most scores (query heads x rows x keys) one chunk computes at
  // once: 2^27, 512 MiB in fp32. A chunk holds at least one block.
  int64_t chunk_scores = int64_t{1} << 27;
  // On a CUDA device, the context part in the flash kernels
  // (kernels/dflash_context_attention.cu: key tiles in shared memory, no
  // score leaves the chip) wherever they take the dtype and the shape;
  // false, or where they decline: the chunks above.
  bool flash = true;
};

// The chunks of one batch's blocks and the flash kernels' index: planned
// once per batch, shared by every layer.
struct DFlashAttentionPlan;
std::shared_ptr<const DFlashAttentionPlan> PlanDFlashAttention(const DFlashAttentionBlocks& blocks,
                                                               int64_t num_heads, const at::Device& device,
                                                               const DFlashAttentionOptions& options = {});

// q [R, Hq, D] (R = blocks * block_size, block by block), k_ctx / v_ctx
// [T, Hkv, D] (the context rows, sample by sample), k_blk / v_blk [R, Hkv,
// D] (the block rows); Hkv divides Hq, and the plan was made for Hq heads.
// Returns [R, Hq, D] in q's dtype, softmax(scale * q k^T) v over each
// row's keys; differentiable with respect to all five inputs.
at::Tensor DFlashBlockAttention(const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx,
                                const at::Tensor& k_blk, const at::Tensor& v_blk,
                                const std::shared_ptr<const DFlashAttentionPlan>& plan, double scale);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_DFLASH_BLOCK_ATTENTION_H_
