#include "teacher_server/ledger.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/sample_order.h"
#include "common/status_macros.h"

namespace e3 {

std::string LedgerReport::ToJson() const {
  return absl::StrCat("{\"epochs\":", epochs, ",\"dataset_samples\":", dataset_samples,
                      ",\"deliveries\":", deliveries, ",\"redeliveries\":", redeliveries,
                      ",\"committed_batches\":", committed_batches, ",\"committed_samples\":", committed_samples,
                      ",\"samples_committed_twice\":", samples_committed_twice,
                      ",\"samples_never_committed\":", samples_never_committed, "}");
}

Ledger::~Ledger() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status Ledger::Open(const std::string& path, int64_t dataset_samples) {
  std::lock_guard<std::mutex> lock(mu_);
  dataset_samples_ = dataset_samples;
  if (path.empty()) return absl::OkStatus();
  path_ = path;
  if (PathExists(path)) E3_RETURN_IF_ERROR(ReadBack(path));
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot open the ledger for appending: ", std::strerror(errno)));
  }
  Append(nlohmann::json{{"event", "open"}, {"dataset_samples", dataset_samples}}.dump(), /*sync=*/true);
  return absl::OkStatus();
}

absl::Status Ledger::ReadBack(const std::string& path) {
  E3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (complete < text.size()) {
    // The last write was cut short (the process died in it): that event
    // never happened as far as anyone was told, so it goes.
    std::fprintf(stderr, "teacher: ledger %s: dropping a half-written last line (%zu bytes)\n", path.c_str(),
                 text.size() - complete);
    if (::truncate(path.c_str(), static_cast<off_t>(complete)) != 0) {
      return absl::DataLossError(absl::StrCat(path, ": cannot cut off its half-written last line: ",
                                              std::strerror(errno)));
    }
  }
  int64_t line_no = 0, open_samples = -1;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text).substr(0, complete), '\n', absl::SkipEmpty())) {
    ++line_no;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("event") || !j["event"].is_string()) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": not a ledger event (a JSON object with \"event\")"));
    }
    E3_RETURN_IF_ERROR(Restore(j, path, line_no, &open_samples));
  }
  if (open_samples >= 0 && open_samples != dataset_samples_) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": this ledger records a dataset of ", open_samples, " samples, but this teacher serves ",
        dataset_samples_, "; a run over other data needs its own --ledger"));
  }
  return absl::OkStatus();
}

absl::Status Ledger::Restore(const nlohmann::json& j, const std::string& path, int64_t line_no,
                             int64_t* open_samples) {
  const std::string event = j["event"].get<std::string>();
  auto field = [&](const char* name) -> absl::StatusOr<int64_t> {
    if (!j.contains(name) || !j[name].is_number_integer()) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": ", event, " event without an integer \"", name,
                                              "\""));
    }
    return j[name].get<int64_t>();
  };
  if (event == "open") {
    E3_ASSIGN_OR_RETURN(*open_samples, field("dataset_samples"));
    return absl::OkStatus();
  }
  if (event == "subscribe") {
    E3_ASSIGN_OR_RETURN(const int64_t world, field("world"));
    if (world < 1 || world > kMaxWorldSize) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": subscribe event with world ", world,
                                              "; expected 1 <= world <= ", kMaxWorldSize));
    }
    restored_.world = static_cast<int>(world);
    return absl::OkStatus();
  }
  if (event == "rewind") {
    E3_ASSIGN_OR_RETURN(const int64_t rank, field("rank"));
    E3_ASSIGN_OR_RETURN(const int64_t to_epoch, field("to_epoch"));
    E3_ASSIGN_OR_RETURN(const int64_t to_batch, field("to_batch"));
    restored_.committed[static_cast<int>(rank)] = {to_epoch, to_batch};
    return absl::OkStatus();
  }
  if (event != "deliver" && event != "commit") return absl::OkStatus();  // reclaim, open, ...
  E3_ASSIGN_OR_RETURN(const int64_t rank, field("rank"));
  E3_ASSIGN_OR_RETURN(const int64_t epoch, field("epoch"));
  E3_ASSIGN_OR_RETURN(const int64_t index, field("index"));
  const auto key = std::make_tuple(static_cast<int>(rank), epoch, index);
  if (event == "deliver") {
    ++deliveries_[key];
    return absl::OkStatus();
  }
  if (!j.contains("samples") || !j["samples"].is_array()) {
    return absl::DataLossError(absl::StrCat(path, ":", line_no, ": commit event without a \"samples\" array"));
  }
  ++commits_[key];
  // Commits are recorded in cursor order, so the last one read is the
  // rank's furthest (a rewind in between moved it back first).
  restored_.committed[static_cast<int>(rank)] = {epoch, index + 1};
  auto& per_sample = committed_per_epoch_[epoch];
  for (const auto& s : j["samples"]) {
    if (!s.is_number_integer()) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": a sample id that is not an integer"));
    }
    ++per_sample[s.get<int64_t>()];
  }
  return absl::OkStatus();
}

void Ledger::Append(const std::string& line, bool sync) {
  if (fd_ < 0) return;
  const std::string data = line + "\n";
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const bool ok = written == data.size() && (!sync || ::fsync(fd_) == 0);
  if (!ok && (write_failures_++ % 1000) == 0) {
    // Serving goes on: the students' checkpoints, not this record, hold the
    // training; but an operator must know the record is incomplete.
    std::fprintf(stderr, "teacher: ledger %s: write failed (%s); %ld failure(s) so far\n", path_.c_str(),
                 std::strerror(errno), static_cast<long>(write_failures_));
  }
}

void Ledger::RecordDelivery(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = ++deliveries_[{rank, epoch, index}];
  Append(absl::StrCat("{\"event\":\"deliver\",\"rank\":", rank, ",\"epoch\":", epoch, ",\"index\":", index,
                      ",\"send\":", n, ",\"samples\":[", absl::StrJoin(sample_ids, ","), "]}"),
         /*sync=*/false);
}

void Ledger::RecordCommit(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = ++commits_[{rank, epoch, index}];
  auto& per_sample = committed_per_epoch_[epoch];
  for (int64_t s : sample_ids) ++per_sample[s];
  Append(absl::StrCat("{\"event\":\"commit\",\"rank\":", rank, ",\"epoch\":", epoch, ",\"index\":", index,
                      ",\"commit\":", n, ",\"samples\":[", absl::StrJoin(sample_ids, ","), "]}"),
         /*sync=*/true);
}

void Ledger::RecordEvent(const std::string& json_object) {
  std::lock_guard<std::mutex> lock(mu_);
  Append(json_object, /*sync=*/false);
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
