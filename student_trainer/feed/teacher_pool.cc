#include "student_trainer/feed/teacher_pool.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace e3 {
namespace {

void LogTeacher(const TeacherClientOptions& client, const std::string& address,
                const TeacherInfo& ti) {
  std::printf(
      "student[%d/%d]: teacher %s: %s L=%ld H=%ld (TP=%d, EP=%d), captures aux layers [%s], draft vocab "
      "%ld, "
      "%ld samples, %ld batches/epoch x %ld\n",
      client.layout.rank(), client.layout.world_size(), address.c_str(), ti.config.architecture_name.c_str(),
      static_cast<long>(ti.config.num_hidden_layers), static_cast<long>(ti.config.hidden_size),
      ti.raw.layout().tp_size(), ti.raw.layout().ep_size(),
      absl::StrJoin(ti.captured_layer_ids, ",").c_str(), static_cast<long>(ti.draft_vocab_size),
      static_cast<long>(ti.raw.dataset_samples()), static_cast<long>(ti.batches_per_epoch),
      static_cast<long>(ti.epochs));
}

}  // namespace

absl::Status CheckTeachersAgree(const std::vector<const TeacherInfo*>& infos,
                                const std::vector<std::string>& addresses) {
  const TeacherInfo& a = *infos[0];
  for (size_t i = 1; i < infos.size(); ++i) {
    const std::vector<std::string> differ = ModelDifferences(a, *infos[i]);
    if (!differ.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("teachers ", addresses[0], " and ", addresses[i],
                       " serve different models, aux layers or draft vocabs (",
                       absl::StrJoin(differ, ", "), " differ)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameFrozenWeights(const FrozenWeights& a, const FrozenWeights& b,
                                    const std::string& a_address, const std::string& b_address) {
  if (b.vocab.d2t != a.vocab.d2t || !b.target_head.equal(a.target_head)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "teachers ", a_address, " and ", b_address,
        " serve different draft vocabs or heads (calibrate once, or pass the same --vocab_map)"));
  }
  return absl::OkStatus();
}

std::optional<size_t> RoundRobin::Current() {
  for (size_t k = 0; k < ended_.size(); ++k, ++turn_) {
    if (!ended_[turn_ % ended_.size()]) return turn_ % ended_.size();
  }
  return std::nullopt;
}

TeacherPool::TeacherPool(std::vector<std::string> addresses,
                         std::vector<std::unique_ptr<TeacherClient>> clients)
    : addresses_(std::move(addresses)),
      clients_(std::move(clients)),
      turns_(clients_.size()) {}

absl::StatusOr<std::unique_ptr<TeacherPool>> TeacherPool::Connect(
    const std::vector<std::string>& addresses, const TeacherClientOptions& client) {
  if (addresses.empty()) return absl::InvalidArgumentError("no teacher address given");
  std::vector<std::unique_ptr<TeacherClient>> clients;
  std::vector<const TeacherInfo*> infos;
  for (const std::string& address : addresses) {
    TeacherClientOptions co = client;
    co.address = address;
    E3_ASSIGN_OR_RETURN(std::unique_ptr<TeacherClient> c, TeacherClient::Connect(co));
    LogTeacher(client, address, c->info());
    infos.push_back(&c->info());
    clients.push_back(std::move(c));
  }
  E3_RETURN_IF_ERROR(CheckTeachersAgree(infos, addresses));
  return std::unique_ptr<TeacherPool>(new TeacherPool(addresses, std::move(clients)));
}

int64_t TeacherPool::planned_batches() const {
  int64_t planned = 0;
  for (const auto& c : clients_) planned += c->info().batches_per_epoch * c->info().epochs;
  return planned;
}

absl::Status TeacherPool::RequestFeatures(const FeatureRequest& request) {
  for (auto& c : clients_) E3_RETURN_IF_ERROR(c->RequestFeatures(request));
  return absl::OkStatus();
}

absl::StatusOr<FrozenWeights> TeacherPool::FetchWeights(bool with_rest_head) {
  E3_ASSIGN_OR_RETURN(FrozenWeights frozen, clients_[0]->FetchWeights(with_rest_head));
  for (size_t i = 1; i < clients_.size(); ++i) {
    E3_ASSIGN_OR_RETURN(FrozenWeights other, clients_[i]->FetchWeights());
    E3_RETURN_IF_ERROR(CheckSameFrozenWeights(frozen, other, addresses_[0], addresses_[i]));
  }
  return frozen;
}

absl::Status TeacherPool::Start(const std::vector<StreamCursor>& cursors) {
  if (cursors.size() != clients_.size()) {
    return absl::InternalError(
        absl::StrCat(cursors.size(), " cursors for ", clients_.size(), " teachers"));
  }
  for (size_t i = 0; i < clients_.size(); ++i) E3_RETURN_IF_ERROR(clients_[i]->Start(cursors[i]));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<PooledBatch>> TeacherPool::Next() {
  while (std::optional<size_t> i = turns_.Current()) {
    PooledBatch out;
    out.teacher = *i;
    E3_ASSIGN_OR_RETURN(out.batch, clients_[*i]->Next(&out.wait_seconds));
    if (out.batch.end_of_data) {
      turns_.MarkEnded(*i);
      continue;
    }
    turns_.Advance();
    return out;
  }
  return std::nullopt;
}

absl::Status TeacherPool::Ack(size_t teacher, const StudentBatch& batch) {
  return clients_[teacher]->Ack(batch);
}

absl::Status TeacherPool::Commit(const std::vector<StreamCursor>& cursors, bool wait, bool final_report) {
  for (size_t i = 0; i < clients_.size(); ++i) {
    E3_RETURN_IF_ERROR(clients_[i]->Commit(cursors[i], wait, final_report));
  }
  return absl::OkStatus();
}

}  // namespace e3
