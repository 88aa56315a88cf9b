// The teacher's engine: dataset -> deterministic batches -> forward ->
// payload buffers, per subscribed rank, computed ahead up to each
// subscriber's credit window. It knows nothing of gRPC: the service layer
// subscribes, takes ready batches, and forwards acks.
#ifndef E3_TEACHER_SERVER_ENGINE_ENGINE_H_
#define E3_TEACHER_SERVER_ENGINE_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config/run_config.h"
#include "common/data/dataset.h"
#include "common/gpu/device_pool.h"
#include "common/stream/data_fingerprint.h"
#include "common/stream/feature_request.h"
#include "common/stream/sample_order.h"
#include "common/transport/batch_payload.h"
#include "common/transport/transport.h"
#include "teacher_server/engine/ledger.h"
#include "teacher_server/models/causal_lm.h"

namespace e3 {

// The first global batch a rank has not yet committed.
struct Cursor {
  int64_t epoch = 0;
  int64_t next_batch = 0;
  bool operator<(const Cursor& o) const {
    return epoch != o.epoch ? epoch < o.epoch : next_batch < o.next_batch;
  }
  bool operator==(const Cursor& o) const { return epoch == o.epoch && next_batch == o.next_batch; }
  bool operator<=(const Cursor& o) const { return !(o < *this); }
};

// Batch ids are unique per (epoch, index in epoch, rank) and readable in
// logs: ((epoch * kMaxBatchesPerEpoch) + index) * kMaxWorldSize + rank.
// Unique while rank < kMaxWorldSize (ShardSpec refuses larger worlds),
// index < kMaxBatchesPerEpoch and epoch < kMaxEpochs (Engine::Create
// refuses larger datasets and more epochs); the largest id fits in int64.
constexpr int64_t kMaxBatchesPerEpoch = 1000000000;
constexpr int64_t kMaxEpochs = 900000;
static_assert(kMaxEpochs * kMaxBatchesPerEpoch <= INT64_MAX / kMaxWorldSize, "batch ids overflow int64");
int64_t BatchIdOf(int64_t epoch, int64_t index, int rank);

struct EngineOptions {
  int64_t tokens_per_batch = 4096;  // per rank; a global batch holds world x this
  int64_t max_samples_per_batch = 0;  // per rank; 0: no bound
  int64_t epochs = 1;
  uint64_t seed = 42;
  // The layers every forward captures (CapturedLayers: the union of what
  // the students it serves read); each subscriber gets its own of them.
  std::vector<int32_t> aux_layer_ids;
  std::vector<TransportKind> transports = {TransportKind::kShm, TransportKind::kInline};
  int max_credit_window = 16;
  absl::Duration subscriber_timeout = absl::Seconds(60);
  std::string shm_prefix = "/e3";  // segment names: <prefix>-<pid>-<group tag><batch id>
  // Set for each student group but the default one ("g1-"), so the
  // engines of one teacher never name the same segment.
  std::string shm_group_tag;
  std::string ledger_path;         // JSON lines; empty keeps the ledger in memory
  // The students' data-parallel world, when the launcher knows it: a
  // subscription claiming another is refused. 0: the first subscription
  // fixes it (for this process; the ledger keeps it once a commit
  // confirms it).
  int student_world_size = 0;
  // What defines the stream (announced in GetInfo, with the plan of a
  // subscriber that asks for everything); a subscriber's cursor made under
  // another stream, or under another plan than its request's, is refused.
  // Empty: no check.
  DataFingerprint fingerprint;

  // From the schedule, data and teachers sections; the transports default
  // to what the device offers (`cuda`). aux_layer_ids is left empty: the
  // captured layers need the model (CapturedLayers).
  static absl::StatusOr<EngineOptions> From(const RunConfig& config, bool cuda);
};

// What one subscriber's batches carry: its FeatureRequest resolved against
// the captured layers.
struct BatchFeatures {
  std::vector<int64_t> aux_positions;  // into EngineOptions::aux_layer_ids, in the subscriber's order
  bool last_hidden = true;
  bool target_argmax = true;
};

struct SubscribeParams {
  std::string subscriber_id;
  int rank = 0;
  int world_size = 1;
  int credit_window = 4;
  Cursor resume;
  TransportKind transport = TransportKind::kInline;
  // The fingerprint `resume` was made under; empty: a fresh student.
  DataFingerprint fingerprint;
  // What the subscriber's draft reads; unset: everything captured (an
  // older student). A layer not captured is refused.
  std::optional<FeatureRequest> features;
  // The subscriber's last checkpoint (<= resume), committed as an Ack's
  // `committed` would be: the commit it could not deliver while the
  // teacher was away.
  std::optional<Cursor> committed;
};

struct AckParams {
  int rank = 0;
  std::string subscriber_id;
  // The subscription whose batches these are; 0: a student without
  // fencing (only the subscriber id is checked).
  uint64_t generation = 0;
  std::vector<int64_t> batch_ids;
  std::optional<Cursor> committed;  // marks every batch before it committed
  // The student stops after this commit (AckRequest.final_report).
  bool final_report = false;
};

struct ReadyBatch {
  int64_t batch_id = 0;
  int rank = 0;
  int64_t epoch = 0;
  int64_t index = 0;  // global batch index within the epoch
  bool end_of_data = false;
  std::vector<int64_t> sample_ids;
  int64_t num_tokens = 0;
  std::shared_ptr<const PayloadBuffer> payload;  // null for end_of_data
};

struct EngineStats {
  int64_t batches_computed = 0;
  int64_t tokens_computed = 0;
  double forward_seconds = 0;
  int64_t buffered_batches = 0;  // computed and not yet acked, all ranks
  int64_t buffered_bytes = 0;
  int64_t reclaimed_batches = 0;  // dropped with dead subscribers
  // The sgl backend's CUDA graphs (models/forward_graphs.h), process-wide:
  // token budgets captured, and forwards replayed from one.
  int64_t cuda_graphs = 0;
  int64_t graph_forwards = 0;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(CausalLM* model, const Dataset* dataset,
                                                        EngineOptions options);
  ~Engine();

  // (Re)subscribes a rank. Anything the rank had buffered is dropped and
  // computation restarts at `resume`: batches delivered before but not
  // consumed by the student come again; those it consumed stay its own to
  // commit. Refuses a cursor made under another fingerprint. Returns the
  // subscription's generation, unique across restarts of this teacher.
  absl::StatusOr<uint64_t> Subscribe(const SubscribeParams& params);
  // Called (without engine locks held) whenever the rank may have a batch.
  void SetNotifier(int rank, uint64_t generation, std::function<void()> notify);
  // The next batch for this subscription, moved to the unacked set; nullopt
  // when none is ready yet. FailedPrecondition once superseded or stopped.
  absl::StatusOr<std::optional<ReadyBatch>> TakeNext(int rank, uint64_t generation);
  // The stream is gone; after subscriber_timeout its buffers are reclaimed.
  void Detach(int rank, uint64_t generation);
  // Frees acked batches and returns the rank's free credits. `committed`
  // marks every batch before it as committed in the ledger; it must not
  // pass what this subscription was delivered (or resumed at). Aborted when
  // a newer subscription of the rank exists (a zombie's ack).
  absl::StatusOr<int> Ack(const AckParams& params);
  // An Ack without fencing (generation 0).
  absl::StatusOr<int> Ack(int rank, const std::string& subscriber_id, const std::vector<int64_t>& batch_ids,
                          std::optional<Cursor> committed);
  // Stops computing new batches (SIGTERM); streams then end. Remembers
  // which attached ranks hold batches they could still commit.
  void Drain();
  bool draining() const { return draining_; }
  // True once every rank remembered by Drain() has sent a commit since:
  // students stopped by the same signal (scancel signals every task at
  // once) finish their step, checkpoint and commit before the server may
  // shut down.
  bool DrainSettled() const;
  // Ranks Drain() is still waiting on, for the message when the wait ends.
  int DrainPending() const;
  // Ranks Drain() remembered (settled or not).
  int DrainWaitedRanks() const;

  EngineStats stats() const;
  LedgerReport ledger_report() const;
  // The ledger's first failed write (OK: none): a run whose record is
  // incomplete must not end as a success.
  absl::Status ledger_failure() const { return ledger_.first_failure(); }
  // True once every rank of the world knows, through this process, that its
  // data ended (RankState::knows_end). A teacher restarted after the last
  // commit has a complete ledger at once, yet its students may not have
  // learnt that the data ended (the old process died first): they come
  // back for it.
  bool EveryRankToldTheEnd() const;
  int world_size() const;
  int64_t batches_per_epoch(int world) const;
  const EngineOptions& options() const { return options_; }
  // What every shm segment this process names starts with (<prefix>-<pid>-).
  std::string shm_segment_prefix() const;

 private:
  struct RankState {
    std::string subscriber_id;
    uint64_t generation = 0;
    bool attached = false;
    absl::Time detached_at;
    int credit_window = 4;
    TransportKind transport = TransportKind::kInline;
    BatchFeatures features;
    Cursor next_compute;
    Cursor committed;
    Cursor acked_end;          // one past the furthest batch acked
    int64_t commit_acks = 0;   // acks that carried a commit cursor
    // This subscription's student sent its final report: it stops, and a
    // drain has nothing more to wait for from it.
    bool final_reported = false;
    // One past the furthest batch this subscription was handed, or its
    // resume cursor: commits beyond it name batches it never had.
    Cursor delivered_end;
    // One past the furthest batch this rank was ever handed, by this
    // process or (from the ledger) an earlier one; `delivery_known` says
    // whether there is any such record. A resume cursor past it names
    // batches the rank never had: an edited checkpoint, or another run's.
    Cursor delivered_high;
    bool delivery_known = false;
    bool end_sent = false;
    // The student knows its data ended, as far as this process can tell
    // (sticky across resubscriptions): a subscription here was handed the
    // end, or subscribed at the end and then left on its own (a student
    // that already had the end, back only to report its commit).
    bool knows_end = false;
    bool subscribed_at_end = false;  // this subscription's cursor was the end
    bool computing = false;  // the worker is computing this rank's next batch
    std::deque<ReadyBatch> ready;
    std::map<int64_t, ReadyBatch> unacked;
    std::function<void()> notify;
  };

  explicit Engine(CausalLM* model, const Dataset* dataset, EngineOptions options)
      : model_(model), dataset_(dataset), options_(std::move(options)) {}
  absl::StatusOr<uint64_t> SubscribeImpl(const SubscribeParams& params, std::function<void()>* superseded_notify);
  void WorkerLoop();
  // A rank's next batch to compute, as the worker takes it.
  struct Work {
    int rank = 0;
    uint64_t generation = 0;
    Cursor cursor;
    TransportKind transport = TransportKind::kInline;
    BatchFeatures features;
  };
  // Picks a rank needing a batch; returns false when none does.
  bool PickWork(Work* work);
  absl::StatusOr<ReadyBatch> Compute(const Work& work);
  // The target's features of `samples` that `features` asks for (the
  // others undefined), on the model's GPU for a device payload, else on
  // the CPU.
  struct FeatureTensors {
    at::Tensor aux, last, argmax;
  };
  absl::StatusOr<FeatureTensors> ComputeFeatures(const std::vector<std::vector<int32_t>>& samples,
                                                 const BatchFeatures& features, bool device_payload);
  // `request` resolved against the captured layers; unset: everything.
  absl::StatusOr<BatchFeatures> ResolveFeatures(const std::optional<FeatureRequest>& request) const;
  // The fingerprint a subscriber with `request` must present.
  DataFingerprint FingerprintFor(const std::optional<FeatureRequest>& request) const;
  // Global batches hold `world` ranks' token budgets.
  BatcherOptions BatcherFor(int world) const;
  const std::vector<GlobalBatch>& PlanLocked(int64_t epoch);
  Cursor NormalizeLocked(Cursor c);
  bool AtEndLocked(const Cursor& c) { return c.epoch >= options_.epochs; }
  void ReclaimLocked(RankState& st);
  // Takes the world and each rank's committed cursor back from the ledger
  // (a restarted teacher continues the record where it stopped).
  absl::Status RestoreFromLedgerLocked();
  // Records commits of [st.committed, committed) and moves st.committed
  // as far as the ledger could record them.
  absl::Status CommitLocked(int rank, RankState& st, const Cursor& committed);
  // The checks a subscription must pass before it changes anything.
  absl::Status CheckSubscribeLocked(const SubscribeParams& p, int world);
  // Every shm segment name of this engine starts with this.
  std::string shm_segment_names() const;
  absl::Status CheckSubscriptionLocked(const AckParams& a, const RankState& st) const;

  CausalLM* model_;
  const Dataset* dataset_;
  EngineOptions options_;
  std::vector<int64_t> lengths_;
  Ledger ledger_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int world_ = 0;  // options_.student_world_size, else fixed by the first subscriber
  std::map<int64_t, std::vector<GlobalBatch>> plans_;
  std::map<int, RankState> ranks_;
  EngineStats stats_;
  std::atomic<bool> draining_{false};
  std::map<int, int64_t> drain_waits_;  // rank -> its commit_acks when the drain began
  // Generations start at the wall clock in microseconds, so a subscription
  // of this process never reuses the number of one before a restart.
  uint64_t next_generation_ = 0;
  bool stop_ = false;
  std::thread worker_;
  // GPU buffers for device-transport payloads; made by the worker thread
  // on first use.
  std::shared_ptr<DevicePool> device_pool_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_ENGINE_ENGINE_H_
