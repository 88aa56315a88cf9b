// The DFlash draft's head and block loss in row chunks: the target's
// frozen full-vocabulary head over the draft's final states, each row's
// loss against its label (a token, or the target's distribution), and the
// block weighting (the distance decay or D-PACE), without ever holding
// more than `chunk_rows` rows of logits.
//
// Only the supervised rows (a label, not the block's anchor) reach the
// head. The loss is the graph's end, so its gradient with respect to the
// states is computed in the forward, chunk by chunk (the head is frozen:
// no weight gradient), and the backward only scales it by the incoming
// gradient. Memory beyond the states is O(chunk_rows * V) for any number
// of blocks. The tests hold it to draft/dflash_draft.h's plain
// formulation (the full logits, DFlashRowNll or DFlashRowSoftCe, and the
// weights of DFlashRowWeights, which that header's losses share).
#ifndef E3_STUDENT_TRAINER_OPS_DFLASH_HEAD_LOSS_H_
#define E3_STUDENT_TRAINER_OPS_DFLASH_HEAD_LOSS_H_

#include <cstdint>

#include "common/torch/torch_core.h"

namespace e3::ops {

enum class DFlashWeighting {
  kDecay,  // row k of a block weighs exp(-(k - 1) / gamma), normalised by the weights' sum
  kDPace,  // each row's detached share in the expected accepted length, per block
};

struct DFlashHeadLossOptions {
  int64_t block_size = 16;
  DFlashWeighting weighting = DFlashWeighting::kDecay;
  double gamma = 7.0;  // kDecay
  double alpha = 0.5;  // kDPace
  int64_t chunk_rows = 2048;
};

struct DFlashHeadLossOutput {
  at::Tensor loss;      // scalar, differentiable with respect to `hidden`
  at::Tensor row_loss;  // [R], at least fp32, no grad: each supervised row's loss against its label, 0 elsewhere
  at::Tensor hits;      // [R] bool: a supervised row's argmax equals its label (false elsewhere)
};

// Each row's weight in the block loss, [R] in row_loss's dtype, without
// gradient: kDecay's exp(-(k - 1) / gamma) normalised over the
// supervised rows (a label, not the anchor), or kDPace's share in the
// expected accepted length (q = exp(-row_loss)) divided by the number of
// blocks. The loss is sum(row_loss * weight).
at::Tensor DFlashRowWeights(const at::Tensor& row_loss, const at::Tensor& labels, const DFlashHeadLossOptions& options);

// hidden [R, H] (R = blocks * block_size, the draft's normalised states in
// block order), head [V, H] frozen, labels [R] int64 (-1: no loss; the
// anchor rows k = 0 count for nothing either). With target_hidden [R, H]
// defined, each row learns the target's distribution softmax(head @
// target_hidden[r]) (its hits still compare with `labels`), else its label
// token. Arithmetic in at least fp32.
DFlashHeadLossOutput DFlashHeadLoss(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& labels,
                                    const at::Tensor& target_hidden, const DFlashHeadLossOptions& options);

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_DFLASH_HEAD_LOSS_H_
