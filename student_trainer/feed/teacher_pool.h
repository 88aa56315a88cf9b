// The teachers one student trains from: each serves a shard of the data
// (teacher_server --num_data_shards/--data_shard) of the same model. The
// pool connects to all of them, checks that they agree on what the draft
// is trained against (model dims, aux layers, draft vocab, frozen head),
// takes batches round-robin over those that still have data, and reports
// each checkpoint's cursors to the teachers whose cursor moved.
#ifndef E3_STUDENT_TRAINER_FEED_TEACHER_POOL_H_
#define E3_STUDENT_TRAINER_FEED_TEACHER_POOL_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "student_trainer/feed/teacher_client.h"

namespace e3 {

// An error unless every teacher serves the model, aux layers and draft
// vocab size of the first (`addresses[i]` names teacher i).
absl::Status CheckTeachersAgree(const std::vector<const TeacherInfo*>& infos,
                                const std::vector<std::string>& addresses);

// An error unless `b` holds the draft vocab and target head of `a`: one
// calibration, or the same --vocab_map, for every teacher.
absl::Status CheckSameFrozenWeights(const FrozenWeights& a, const FrozenWeights& b,
                                    const std::string& a_address, const std::string& b_address);

// Whose turn it is: teachers in order, skipping those whose data ended.
class RoundRobin {
 public:
  explicit RoundRobin(size_t size) : ended_(size, false) {}
  // The teacher to take the next batch from; nullopt once all have ended.
  std::optional<size_t> Current();
  // A batch was taken from Current(): the next teacher's turn.
  void Advance() { ++turn_; }
  // Teacher i's data ended: it is skipped from now on.
  void MarkEnded(size_t i) { ended_[i] = true; }

 private:
  std::vector<bool> ended_;
  size_t turn_ = 0;
};

struct PooledBatch {
  size_t teacher = 0;  // index in the pool
  StudentBatch batch;
  double wait_seconds = 0;  // time blocked waiting for it
};

class TeacherPool {
 public:
  // Connects to each address with `client` (its address replaced), logs
  // what each serves, and checks that they agree.
  static absl::StatusOr<std::unique_ptr<TeacherPool>> Connect(
      const std::vector<std::string>& addresses, const TeacherClientOptions& client);

  size_t size() const { return clients_.size(); }
  const std::string& address(size_t i) const { return addresses_[i]; }
  // The first teacher: its model is every teacher's; it serves the eval set.
  const TeacherInfo& info() const { return clients_[0]->info(); }
  TeacherClient* first() { return clients_[0].get(); }
  // Batches every teacher will deliver to this rank, all epochs.
  int64_t planned_batches() const;

  // What the draft reads, asked of every teacher before Start
  // (TeacherClient::RequestFeatures); info() then describes what arrives.
  absl::Status RequestFeatures(const FeatureRequest& request);

  // The frozen weights of the first teacher, checked against the others'.
  // with_rest_head: also the target head's rows outside the draft vocab
  // (the LK losses), from the first teacher.
  absl::StatusOr<FrozenWeights> FetchWeights(bool with_rest_head = false);

  // Starts every teacher's stream at its cursor (one per teacher).
  absl::Status Start(const std::vector<StreamCursor>& cursors);
  // The next batch, round-robin over the teachers that still have data;
  // nullopt once every teacher's data has ended.
  absl::StatusOr<std::optional<PooledBatch>> Next();
  absl::Status Ack(size_t teacher, const StudentBatch& batch);
  // Reports `cursors` (a checkpoint's) as committed to each teacher whose
  // cursor moved since it last took one. A teacher that saw its whole
  // shard committed may exit (--exit_when_done), so it is not asked again.
  // `wait` (the last checkpoint): returns once every teacher has it; else
  // a teacher that is away gets it when its student resubscribes.
  // `final_report`: the student stops after this (a signal); sent even
  // where a teacher has the cursor already, and marked so, since a
  // draining teacher waits for each rank's last word.
  absl::Status Commit(const std::vector<StreamCursor>& cursors, bool wait, bool final_report = false);
  // The data stream teacher i's cursor belongs to (after Start).
  DataFingerprint fingerprint(size_t i) const { return clients_[i]->fingerprint(); }

 private:
  TeacherPool(std::vector<std::string> addresses,
              std::vector<std::unique_ptr<TeacherClient>> clients);

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<TeacherClient>> clients_;
  RoundRobin turns_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_FEED_TEACHER_POOL_H_
