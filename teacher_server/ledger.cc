#include "teacher_server/ledger.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace e3 {

std::string LedgerReport::ToJson() const {
  return absl::StrCat("{\"epochs\":", epochs, ",\"dataset_samples\":", dataset_samples,
                      ",\"deliveries\":", deliveries, ",\"redeliveries\":", redeliveries,
                      ",\"committed_batches\":", committed_batches, ",\"committed_samples\":", committed_samples,
                      ",\"samples_committed_twice\":", samples_committed_twice,
                      ",\"samples_never_committed\":", samples_never_committed, "}");
}

absl::Status Ledger::Open(const std::string& path, int64_t dataset_samples) {
  std::lock_guard<std::mutex> lock(mu_);
  dataset_samples_ = dataset_samples;
  if (path.empty()) return absl::OkStatus();
  file_.open(path, std::ios::out | std::ios::app);
  if (!file_) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open the ledger for appending"));
  return absl::OkStatus();
}

void Ledger::Append(const std::string& line) {
  if (!file_.is_open()) return;
  file_ << line << '\n';
  file_.flush();
}

void Ledger::RecordDelivery(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = ++deliveries_[{rank, epoch, index}];
  Append(absl::StrCat("{\"event\":\"deliver\",\"rank\":", rank, ",\"epoch\":", epoch, ",\"index\":", index,
                      ",\"send\":", n, ",\"samples\":[", absl::StrJoin(sample_ids, ","), "]}"));
}

void Ledger::RecordCommit(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = ++commits_[{rank, epoch, index}];
  auto& per_sample = committed_per_epoch_[epoch];
  for (int64_t s : sample_ids) ++per_sample[s];
  Append(absl::StrCat("{\"event\":\"commit\",\"rank\":", rank, ",\"epoch\":", epoch, ",\"index\":", index,
                      ",\"commit\":", n, ",\"samples\":[", absl::StrJoin(sample_ids, ","), "]}"));
}

void Ledger::RecordEvent(const std::string& json_object) {
  std::lock_guard<std::mutex> lock(mu_);
  Append(json_object);
}

LedgerReport Ledger::Report(int64_t complete_epochs) const {
  std::lock_guard<std::mutex> lock(mu_);
  LedgerReport r;
  r.epochs = complete_epochs;
  r.dataset_samples = dataset_samples_;
  for (const auto& [key, n] : deliveries_) {
    r.deliveries += n;
    r.redeliveries += n - 1;
  }
  for (const auto& [key, n] : commits_) r.committed_batches += n;
  for (const auto& [epoch, samples] : committed_per_epoch_) {
    for (const auto& [s, n] : samples) {
      r.committed_samples += n;
      if (n > 1) r.samples_committed_twice += 1;
    }
    if (epoch < complete_epochs) r.samples_never_committed += dataset_samples_ - static_cast<int64_t>(samples.size());
  }
  for (int64_t e = 0; e < complete_epochs; ++e) {
    if (!committed_per_epoch_.count(e)) r.samples_never_committed += dataset_samples_;
  }
  return r;
}

}  // namespace e3
