#include "teacher_server/engine/engine.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "teacher_server/engine/stale_segments.h"
#include "teacher_server/models/forward_graphs.h"

namespace e3 {

int64_t BatchIdOf(int64_t epoch, int64_t index, int rank) {
  return (epoch * kMaxBatchesPerEpoch + index) * kMaxWorldSize + rank;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(CausalLM* model, const Dataset* dataset,
                                                       EngineOptions options) {
  if (dataset->size() == 0) return absl::InvalidArgumentError(absl::StrCat(dataset->source(), ": no samples"));
  if (options.tokens_per_batch <= 0) return absl::InvalidArgumentError("tokens_per_batch must be positive");
  if (options.epochs <= 0 || options.epochs > kMaxEpochs) {
    return absl::InvalidArgumentError(absl::StrCat("epochs is ", options.epochs, "; expected 1 <= epochs <= ", kMaxEpochs));
  }
  // A plan never has more batches than samples.
  if (dataset->size() >= kMaxBatchesPerEpoch) {
    return absl::InvalidArgumentError(absl::StrCat(dataset->source(), ": ", dataset->size(),
                                                   " samples; batch ids allow fewer than ", kMaxBatchesPerEpoch));
  }
  E3_RETURN_IF_ERROR(CheckAuxLayerIds(options.aux_layer_ids, model->config().num_hidden_layers));
  const int stale = RemoveStaleSegments(options.shm_prefix);
  if (stale > 0) std::printf("teacher: removed %d shm segments of dead teachers\n", stale);
  if (options.student_world_size < 0 || options.student_world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("--student_world_size is ", options.student_world_size,
                                                   "; expected 0 (the first subscriber's) to ", kMaxWorldSize));
  }
  auto engine = std::unique_ptr<Engine>(new Engine(model, dataset, std::move(options)));
  engine->lengths_ = dataset->Lengths();
  E3_RETURN_IF_ERROR(engine->ledger_.Open(engine->options_.ledger_path, dataset->size()));
  engine->next_generation_ = static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  {
    std::lock_guard<std::mutex> lock(engine->mu_);
    E3_RETURN_IF_ERROR(engine->RestoreFromLedgerLocked());
  }
  engine->worker_ = std::thread([e = engine.get()] { e->WorkerLoop(); });
  return engine;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.cuda_graphs = CudaGraphCaptures();
  s.graph_forwards = CudaGraphReplays();
  for (const auto& [r, st] : ranks_) {
    for (const auto& b : st.ready) {
      ++s.buffered_batches;
      if (b.payload) s.buffered_bytes += static_cast<int64_t>(b.payload->total_bytes());
    }
    for (const auto& [id, b] : st.unacked) {
      ++s.buffered_batches;
      if (b.payload) s.buffered_bytes += static_cast<int64_t>(b.payload->total_bytes());
    }
  }
  return s;
}

std::string Engine::shm_segment_prefix() const { return absl::StrCat(options_.shm_prefix, "-", ::getpid(), "-"); }

std::string Engine::shm_segment_names() const { return absl::StrCat(shm_segment_prefix(), options_.shm_group_tag); }

LedgerReport Engine::ledger_report() const {
  // Epochs every rank has committed past count as complete.
  std::lock_guard<std::mutex> lock(mu_);
  int64_t complete = options_.epochs;
  if (ranks_.size() < static_cast<size_t>(std::max(world_, 1))) complete = 0;
  for (const auto& [r, st] : ranks_) complete = std::min(complete, st.committed.epoch);
  return ledger_.Report(complete);
}

absl::StatusOr<EngineOptions> EngineOptions::From(const RunConfig& c, bool cuda) {
  EngineOptions e;
  e.tokens_per_batch = c.schedule.tokens_per_batch;
  e.epochs = c.data.epochs;
  e.seed = c.data.seed;
  e.max_credit_window = static_cast<int>(c.teachers.credit_window);
  e.subscriber_timeout = absl::Seconds(c.teachers.subscriber_timeout_s);
  e.ledger_path = c.teachers.ledger;
  e.student_world_size = static_cast<int>(c.teachers.student_world_size);
  if (c.teachers.transports.empty()) {
    e.transports = DefaultTransports(cuda);
  } else {
    E3_ASSIGN_OR_RETURN(e.transports, ParseTransportList(c.teachers.transports));
  }
  return e;
}

}  // namespace e3
