#include "teacher_server/models/forward_graphs.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#ifdef E3_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace e3 {
namespace {

std::atomic<int64_t> g_captures{0};
std::atomic<int64_t> g_replays{0};

int64_t RoundUp(int64_t x, int64_t step) { return (x + step - 1) / step * step; }

// Sample slots of a ragged graph come in eights and its longest-sample bound
// in 128s (the varlen kernel's query block), so that near budgets share one.
constexpr int64_t kSlotStep = 8;
constexpr int64_t kSeqlenStep = 128;

// Budgets seen but not captured, and budgets found not to pay, are each
// remembered up to this many, then forgotten together (a server's ragged
// batches could otherwise grow the maps without end).
constexpr size_t kMaxSightings = 4096;

}  // namespace

GraphBatchPlan PlanGraphBatch(const std::vector<int64_t>& cu_seqlens, int64_t token_step) {
  GraphBatchPlan plan;
  const int64_t samples = static_cast<int64_t>(cu_seqlens.size()) - 1;
  const int64_t T = cu_seqlens.back();
  // The longest sample and uniformity as the attention layout sees them
  // (on the CPU no device offsets are made).
  const PackedLayout layout = MakePackedLayout(cu_seqlens, at::kCPU, AttentionKernel::kSdpa);
  const int64_t longest = layout.max_seqlen;
  plan.uniform = layout.uniform;
  if (plan.uniform) {
    plan.tokens = T;
    plan.max_seqlen = longest;
    plan.cu_seqlens = cu_seqlens;
    plan.key = absl::StrCat("uniform ", samples, "x", longest);
    return plan;
  }
  plan.tokens = RoundUp(T, std::max<int64_t>(token_step, 1));
  const int64_t slots = RoundUp(samples + 1, kSlotStep);
  plan.cu_seqlens = cu_seqlens;
  plan.cu_seqlens.resize(slots + 1, plan.tokens);  // the padding sample [T, tokens), then empty ones
  plan.max_seqlen = std::min(RoundUp(std::max(longest, plan.tokens - T), kSeqlenStep), plan.tokens);
  plan.key = absl::StrCat("ragged ", plan.tokens, " tokens, ", slots, " slots, samples <= ", plan.max_seqlen);
  return plan;
}

#ifdef E3_HAS_CUDA

namespace {

// What else, besides the batch's shape, fixes a graph's work.
std::string OptionsKey(const ForwardOptions& options) {
  return absl::StrCat(" aux ", absl::StrJoin(options.aux_layer_ids, ","), options.return_argmax ? " argmax" : "");
}

}  // namespace

struct ForwardGraphs::Graph {
  at::cuda::CUDAGraph graph;
  GraphBatchPlan plan;
  at::Tensor ids, positions, cu_seqlens;  // inputs the graph reads (outside its pool)
  ForwardOutput out;                      // outputs it writes (in the pool)
};

#else

struct ForwardGraphs::Graph {};

#endif

ForwardGraphs::ForwardGraphs(at::Device device, int64_t token_step, int max_graphs, double min_host_share)
    : device_(device),
      token_step_(std::max<int64_t>(token_step, 1)),
      max_graphs_(max_graphs),
      min_host_share_(min_host_share) {}

ForwardGraphs::~ForwardGraphs() = default;

std::optional<ForwardOutput> ForwardGraphs::Run(const PackedBatch& batch, const ForwardOptions& options,
                                                const RunFn& run) {
#ifdef E3_HAS_CUDA
  // CUDA graphs capture CUDA work only; a CUDA build also runs CPU models.
  if (!device_.is_cuda()) return std::nullopt;
  if (options.return_logits || max_graphs_ <= 0 || batch.num_samples() < 1) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (disabled_) return std::nullopt;
  GraphBatchPlan plan = PlanGraphBatch(batch.cu_seqlens, token_step_);
  const std::string key = plan.key + OptionsKey(options);
  auto it = graphs_.find(key);
  const c10::cuda::CUDAGuard device_guard(device_);
  const int64_t T = batch.num_tokens();

  // The batch's inputs into a graph's buffers, in stream order.
  auto copy_in = [&](Graph* g) {
    g->ids.narrow(0, 0, T).copy_(batch.input_ids, /*non_blocking=*/true);
    g->positions.narrow(0, 0, T).copy_(batch.position_ids, /*non_blocking=*/true);
    if (!g->plan.uniform) {
      g->cu_seqlens.copy_(PinnedCuSeqlens(plan.cu_seqlens), /*non_blocking=*/true);
    }
  };

  if (it == graphs_.end()) {
    if (static_cast<int>(graphs_.size()) >= max_graphs_ || eager_.count(key) > 0) return std::nullopt;
    if (sightings_.size() >= kMaxSightings) sightings_.clear();
    const int sighting = ++sightings_[key];
    if (sighting < 2) return std::nullopt;
    if (sighting == 2) {
      // The deciding run: eager, timed, synchronised once.
      const auto t0 = std::chrono::steady_clock::now();
      ForwardOutput out =
          run(batch, MakePackedLayout(batch.cu_seqlens, device_, AttentionKernel::kFlashVarlen), options);
      const auto t1 = std::chrono::steady_clock::now();
      at::cuda::getCurrentCUDAStream(device_.index()).synchronize();
      const double issue = std::chrono::duration<double>(t1 - t0).count();
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (issue < min_host_share_ * wall) {
        if (eager_.size() >= kMaxSightings) eager_.clear();
        eager_.insert(key);
        sightings_.erase(key);
      }
      return out;
    }
    auto g = std::make_unique<Graph>();
    g->plan = plan;
    try {
      const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(device_);
      // Zeros: the padding tokens' ids and positions must be valid before
      // any batch has written them.
      g->ids = at::zeros({plan.tokens}, longs);
      g->positions = at::zeros({plan.tokens}, longs);
      const int64_t n = static_cast<int64_t>(plan.cu_seqlens.size());
      g->cu_seqlens = at::empty({n}, longs.dtype(at::kInt));
      if (plan.uniform) g->cu_seqlens.copy_(PinnedCuSeqlens(plan.cu_seqlens));  // fixed: once
      copy_in(g.get());
      Capture(g.get(), plan, options, run);
    } catch (const c10::OutOfMemoryError& e) {
      // No room for this budget's graph now (its buffers, or the warm-up):
      // it stays eager, other budgets keep their graphs.
      if (eager_.size() >= kMaxSightings) eager_.clear();
      eager_.insert(key);
      sightings_.erase(key);
      std::fprintf(stderr, "cuda graphs: out of memory capturing the forward of %s; it runs eagerly\n", key.c_str());
      return std::nullopt;
    } catch (const c10::Error& e) {
      // A forward that cannot be captured is a bug to report, not a reason
      // to fail batches: every later batch runs eagerly.
      disabled_ = true;
      std::fprintf(stderr, "cuda graphs: capturing the forward (%s) failed, running eagerly from now on: %s\n",
                   key.c_str(), std::string(e.what_without_backtrace()).substr(0, 400).c_str());
      return std::nullopt;
    }
    sightings_.erase(key);
    std::fprintf(stderr, "cuda graphs: captured the forward of %s\n", key.c_str());
    it = graphs_.emplace(key, std::move(g)).first;
  } else {
    copy_in(it->second.get());
  }
  Graph& g = *it->second;
  g.graph.replay();
  g_replays.fetch_add(1, std::memory_order_relaxed);
  auto cut = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, 0, T).clone() : at::Tensor(); };
  ForwardOutput out;
  out.aux_hidden = cut(g.out.aux_hidden);
  out.last_hidden = cut(g.out.last_hidden);
  out.target_argmax = cut(g.out.target_argmax);
  return out;
#else
  (void)batch;
  (void)options;
  (void)run;
  return std::nullopt;
#endif
}

void ForwardGraphs::Capture(Graph* g, const GraphBatchPlan& plan, const ForwardOptions& options, const RunFn& run) {
#ifdef E3_HAS_CUDA
  PackedBatch batch;
  batch.input_ids = g->ids;
  batch.position_ids = g->positions;
  batch.cu_seqlens = plan.cu_seqlens;
  PackedLayout layout;
  layout.cu_seqlens = plan.cu_seqlens;
  layout.max_seqlen = plan.max_seqlen;
  layout.uniform = plan.uniform;
  layout.cu_seqlens_device = g->cu_seqlens;

  // Graphs are captured on a side stream (never the default one), after
  // the work already queued on the current stream.
  at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream(device_.index());
  at::cuda::CUDAStream side = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(side);
  // Later work on the current stream waits for the side stream's, also when
  // the capture fails: the graph's input buffers, which the side stream
  // reads, are then freed into the current stream's pool for reuse.
  auto join_side = [&] {
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
  };
  try {
    const c10::cuda::CUDAStreamGuard stream_guard(side);
    // One eager run first: cuBLASLt's heuristics, cuDNN's plans and lazily
    // loaded kernels are set up outside the capture.
    (void)run(batch, layout, options);
    // Thread-local mode: the server's other threads (senders, gRPC) may use
    // CUDA meanwhile; only this thread's calls are checked.
    g->graph.capture_begin(at::cuda::MempoolId_t(pool_), cudaStreamCaptureModeThreadLocal);
    try {
      g->out = run(batch, layout, options);
    } catch (...) {
      try {
        g->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    g->graph.capture_end();
  } catch (...) {
    try {
      join_side();
    } catch (...) {
    }
    throw;
  }
  if (pool_.first == 0 && pool_.second == 0) pool_ = g->graph.pool();
  join_side();
  g_captures.fetch_add(1, std::memory_order_relaxed);
#else
  (void)g;
  (void)plan;
  (void)options;
  (void)run;
#endif
}

int64_t CudaGraphCaptures() { return g_captures.load(std::memory_order_relaxed); }
int64_t CudaGraphReplays() { return g_replays.load(std::memory_order_relaxed); }

}  // namespace e3
