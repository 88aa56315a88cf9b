// Epoch plans: each epoch's sample order cut into global batches for the
// students' world, computed once per epoch and world, and cursors kept
// inside them.
#include "teacher_server/engine/engine.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"

namespace e3 {

BatcherOptions Engine::BatcherFor(int world) const {
  BatcherOptions b;
  b.max_tokens = options_.tokens_per_batch * world;
  b.max_samples = options_.max_samples_per_batch * world;
  b.oversize = OversizePolicy::kOwnBatch;  // a long sample runs alone rather than failing mid-epoch
  return b;
}

const std::vector<GlobalBatch>& Engine::PlanLocked(int64_t epoch) {
  auto it = plans_.find(epoch);
  if (it != plans_.end()) return it->second;
  std::vector<int64_t> order = EpochOrder(dataset_->size(), options_.seed, epoch);
  auto batches = PackBatches(order, lengths_, BatcherFor(world_), epoch);
  // kOwnBatch cannot fail on valid lengths; an empty plan would stall, so
  // fall back to one sample per batch rather than crash.
  std::vector<GlobalBatch> plan;
  if (batches.ok()) {
    plan = std::move(batches).value();
  } else {
    std::fprintf(stderr, "teacher: batching failed (%s); one sample per batch\n",
                 std::string(batches.status().message()).c_str());
    for (size_t i = 0; i < order.size(); ++i) {
      plan.push_back({epoch, static_cast<int64_t>(i), {order[i]}, lengths_[order[i]]});
    }
  }
  return plans_.emplace(epoch, std::move(plan)).first->second;
}

Cursor Engine::NormalizeLocked(Cursor c) {
  while (c.epoch < options_.epochs && c.next_batch >= static_cast<int64_t>(PlanLocked(c.epoch).size())) {
    c = {c.epoch + 1, 0};
  }
  return c;
}

int Engine::world_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return world_;
}

int64_t Engine::batches_per_epoch(int world) const {
  std::vector<int64_t> order = EpochOrder(dataset_->size(), options_.seed, 0);
  auto batches = PackBatches(order, lengths_, BatcherFor(world), 0);
  return batches.ok() ? static_cast<int64_t>(batches->size()) : dataset_->size();
}

}  // namespace e3
