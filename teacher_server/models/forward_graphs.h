// CUDA graphs of whole teacher forwards, one per token budget (the sgl
// backend's ModelOptions::cuda_graphs).
//
// A forward of the sgl backend is ~260 dependent kernels. Issued one by one
// the GPU idles a few microseconds between them, and the host's work at a
// call's start (and the copies it makes) leaves larger gaps. A graph issues
// the whole forward at once. Its shapes and addresses are fixed, so a
// batch runs in the graph of its budget:
// - a batch whose samples all have one length (the cuDNN attention path)
//   gets a graph of exactly its shape;
// - a ragged batch is padded up to a multiple of `token_step` tokens. The
//   padding tokens form one extra sample, so no real token attends to them,
//   and the sample slots and the longest-sample bound are rounded up too
//   (empty samples are free in the varlen kernel). Outputs are cut back to
//   the batch's tokens.
// Graphs pay only where the host's issuing is a large part of a forward:
// large batches gain nothing and ragged ones lose to their padding, while
// small models gain most (bench/results/2026-12-01-teacher-ablation-cuda-graphs.md). So each budget
// decides for itself: the first time it is seen it runs eagerly
// (warm-up); the second time eagerly and timed, and if the host's share
// of that forward (until the last kernel was issued, over the whole
// synchronised call) is below `min_host_share` the budget stays eager for
// good; the third time it is captured. At most `max_graphs` budgets are
// kept; all share one memory pool, since forwards of one model never
// overlap. Every output is copied out of the graph's buffers, which the
// next replay overwrites.
#ifndef E3_TEACHER_SERVER_MODELS_FORWARD_GRAPHS_H_
#define E3_TEACHER_SERVER_MODELS_FORWARD_GRAPHS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/torch/torch_core.h"
#include "teacher_server/layers/attention.h"
#include "teacher_server/models/forward_types.h"

namespace e3 {

// How one batch maps onto a graph's fixed shapes (pure; no GPU needed).
struct GraphBatchPlan {
  bool uniform = false;             // every sample has one length: no padding
  int64_t tokens = 0;               // the graph's token count, >= the batch's
  int64_t max_seqlen = 0;           // the longest-sample bound attention is given
  std::vector<int64_t> cu_seqlens;  // the batch's offsets, then the padding sample and empty slots
  std::string key;                  // equal keys share a graph
};

// cu_seqlens: the batch's B + 1 offsets (validated by MakePackedBatch).
GraphBatchPlan PlanGraphBatch(const std::vector<int64_t>& cu_seqlens, int64_t token_step);

class ForwardGraphs {
 public:
  // The forward to capture: the model's whole computation for a batch and
  // its attention layout, with no host synchronisation inside.
  using RunFn = std::function<ForwardOutput(const PackedBatch&, const PackedLayout&, const ForwardOptions&)>;

  ForwardGraphs(at::Device device, int64_t token_step, int max_graphs, double min_host_share);
  ~ForwardGraphs();

  // The forward through the graph of the batch's budget, capturing it when
  // due, or the timed eager forward that decides whether it is; nullopt
  // when the caller is to run the batch eagerly (a budget seen once or
  // found not to pay or without memory for its graph, the cap reached,
  // logits asked for, or graphs off after a failed capture).
  std::optional<ForwardOutput> Run(const PackedBatch& batch, const ForwardOptions& options, const RunFn& run);

 private:
  struct Graph;
  void Capture(Graph* g, const GraphBatchPlan& plan, const ForwardOptions& options, const RunFn& run);

  const at::Device device_;
  const int64_t token_step_;
  const int max_graphs_;
  const double min_host_share_;
  bool disabled_ = false;
  std::mutex mu_;
  std::map<std::string, int> sightings_;  // budgets seen, not yet captured
  std::set<std::string> eager_;           // budgets whose graph would not pay
  std::map<std::string, std::unique_ptr<Graph>> graphs_;
  std::pair<uint64_t, uint64_t> pool_{0, 0};  // the shared memory pool (at::cuda::MempoolId_t)
};

// Process-wide counts, for tests and logs: graphs captured, and forwards
// that ran as a replay.
int64_t CudaGraphCaptures();
int64_t CudaGraphReplays();

}  // namespace e3

#endif  // E3_TEACHER_SERVER_MODELS_FORWARD_GRAPHS_H_
