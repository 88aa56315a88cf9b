// The subscription state machine: subscribe from a cursor (checked
// against the ledger and the stream), hand batches out, take acks and
// commits, reclaim subscribers that went away, and drain.
#include "teacher_server/engine/engine.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"

namespace e3 {

absl::Status Engine::RestoreFromLedgerLocked() {
  const RestoredLedger& r = ledger_.restored();
  world_ = options_.student_world_size;
  if (r.world != 0 && world_ != 0 && r.world != world_) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.ledger_path, ": the ledger records a world of ", r.world, " student ranks, but --student_world_size is ",
        world_, "; a run with another world needs its own --ledger"));
  }
  if (r.world != 0) world_ = r.world;
  if (world_ == 0) return absl::OkStatus();  // positions need the world's batch plan
  for (const auto& [rank, c] : r.delivered) {
    if (rank < 0 || rank >= world_ || c.epoch < 0 || c.next_batch < 0) continue;
    ranks_[rank].delivered_high = NormalizeLocked({c.epoch, c.next_batch});
    ranks_[rank].delivery_known = true;
  }
  if (r.world == 0) return absl::OkStatus();  // commits are restored with the world they confirmed
  for (const auto& [rank, c] : r.committed) {
    if (rank < 0 || rank >= world_ || c.epoch < 0 || c.next_batch < 0) continue;
    // Not attached and generation 0: known, but nobody subscribes it yet.
    ranks_[rank].committed = NormalizeLocked({c.epoch, c.next_batch});
  }
  std::string committed;
  for (const auto& [rank, st] : ranks_) {
    absl::StrAppend(&committed, committed.empty() ? "" : ", ", "rank ", rank, " before ", st.committed.epoch, ":",
                    st.committed.next_batch);
  }
  std::printf("teacher: ledger %s: a world of %d student ranks; committed: %s\n", options_.ledger_path.c_str(),
              world_, committed.empty() ? "nothing yet" : committed.c_str());
  return absl::OkStatus();
}

absl::StatusOr<BatchFeatures> Engine::ResolveFeatures(const std::optional<FeatureRequest>& request) const {
  BatchFeatures f;
  if (!request.has_value()) {
    for (size_t k = 0; k < options_.aux_layer_ids.size(); ++k) f.aux_positions.push_back(static_cast<int64_t>(k));
    return f;
  }
  E3_ASSIGN_OR_RETURN(f.aux_positions, AuxPositions(request->aux_layer_ids, options_.aux_layer_ids));
  f.last_hidden = request->last_hidden;
  f.target_argmax = request->target_argmax;
  return f;
}

DataFingerprint Engine::FingerprintFor(const std::optional<FeatureRequest>& request) const {
  return WithFeaturePlan(options_.fingerprint, request.value_or(EveryFeature(options_.aux_layer_ids)));
}

absl::StatusOr<uint64_t> Engine::Subscribe(const SubscribeParams& p) {
  std::function<void()> superseded_notify;
  auto result = SubscribeImpl(p, &superseded_notify);
  if (superseded_notify) superseded_notify();
  return result;
}

absl::Status Engine::CheckSubscribeLocked(const SubscribeParams& p, int world) {
  if (draining_) return absl::UnavailableError("teacher is draining (shutting down)");
  if (world_ != 0 && world_ != world) {
    const std::string why = options_.student_world_size != 0 ? " (--student_world_size)" : "";
    return absl::FailedPreconditionError(absl::StrCat("this teacher serves a world of ", world_, " student ranks",
                                                      why, "; the subscriber says ", world));
  }
  if (p.resume.epoch < 0 || p.resume.next_batch < 0) {
    return absl::InvalidArgumentError("resume cursor must not be negative");
  }
  if (p.committed.has_value() && p.resume < *p.committed) {
    return absl::InvalidArgumentError("the committed cursor is past the resume cursor");
  }
  const std::string who = absl::StrCat("subscriber \"", p.subscriber_id, "\" (rank ", p.rank, ")'s cursor ",
                                       p.resume.epoch, ":", p.resume.next_batch);
  E3_RETURN_IF_ERROR(CheckSameDataStream(p.fingerprint, FingerprintFor(p.features), who));
  auto it = ranks_.find(p.rank);
  if (world_ != 0 && it != ranks_.end() && it->second.delivery_known &&
      it->second.delivered_high < NormalizeLocked(p.resume)) {
    const Cursor& high = it->second.delivered_high;
    return absl::FailedPreconditionError(absl::StrCat(
        who, " is past every batch this teacher delivered to rank ", p.rank, " (up to ", high.epoch, ":",
        high.next_batch, "): the checkpoint's cursor was edited, or the checkpoint belongs to another run"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Engine::SubscribeImpl(const SubscribeParams& p,
                                                 std::function<void()>* superseded_notify_out) {
  E3_ASSIGN_OR_RETURN(ShardSpec shard, ShardSpec::Create(p.rank, p.world_size));
  E3_ASSIGN_OR_RETURN(BatchFeatures features, ResolveFeatures(p.features));
  std::lock_guard<std::mutex> lock(mu_);
  E3_RETURN_IF_ERROR(CheckSubscribeLocked(p, shard.world()));
  if (world_ == 0) world_ = shard.world();
  RankState& st = ranks_[p.rank];
  // A subscriber resumes where its weights end. Behind the committed
  // cursor, its weights lost batches the ledger counts (an older
  // checkpoint): the record goes back with it. Ahead of it, the batches
  // between were consumed and are in its weights, or will be at its next
  // checkpoint: they stay to be committed, not skipped.
  // Compared as positions: an epoch's end (e, batches) is (e + 1, 0).
  const Cursor resume = NormalizeLocked(p.resume);
  if (resume < st.committed) {
    E3_RETURN_IF_ERROR(ledger_.RecordEvent(absl::StrCat(
        "{\"event\":\"rewind\",\"rank\":", p.rank, ",\"from_epoch\":", st.committed.epoch,
        ",\"from_batch\":", st.committed.next_batch, ",\"to_epoch\":", resume.epoch, ",\"to_batch\":",
        resume.next_batch, "}")));
    st.committed = resume;
  }
  if (p.committed.has_value()) E3_RETURN_IF_ERROR(CommitLocked(p.rank, st, *p.committed));
  ReclaimLocked(st);
  // Wake the superseded stream (if any) so it sees it is superseded and
  // ends, instead of idling until its client gives up.
  *superseded_notify_out = std::move(st.notify);
  st.subscriber_id = p.subscriber_id;
  st.generation = next_generation_++;
  st.attached = true;
  st.credit_window = std::max(1, std::min(p.credit_window, options_.max_credit_window));
  st.transport = p.transport;
  st.features = std::move(features);
  st.next_compute = resume;
  st.acked_end = p.resume;
  st.delivered_end = st.next_compute;
  st.end_sent = false;
  st.final_reported = false;
  st.subscribed_at_end = AtEndLocked(st.next_compute);
  st.computing = false;
  st.notify = nullptr;
  // Informational (the world is restored from commits): not worth refusing for.
  (void)ledger_.RecordEvent(absl::StrCat("{\"event\":\"subscribe\",\"rank\":", p.rank, ",\"world\":", world_,
                                         ",\"subscriber\":\"", p.subscriber_id, "\",\"generation\":",
                                         st.generation, ",\"epoch\":", p.resume.epoch, ",\"batch\":",
                                         p.resume.next_batch, "}"));
  cv_.notify_all();
  return st.generation;
}

void Engine::SetNotifier(int rank, uint64_t generation, std::function<void()> notify) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(rank);
  if (it != ranks_.end() && it->second.generation == generation) it->second.notify = std::move(notify);
}

absl::StatusOr<std::optional<ReadyBatch>> Engine::TakeNext(int rank, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.generation != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, ": a newer subscription of the same rank exists; this one (generation ", generation,
                     ") was superseded"));
  }
  RankState& st = it->second;
  if (!st.ready.empty()) {
    const ReadyBatch& front = st.ready.front();
    // Not handed out unless recorded: the stream ends, and the student's
    // resubscription tries again.
    E3_RETURN_IF_ERROR(ledger_.RecordDelivery(rank, front.epoch, front.index, front.sample_ids));
    ReadyBatch b = std::move(st.ready.front());
    st.ready.pop_front();
    st.unacked[b.batch_id] = b;
    const Cursor after = NormalizeLocked({b.epoch, b.index + 1});
    st.delivered_end = std::max(st.delivered_end, after);
    st.delivered_high = st.delivery_known ? std::max(st.delivered_high, after) : after;
    st.delivery_known = true;
    return std::optional<ReadyBatch>(std::move(b));
  }
  // Draining: hand out what is computed or being computed, then end.
  if (draining_ && !st.computing) return absl::UnavailableError("teacher is draining (shutting down)");
  if (draining_) return std::optional<ReadyBatch>();
  // End only once nothing is left in flight: next_compute advances when the
  // worker starts a batch, not when it finishes.
  if (AtEndLocked(st.next_compute) && !st.computing && !st.end_sent) {
    st.end_sent = true;
    st.knows_end = true;
    ReadyBatch end;
    end.rank = rank;
    end.end_of_data = true;
    end.epoch = options_.epochs;
    return std::optional<ReadyBatch>(std::move(end));
  }
  return std::optional<ReadyBatch>();
}

void Engine::Detach(int rank, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.generation != generation) return;
  it->second.attached = false;
  it->second.knows_end = it->second.knows_end || it->second.subscribed_at_end;
  it->second.detached_at = absl::Now();
  it->second.notify = nullptr;
  cv_.notify_all();
}

void Engine::ReclaimLocked(RankState& st) {
  stats_.reclaimed_batches += static_cast<int64_t>(st.ready.size() + st.unacked.size());
  st.ready.clear();    // payloads (and their shm segments) go with the last reference
  st.unacked.clear();
}

absl::StatusOr<int> Engine::Ack(int rank, const std::string& subscriber_id, const std::vector<int64_t>& batch_ids,
                                std::optional<Cursor> committed) {
  AckParams a;
  a.rank = rank;
  a.subscriber_id = subscriber_id;
  a.batch_ids = batch_ids;
  a.committed = committed;
  return Ack(a);
}

absl::Status Engine::CheckSubscriptionLocked(const AckParams& a, const RankState& st) const {
  if (st.generation == 0) {
    // Known from the ledger only: this process has not seen it subscribe.
    return absl::NotFoundError(absl::StrCat("rank ", a.rank, " has not subscribed to this teacher since it started"));
  }
  if (st.subscriber_id != a.subscriber_id) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", a.rank, " is now subscribed by \"", st.subscriber_id,
                                                      "\", not \"", a.subscriber_id, "\""));
  }
  if (a.generation != 0 && a.generation != st.generation) {
    return absl::AbortedError(absl::StrCat(
        "rank ", a.rank, ": this ack is from subscription generation ", a.generation, " of \"", a.subscriber_id,
        "\", but a newer subscription of the same id exists (generation ", st.generation,
        "); the older subscriber is superseded and may not ack or commit"));
  }
  return absl::OkStatus();
}

absl::Status Engine::CommitLocked(int rank, RankState& st, const Cursor& committed) {
  if (!(st.committed < committed)) return absl::OkStatus();
  // The run's first commit confirms its world: a restarted teacher takes
  // the world back from here, never from subscribers that did not train.
  if (ledger_.restored().world == 0) E3_RETURN_IF_ERROR(ledger_.RecordWorld(world_));
  Cursor c = NormalizeLocked(st.committed);
  while (c < committed && !AtEndLocked(c)) {
    const GlobalBatch& g = PlanLocked(c.epoch)[c.next_batch];
    std::vector<int64_t> share;
    for (size_t i = static_cast<size_t>(rank); i < g.sample_ids.size(); i += world_) share.push_back(g.sample_ids[i]);
    const absl::Status recorded = ledger_.RecordCommit(rank, c.epoch, c.next_batch, share);
    if (!recorded.ok()) {
      st.committed = c;  // as far as the ledger holds
      return recorded;
    }
    c = NormalizeLocked({c.epoch, c.next_batch + 1});
  }
  st.committed = NormalizeLocked(committed);  // {e, N} means {e + 1, 0}
  return absl::OkStatus();
}

absl::StatusOr<int> Engine::Ack(const AckParams& a) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(a.rank);
  if (it == ranks_.end()) return absl::NotFoundError(absl::StrCat("rank ", a.rank, " has no subscription"));
  RankState& st = it->second;
  E3_RETURN_IF_ERROR(CheckSubscriptionLocked(a, st));
  if (a.committed.has_value() && st.delivered_end < NormalizeLocked(*a.committed)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", a.rank, ": commit through ", a.committed->epoch, ":", a.committed->next_batch,
        " names batches this subscription was never delivered (it holds up to ", st.delivered_end.epoch, ":",
        st.delivered_end.next_batch, ")"));
  }
  for (int64_t id : a.batch_ids) {
    auto u = st.unacked.find(id);
    if (u == st.unacked.end()) continue;
    const Cursor after{u->second.epoch, u->second.index + 1};
    if (st.acked_end < after) st.acked_end = after;
    st.unacked.erase(u);
  }
  // What the student acked may be in its next checkpoint: the record of
  // its delivery is on disk before the student can report that cursor.
  E3_RETURN_IF_ERROR(ledger_.SyncDeliveries());
  if (a.committed.has_value()) {
    st.commit_acks += 1;
    E3_RETURN_IF_ERROR(CommitLocked(a.rank, st, *a.committed));
    if (a.final_report) st.final_reported = true;
  }
  cv_.notify_all();
  return std::max(0, st.credit_window - static_cast<int>(st.ready.size() + st.unacked.size()));
}

void Engine::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    // A rank with batches delivered (or acked) beyond its commit can still
    // checkpoint them; one with nothing outstanding has nothing to add.
    for (const auto& [r, st] : ranks_) {
      if (st.attached && (!st.unacked.empty() || st.committed < st.acked_end)) drain_waits_[r] = st.commit_acks;
    }
  }
  cv_.notify_all();
  std::vector<std::function<void()>> notifies;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [r, st] : ranks_) {
      if (st.notify) notifies.push_back(st.notify);
    }
  }
  for (auto& n : notifies) n();
}

bool Engine::DrainSettled() const { return DrainPending() == 0; }

int Engine::DrainWaitedRanks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(drain_waits_.size());
}

int Engine::DrainPending() const {
  std::lock_guard<std::mutex> lock(mu_);
  int pending = 0;
  for (const auto& [r, acks] : drain_waits_) {
    auto it = ranks_.find(r);
    // Settled by the final report, whether it came before the drain (the
    // same signal reached the student sooner) or after, or by any commit
    // since the drain began (a student that does not mark its report).
    if (it != ranks_.end() && !it->second.final_reported && it->second.commit_acks <= acks) ++pending;
  }
  return pending;
}

bool Engine::EveryRankToldTheEnd() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (world_ <= 0) return false;
  for (int r = 0; r < world_; ++r) {
    const auto it = ranks_.find(r);
    if (it == ranks_.end() || !it->second.knows_end) return false;
  }
  return true;
}

}  // namespace e3
