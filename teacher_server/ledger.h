// The teacher's record of what each rank was sent and what it committed
// (DESIGN.md: a batch is committed when the student reports a checkpoint
// that includes it). Tests and operators read it to prove that every
// sample of an epoch reached exactly one rank's surviving weights once.
#ifndef E3_TEACHER_SERVER_LEDGER_H_
#define E3_TEACHER_SERVER_LEDGER_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

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

class Ledger {
 public:
  // `path` may be empty (memory only); otherwise events are appended as
  // JSON lines so the record survives the process.
  absl::Status Open(const std::string& path, int64_t dataset_samples);

  void RecordDelivery(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids);
  void RecordCommit(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids);
  void RecordEvent(const std::string& json_object);

  // Epochs counted as complete: [0, complete_epochs).
  LedgerReport Report(int64_t complete_epochs) const;

 private:
  void Append(const std::string& line);
  mutable std::mutex mu_;
  std::ofstream file_;
  int64_t dataset_samples_ = 0;
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> deliveries_;  // (rank, epoch, index) -> sends
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> commits_;
  std::map<int64_t, std::map<int64_t, int64_t>> committed_per_epoch_;  // epoch -> sample -> count
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LEDGER_H_
