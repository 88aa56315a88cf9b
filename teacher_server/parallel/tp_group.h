// The collectives a tensor-parallel teacher needs, over one c10d process
// group (NCCL on GPU, Gloo on CPU). They are called from inside a forward
// pass, whose c10::Error handler turns a failure into a status, so they
// throw c10::Error rather than return one.
#ifndef E3_TEACHER_SERVER_PARALLEL_TP_GROUP_H_
#define E3_TEACHER_SERVER_PARALLEL_TP_GROUP_H_

#include <memory>
#include <vector>

#include "common/torch/process_group.h"
#include "common/torch/torch_core.h"

namespace e3 {

class TpGroup {
 public:
  TpGroup(std::unique_ptr<ProcessGroup> group, int ep_size) : group_(std::move(group)), ep_size_(ep_size) {}

  int rank() const { return group_->rank(); }
  int size() const { return group_->world_size(); }
  int ep_size() const { return ep_size_; }
  ProcessGroup& group() { return *group_; }

  // Sum over ranks, in place. `t` must be contiguous.
  void AllReduceSum(at::Tensor& t);
  // The same sum, started and not waited for: `t` may not be read or
  // written until Finish(returned handle) has run. On NCCL the sum runs on
  // the group's own stream while this thread queues more work; Finish makes
  // the current stream wait for it (the host does not block).
  std::unique_ptr<PendingCollective> StartAllReduceSum(at::Tensor& t);
  void Finish(std::unique_ptr<PendingCollective> pending);
  // Every rank's `t` (same shape on all), in rank order.
  std::vector<at::Tensor> AllGather(const at::Tensor& t);
  // Sum of per-rank embeddings of a vocab-parallel table: rows outside
  // [begin, begin + rows) are zero on this rank.
  at::Tensor VocabParallelEmbedding(const at::Tensor& ids, const at::Tensor& table, int64_t begin);
  // The global argmax over a vocab-parallel product from each rank's own
  // answer over its columns, which start at vocab id `begin`:
  // `local_argmax` [n] (a column of this rank's, from 0) and `local_best`
  // [n] (the logit there). Ties resolve to the lowest id and a NaN wins, as
  // torch's argmax does over the whole row. Two all-gathers of n values,
  // however each rank found its answer.
  at::Tensor VocabParallelArgmax(const at::Tensor& local_argmax, const at::Tensor& local_best, int64_t begin);

 private:
  std::unique_ptr<ProcessGroup> group_;
  int ep_size_;
};

// VocabParallelArgmax's choice once every rank's answer is here: best[r]
// and ids[r] ([n] each) are rank r's logits and global ids, ranks in vocab
// order. Returns int32 [n].
at::Tensor PickVocabParallelArgmax(const std::vector<at::Tensor>& best, const std::vector<at::Tensor>& ids);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_PARALLEL_TP_GROUP_H_
