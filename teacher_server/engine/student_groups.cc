#include "teacher_server/engine/student_groups.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/stream/student_group.h"

namespace e3 {

std::string GroupLedgerPath(const std::string& ledger, const std::string& group) {
  if (ledger.empty() || group.empty()) return ledger;
  constexpr char kJsonl[] = ".jsonl";
  if (absl::EndsWith(ledger, kJsonl)) {
    return absl::StrCat(ledger.substr(0, ledger.size() - sizeof(kJsonl) + 1), ".", group, kJsonl);
  }
  return absl::StrCat(ledger, ".", group);
}

absl::StatusOr<std::unique_ptr<StudentGroups>> StudentGroups::Create(CausalLM* model, const Dataset* dataset,
                                                                     EngineOptions options,
                                                                     const std::vector<std::string>& names) {
  std::unique_ptr<StudentGroups> groups(new StudentGroups());
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string where = absl::StrCat("teachers.student_groups[", i, "] (--student_groups)");
    E3_RETURN_IF_ERROR(CheckStudentGroupName(names[i], where));
    if (names[i].empty()) return absl::InvalidArgumentError(absl::StrCat(where, " is empty; expected a name"));
    for (size_t j = 0; j < i; ++j) {
      if (names[j] == names[i]) {
        return absl::InvalidArgumentError(absl::StrCat(where, " repeats \"", names[i], "\""));
      }
    }
  }
  E3_ASSIGN_OR_RETURN(std::unique_ptr<Engine> first, Engine::Create(model, dataset, options));
  groups->groups_.emplace_back("", std::move(first));
  for (size_t i = 0; i < names.size(); ++i) {
    EngineOptions o = options;
    o.ledger_path = GroupLedgerPath(options.ledger_path, names[i]);
    o.shm_group_tag = absl::StrCat("g", i + 1, "-");
    o.student_world_size = 0;  // the launcher's count is its own students'
    E3_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(model, dataset, std::move(o)));
    groups->groups_.emplace_back(names[i], std::move(engine));
  }
  return groups;
}

absl::StatusOr<Engine*> StudentGroups::Find(const std::string& group) {
  for (auto& [name, engine] : groups_) {
    if (name == group) return engine.get();
  }
  const std::vector<std::string> named = names();
  return absl::FailedPreconditionError(absl::StrCat(
      "this teacher serves no ", DescribeStudentGroup(group), "; it serves the default group",
      named.empty() ? std::string() : absl::StrCat(" and ", absl::StrJoin(named, ", ")),
      " (teachers.student_groups, --student_groups)"));
}

std::vector<std::string> StudentGroups::names() const {
  std::vector<std::string> out;
  for (size_t i = 1; i < groups_.size(); ++i) out.push_back(groups_[i].first);
  return out;
}

EngineStats StudentGroups::stats() const {
  EngineStats sum;
  for (const auto& [name, engine] : groups_) {
    const EngineStats s = engine->stats();
    sum.batches_computed += s.batches_computed;
    sum.tokens_computed += s.tokens_computed;
    sum.forward_seconds += s.forward_seconds;
    sum.buffered_batches += s.buffered_batches;
    sum.buffered_bytes += s.buffered_bytes;
    sum.reclaimed_batches += s.reclaimed_batches;
    // Process-wide counts: the same in every group.
    sum.cuda_graphs = s.cuda_graphs;
    sum.graph_forwards = s.graph_forwards;
  }
  return sum;
}

bool StudentGroups::EveryEpochCommitted(int64_t epochs) const {
  for (const auto& [name, engine] : groups_) {
    if (engine->ledger_report().epochs < epochs) return false;
  }
  return true;
}

bool StudentGroups::EveryRankToldTheEnd() const {
  for (const auto& [name, engine] : groups_) {
    if (!engine->EveryRankToldTheEnd()) return false;
  }
  return true;
}

void StudentGroups::Drain() {
  for (auto& [name, engine] : groups_) engine->Drain();
}

bool StudentGroups::DrainSettled() const { return DrainPending() == 0; }

int StudentGroups::DrainPending() const {
  int pending = 0;
  for (const auto& [name, engine] : groups_) pending += engine->DrainPending();
  return pending;
}

int StudentGroups::DrainWaitedRanks() const {
  int waited = 0;
  for (const auto& [name, engine] : groups_) waited += engine->DrainWaitedRanks();
  return waited;
}

std::vector<std::pair<std::string, LedgerReport>> StudentGroups::ledger_reports() const {
  std::vector<std::pair<std::string, LedgerReport>> out;
  for (const auto& [name, engine] : groups_) out.emplace_back(name, engine->ledger_report());
  return out;
}

absl::Status StudentGroups::ledger_failure() const {
  for (const auto& [name, engine] : groups_) {
    absl::Status s = engine->ledger_failure();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace e3
