// The student groups one teacher serves (common/stream/student_group.h):
// the default group and each one teachers.student_groups names, every
// group an Engine of its own over the same model and dataset. A group is
// a data stream as a teacher of one group serves it: its own epoch plans
// for its world, cursors, credits, commits and ledger; the groups share
// the model (SerializedCausalLM: one forward at a time) and its captured
// layers, and each subscriber receives its own of those.
#ifndef E3_TEACHER_SERVER_ENGINE_STUDENT_GROUPS_H_
#define E3_TEACHER_SERVER_ENGINE_STUDENT_GROUPS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "teacher_server/engine/engine.h"

namespace e3 {

// The ledger of `group` beside `ledger` (the default group's):
// "run/ledger.jsonl" -> "run/ledger.dflash.jsonl"; empty stays empty.
std::string GroupLedgerPath(const std::string& ledger, const std::string& group);

class StudentGroups {
 public:
  // One engine per group: the default one with `options`, each of `names`
  // with its ledger at GroupLedgerPath, shm names of its own, and its world
  // fixed by its first subscriber (options.student_world_size is the
  // default group's). InvalidArgument for a bad or repeated name.
  static absl::StatusOr<std::unique_ptr<StudentGroups>> Create(CausalLM* model, const Dataset* dataset,
                                                               EngineOptions options,
                                                               const std::vector<std::string>& names);

  // The default group's engine: its options are every group's but the
  // ledger, the shm tag and the world.
  Engine& default_group() { return *groups_.front().second; }
  const Engine& default_group() const { return *groups_.front().second; }
  // The engine of `group`; FailedPrecondition naming the groups served.
  absl::StatusOr<Engine*> Find(const std::string& group);
  // The named groups (the default one left out), in configuration order.
  std::vector<std::string> names() const;

  // What every group is doing, summed (the teacher's metrics).
  EngineStats stats() const;
  // True once every group has committed `epochs` epochs and every rank of
  // each was told the end of its data (Engine::EveryRankToldTheEnd).
  bool EveryEpochCommitted(int64_t epochs) const;
  bool EveryRankToldTheEnd() const;
  // Drain, over every group (Engine's).
  void Drain();
  bool DrainSettled() const;
  int DrainPending() const;
  int DrainWaitedRanks() const;
  // Each group's ledger report as a log line names it.
  std::vector<std::pair<std::string, LedgerReport>> ledger_reports() const;
  // The first group's ledger write failure (OK: none).
  absl::Status ledger_failure() const;

 private:
  StudentGroups() = default;
  std::vector<std::pair<std::string, std::unique_ptr<Engine>>> groups_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_ENGINE_STUDENT_GROUPS_H_
