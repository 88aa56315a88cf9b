// The teacher's record of what each rank was sent and what it committed
// (DESIGN.md: a batch is committed when the student reports a checkpoint
// that includes it). Tests and operators read it to prove that every
// sample of an epoch reached exactly one rank's surviving weights once.
//
// The file is the record: an event counts (in the report, in what a
// restarted teacher restores) only once its line is written, and a commit
// only once it is on disk. A write that fails (a full disk, a file-size
// limit) is cut back off the file and returned to the caller, which stops
// the commit path until a write succeeds again; nothing is acknowledged that
// the file does not hold.
#ifndef E3_TEACHER_SERVER_ENGINE_LEDGER_H_
#define E3_TEACHER_SERVER_ENGINE_LEDGER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace e3 {

struct LedgerReport {
  int64_t epochs = 0;
  int64_t dataset_samples = 0;
  int64_t deliveries = 0;         // batches sent, redeliveries included
  int64_t redeliveries = 0;       // sends of a batch already sent once
  int64_t committed_batches = 0;
  int64_t committed_samples = 0;  // summed over epochs
  int64_t samples_committed_twice = 0;
  int64_t samples_never_committed = 0;  // over fully committed epochs
  int64_t write_failures = 0;           // writes this process could not make
  std::string ToJson() const;
};

// A position in a rank's stream: the first batch not covered.
struct LedgerCursor {
  int64_t epoch = 0;
  int64_t next_batch = 0;
};

// What a restarted teacher takes back from the ledger, so that commits
// continue where the dead process left them
// (docs/decisions/0013-teacher-restarted-mid-run.md).
struct RestoredLedger {
  // The world its students formed, once a commit confirmed it: a world
  // only announced by subscribers that never committed is not restored.
  int world = 0;  // 0: none confirmed
  // Per rank: the first batch not committed (after the last commit, or
  // where the last rewind went).
  std::map<int, LedgerCursor> committed;
  // Per rank: one past the furthest batch delivered. A resume cursor past
  // it names batches this rank was never sent.
  std::map<int, LedgerCursor> delivered;
};

class Ledger {
 public:
  Ledger() = default;
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;
  ~Ledger();

  // `path` may be empty (memory only); otherwise events are appended as
  // JSON lines so the record survives the process. The file is locked for
  // this process: a second teacher given the same path is refused. An
  // existing file is read back first, so a restarted teacher's report
  // covers the whole run. A half-written line (the process died, or a
  // write failed, mid-line) is dropped with a warning; any other
  // unreadable line, or a file written for a dataset of another size, is
  // an error naming the file and line.
  absl::Status Open(const std::string& path, int64_t dataset_samples);

  // Each returns the write's failure, naming the file; the event is then
  // not counted and not in the file.
  absl::Status RecordDelivery(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids);
  // Commits are the record's point: each is on disk (fsync) before this
  // returns OK.
  absl::Status RecordCommit(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids);
  // The world size the run's first commit confirmed.
  absl::Status RecordWorld(int world);
  absl::Status RecordEvent(const std::string& json_object);
  // Puts every delivery written so far on disk. A rank acks a batch before
  // its checkpoint can include it, so syncing at the ack keeps the record
  // of a delivery durable before any cursor past it exists.
  absl::Status SyncDeliveries();

  // Epochs counted as complete: [0, complete_epochs).
  LedgerReport Report(int64_t complete_epochs) const;
  // What Open read back from an existing file.
  const RestoredLedger& restored() const { return restored_; }
  // The first write failure of this process (OK: none), for the exit status.
  absl::Status first_failure() const;

 private:
  absl::Status OpenAndLock(const std::string& path);
  absl::Status ReadBack();
  absl::Status Restore(const nlohmann::json& event, int64_t line_no, int64_t* open_samples);
  // Appends one line; on any failure cuts the file back to its last whole
  // line and returns the error.
  absl::Status Append(const std::string& line, bool sync);
  absl::Status Failed(const std::string& what, int error);
  void CountCommit(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids);

  mutable std::mutex mu_;
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;          // bytes of whole lines in the file
  bool cut_pending_ = false;  // a failed write left bytes past size_
  bool unsynced_ = false;     // lines written since the last fsync
  int64_t write_failures_ = 0;
  absl::Status first_failure_;
  int64_t dataset_samples_ = 0;
  // Legacy files: the world of the last subscription, restored when a
  // commit follows it.
  int subscribed_world_ = 0;
  bool saw_commit_ = false;
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> deliveries_;  // (rank, epoch, index) -> sends
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> commits_;
  std::map<int64_t, std::map<int64_t, int64_t>> committed_per_epoch_;  // epoch -> sample -> count
  RestoredLedger restored_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_ENGINE_LEDGER_H_
