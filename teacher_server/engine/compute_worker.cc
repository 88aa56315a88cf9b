// The compute worker: picks the subscriber with credit whose next batch is
// due, runs the model over it and stages what that subscriber reads (its
// layers and tensors) as the payload on its transport.
#include "teacher_server/engine/engine.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "teacher_server/models/aux_capture.h"

namespace e3 {
namespace {

// How often the worker wakes to reclaim dead subscribers when idle.
constexpr auto kIdleWake = std::chrono::milliseconds(100);

PayloadSource SourceOf(const std::string& name, const at::Tensor& t, DType dtype) {
  return {name, dtype, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr(),
          static_cast<size_t>(t.numel()) * DTypeSize(dtype)};
}

}  // namespace

bool Engine::PickWork(Work* work) {
  int best = -1;
  size_t best_load = 0;
  for (auto& [r, st] : ranks_) {
    if (!st.attached || AtEndLocked(st.next_compute)) continue;
    if (st.computing) continue;
    size_t load = st.ready.size() + st.unacked.size();
    if (load >= static_cast<size_t>(st.credit_window)) continue;
    if (best < 0 || load < best_load) {
      best = r;
      best_load = load;
    }
  }
  if (best < 0) return false;
  RankState& st = ranks_[best];
  work->rank = best;
  work->generation = st.generation;
  work->cursor = st.next_compute;
  work->transport = st.transport;
  work->features = st.features;
  st.computing = true;
  st.next_compute = NormalizeLocked({st.next_compute.epoch, st.next_compute.next_batch + 1});
  return true;
}

void Engine::WorkerLoop() {
  while (true) {
    Work work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return;
      const absl::Time now = absl::Now();
      for (auto& [r, st] : ranks_) {
        if (!st.attached && (!st.ready.empty() || !st.unacked.empty()) &&
            now - st.detached_at >= options_.subscriber_timeout) {
          ReclaimLocked(st);
          (void)ledger_.RecordEvent(absl::StrCat("{\"event\":\"reclaim\",\"rank\":", r, "}"));
        }
      }
      if (draining_ || !PickWork(&work)) {
        cv_.wait_for(lock, kIdleWake);
        continue;
      }
    }
    const int rank = work.rank;
    const uint64_t generation = work.generation;
    const Cursor& cursor = work.cursor;
    auto batch = Compute(work);
    std::function<void()> notify;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = ranks_.find(rank);
      if (it != ranks_.end() && it->second.generation == generation) it->second.computing = false;
      if (!batch.ok()) {
        std::fprintf(stderr, "teacher: batch %ld:%ld for rank %d failed: %s\n", static_cast<long>(cursor.epoch),
                     static_cast<long>(cursor.next_batch), rank, std::string(batch.status().message()).c_str());
        // Retry the same batch later rather than skip it: skipping would
        // lose samples. A persistent failure shows in the log and metrics.
        if (it != ranks_.end() && it->second.generation == generation && cursor < it->second.next_compute) {
          it->second.next_compute = cursor;
        }
      } else if (it != ranks_.end() && it->second.generation == generation) {
        it->second.ready.push_back(std::move(batch).value());
      }
      // Notify even on failure-free empty results: the end of data may now
      // be sendable.
      if (it != ranks_.end() && it->second.generation == generation) notify = it->second.notify;
    }
    if (!batch.ok()) {
      std::this_thread::sleep_for(kIdleWake);
      continue;
    }
    if (notify) notify();
  }
}

absl::StatusOr<Engine::FeatureTensors> Engine::ComputeFeatures(const std::vector<std::vector<int32_t>>& samples,
                                                               const BatchFeatures& features, bool device_payload) {
  const int64_t H = model_->config().hidden_size;
  const int64_t captured = static_cast<int64_t>(options_.aux_layer_ids.size());
  const int64_t k = static_cast<int64_t>(features.aux_positions.size());
  FeatureTensors out;
  try {
    if (samples.empty()) {
      const auto options = torch::TensorOptions().dtype(model_->options().dtype);
      out.aux = torch::empty({0, k * H}, options);
      out.last = torch::empty({0, H}, options);
      out.argmax = torch::empty({0}, torch::kInt);
      return out;
    }
    E3_ASSIGN_OR_RETURN(PackedBatch batch, PackSamples(samples, model_->config().vocab_size, model_->options().device));
    // Every forward captures the same layers (one CUDA graph per token
    // budget serves every subscriber); the argmax only where it is read.
    ForwardOptions fwd;
    fwd.aux_layer_ids = options_.aux_layer_ids;
    fwd.return_argmax = features.target_argmax;
    auto t0 = std::chrono::steady_clock::now();
    E3_ASSIGN_OR_RETURN(ForwardOutput fo, model_->Forward(batch, fwd));
    // Device transports copy straight from GPU memory; host transports
    // need the states on the CPU. The subscriber's layers are picked out
    // where the forward left them, so only they are copied.
    const at::Device dst = device_payload ? fo.last_hidden.device() : at::Device(at::kCPU);
    if (k > 0) out.aux = SelectAuxStates(fo.aux_hidden, captured, features.aux_positions).to(dst).contiguous();
    if (features.last_hidden) out.last = fo.last_hidden.to(dst).contiguous();
    if (features.target_argmax) out.argmax = fo.target_argmax.to(dst, at::kInt).contiguous();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    stats_.forward_seconds += secs;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("forward failed: ", e.what_without_backtrace()));
  }
  return out;
}

absl::StatusOr<ReadyBatch> Engine::Compute(const Work& work) {
  GlobalBatch g;
  int world;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g = PlanLocked(work.cursor.epoch)[work.cursor.next_batch];
    world = world_;
  }
  ReadyBatch out;
  out.rank = work.rank;
  out.epoch = work.cursor.epoch;
  out.index = work.cursor.next_batch;
  out.batch_id = BatchIdOf(work.cursor.epoch, work.cursor.next_batch, work.rank);
  for (size_t i = static_cast<size_t>(work.rank); i < g.sample_ids.size(); i += world) {
    out.sample_ids.push_back(g.sample_ids[i]);
  }

  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<int32_t> cu{0};
  std::vector<std::vector<int32_t>> samples;
  for (int64_t s : out.sample_ids) {
    const Sample& sample = (*dataset_)[s];
    ids.insert(ids.end(), sample.input_ids.begin(), sample.input_ids.end());
    mask.insert(mask.end(), sample.loss_mask.begin(), sample.loss_mask.end());
    cu.push_back(static_cast<int32_t>(ids.size()));
    samples.push_back(sample.input_ids);
  }
  out.num_tokens = static_cast<int64_t>(ids.size());
  const int64_t T = out.num_tokens;
  const TransportKind transport = work.transport;
  const bool device_payload = transport == TransportKind::kNccl || transport == TransportKind::kCudaIpc;
  E3_ASSIGN_OR_RETURN(const DType hidden_dtype, FromScalarType(model_->options().dtype));
  E3_ASSIGN_OR_RETURN(const FeatureTensors f, ComputeFeatures(samples, work.features, device_payload));
  std::vector<PayloadSource> sources = {
      {"input_ids", DType::kI32, {T}, ids.data(), ids.size() * 4},
      {"cu_seqlens", DType::kI32, {static_cast<int64_t>(cu.size())}, cu.data(), cu.size() * 4},
      {"loss_mask", DType::kU8, {T}, mask.data(), mask.size()},
  };
  // Only what the subscriber asked for travels.
  if (!work.features.aux_positions.empty()) sources.push_back(SourceOf("aux_hidden", f.aux, hidden_dtype));
  if (work.features.last_hidden) sources.push_back(SourceOf("last_hidden", f.last, hidden_dtype));
  if (work.features.target_argmax) sources.push_back(SourceOf("target_argmax", f.argmax, DType::kI32));
  if (device_payload) {
    if (device_pool_ == nullptr) {
      const at::Device d = model_->options().device;
      if (!d.is_cuda()) {
        return absl::FailedPreconditionError(absl::StrCat(TransportName(transport), " needs the model on a GPU"));
      }
      E3_ASSIGN_OR_RETURN(device_pool_, DevicePool::Create(d.has_index() ? d.index() : 0));
    }
    E3_ASSIGN_OR_RETURN(auto payload, BuildDevicePayload(transport, sources, *device_pool_));
    out.payload = std::move(payload);
  } else {
    const std::string shm_name = absl::StrCat(shm_segment_names(), out.batch_id);
    E3_ASSIGN_OR_RETURN(auto payload, PayloadBuffer::Build(transport, sources, shm_name));
    out.payload = std::move(payload);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.batches_computed += 1;
  stats_.tokens_computed += T;
  return out;
}

}  // namespace e3
