// The teacher's record of what each rank was sent and what it committed
// (DESIGN.md: a batch is committed when the student reports a checkpoint
// that includes it). Tests and operators read it to prove that every
// sample of an epoch reached exactly one rank's surviving weights once.
#ifndef E3_TEACHER_SERVER_LEDGER_H_
#define E3_TEACHER_SERVER_LEDGER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
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
  std::string ToJson() const;
};

// What a restarted teacher takes back from the ledger, so that commits
// continue where the dead process left them (docs/DECISIONS.md, "A
// teacher restarted mid-run"): the world its students formed and, per
// rank, the first batch not committed (after the last commit, or where
// the last rewind went).
struct LedgerCursor {
  int64_t epoch = 0;
  int64_t next_batch = 0;
};
struct RestoredLedger {
  int world = 0;  // 0: no subscription recorded
  std::map<int, LedgerCursor> committed;
};

class Ledger {
 public:
  Ledger() = default;
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;
  ~Ledger();

  // `path` may be empty (memory only); otherwise events are appended as
  // JSON lines so the record survives the process. An existing file is
  // read back first, so a restarted teacher's report covers the whole run:
  // a half-written last line (the process died mid-write) is cut off with
  // a warning; any other unreadable line, or a file written for a dataset
  // of another size, is an error naming the file and line.
  absl::Status Open(const std::string& path, int64_t dataset_samples);

  void RecordDelivery(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids);
  // Commits are the record's point: each is on disk (fsync) before this
  // returns. A failed write is reported on stderr, never fatal to serving.
  void RecordCommit(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids);
  void RecordEvent(const std::string& json_object);

  // Epochs counted as complete: [0, complete_epochs).
  LedgerReport Report(int64_t complete_epochs) const;
  // What Open read back from an existing file.
  const RestoredLedger& restored() const { return restored_; }

 private:
  absl::Status ReadBack(const std::string& path);
  absl::Status Restore(const nlohmann::json& event, const std::string& path, int64_t line_no,
                       int64_t* open_samples);
  void Append(const std::string& line, bool sync);
  mutable std::mutex mu_;
  std::string path_;
  int fd_ = -1;
  int64_t write_failures_ = 0;
  int64_t dataset_samples_ = 0;
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> deliveries_;  // (rank, epoch, index) -> sends
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> commits_;
  std::map<int64_t, std::map<int64_t, int64_t>> committed_per_epoch_;  // epoch -> sample -> count
  RestoredLedger restored_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LEDGER_H_
