// How a tensor-parallel forward splits its batch in two, so that one half's
// all-reduce runs while the other half computes (SGLang's two-batch
// overlap, here for the two reductions per layer of a TP teacher).
//
// Each all-reduce sits on the critical path of an unsplit forward: the next
// norm needs the summed product. With two micro-batches A and B the ranks
// issue, per layer: A's attention, A's reduction (on NCCL's stream), B's
// attention while A's reduction runs, B's reduction, A's MLP once A's
// reduction is done, and so on. The split is at a sample boundary (packed
// samples attend only to themselves, so each half is a batch of its own)
// and every rank computes the same split from the same offsets.
#ifndef E3_TEACHER_SERVER_PARALLEL_MICRO_BATCHES_H_
#define E3_TEACHER_SERVER_PARALLEL_MICRO_BATCHES_H_

#include <cstdint>
#include <vector>

namespace e3 {

// The sample index k at which the batch with offsets `cu_seqlens` (B + 1
// entries, from 0) splits into samples [0, k) and [k, B): the boundary
// whose token count is nearest half the batch (the lower one on a tie).
// 0, for no split, when the batch has fewer than two samples, min_tokens
// is 0 or below, or either half would hold fewer than min_tokens tokens
// (small halves lose more GEMM efficiency than the overlap gains).
int64_t OverlapSplitPoint(const std::vector<int64_t>& cu_seqlens, int64_t min_tokens);

// How many forwards of this process ran as two overlapped micro-batches
// (counted by the model; for tests and logs).
int64_t OverlappedForwards();
void CountOverlappedForward();

// cu_seqlens[begin..end] rebased to start at 0: the offsets of samples
// [begin, end) as a batch of their own.
std::vector<int64_t> SampleRangeOffsets(const std::vector<int64_t>& cu_seqlens, int64_t begin, int64_t end);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_PARALLEL_MICRO_BATCHES_H_
