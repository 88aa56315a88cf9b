#include "teacher_server/engine/ledger.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/stream/sample_order.h"

namespace e3 {
namespace {

// Where a line torn by a failed or interrupted write was followed by a
// whole event (the next write appended after the fragment), the event
// starts at the last "{"event":" of the line.
constexpr char kEventStart[] = "{\"event\":";

nlohmann::json ParseEvent(absl::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("event") && j["event"].is_string()) return j;
  return nlohmann::json();
}

LedgerCursor Furthest(const LedgerCursor& a, const LedgerCursor& b) {
  const bool b_later = b.epoch != a.epoch ? b.epoch > a.epoch : b.next_batch > a.next_batch;
  return b_later ? b : a;
}

// The whole file behind `fd`, from its start.
absl::StatusOr<std::string> ReadAll(int fd, const std::string& path) {
  std::string text;
  char buf[1 << 16];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(path, ": cannot read the ledger: ", std::strerror(errno)));
    if (n == 0) return text;
    text.append(buf, static_cast<size_t>(n));
    at += n;
  }
}

}  // namespace

std::string LedgerReport::ToJson() const {
  return absl::StrCat("{\"epochs\":", epochs, ",\"dataset_samples\":", dataset_samples,
                      ",\"deliveries\":", deliveries, ",\"redeliveries\":", redeliveries,
                      ",\"committed_batches\":", committed_batches, ",\"committed_samples\":", committed_samples,
                      ",\"samples_committed_twice\":", samples_committed_twice,
                      ",\"samples_never_committed\":", samples_never_committed,
                      ",\"write_failures\":", write_failures, "}");
}

Ledger::~Ledger() {
  if (fd_ >= 0) ::close(fd_);  // also releases the lock
}

absl::Status Ledger::Open(const std::string& path, int64_t dataset_samples) {
  std::lock_guard<std::mutex> lock(mu_);
  dataset_samples_ = dataset_samples;
  if (path.empty()) return absl::OkStatus();
  path_ = path;
  E3_RETURN_IF_ERROR(OpenAndLock(path));
  E3_RETURN_IF_ERROR(ReadBack());
  return Append(nlohmann::json{{"event", "open"}, {"dataset_samples", dataset_samples}, {"pid", ::getpid()}}.dump(),
                /*sync=*/true);
}

absl::Status Ledger::OpenAndLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot open the ledger for appending: ", std::strerror(errno)));
  }
  // flock, not fcntl locks: those go with any close of the file by this
  // process, and the lock must hold for the process's life.
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": the ledger is in use by another process (another teacher_server with the same --ledger?); "
                "each teacher needs a ledger of its own"));
    }
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot lock the ledger: ", std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::Status Ledger::ReadBack() {
  E3_ASSIGN_OR_RETURN(std::string text, ReadAll(fd_, path_));
  const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (complete < text.size()) {
    // The last write was cut short (the process died in it): that event
    // never happened as far as anyone was told, so it goes.
    std::fprintf(stderr, "teacher: ledger %s: dropping a half-written last line (%zu bytes)\n", path_.c_str(),
                 text.size() - complete);
    if (::ftruncate(fd_, static_cast<off_t>(complete)) != 0) {
      return absl::DataLossError(absl::StrCat(path_, ": cannot cut off its half-written last line: ",
                                              std::strerror(errno)));
    }
  }
  size_ = static_cast<int64_t>(complete);
  int64_t line_no = 0, open_samples = -1;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text).substr(0, complete), '\n')) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j = ParseEvent(line);
    const size_t start = line.rfind(kEventStart);
    if (j.is_null() && start != absl::string_view::npos && start > 0) {
      j = ParseEvent(line.substr(start));
      if (!j.is_null()) {
        std::fprintf(stderr, "teacher: ledger %s:%ld: dropping %zu bytes of a half-written line before an event\n",
                     path_.c_str(), static_cast<long>(line_no), start);
      }
    }
    if (j.is_null()) {
      return absl::DataLossError(
          absl::StrCat(path_, ":", line_no, ": not a ledger event (a JSON object with \"event\")"));
    }
    E3_RETURN_IF_ERROR(Restore(j, line_no, &open_samples));
  }
  if (restored_.world == 0 && saw_commit_) restored_.world = subscribed_world_;
  if (open_samples >= 0 && open_samples != dataset_samples_) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": this ledger records a dataset of ", open_samples, " samples, but this teacher serves ",
        dataset_samples_, "; a run over other data needs its own --ledger"));
  }
  return absl::OkStatus();
}

absl::Status Ledger::Restore(const nlohmann::json& j, int64_t line_no, int64_t* open_samples) {
  const std::string event = j["event"].get<std::string>();
  auto field = [&](const char* name) -> absl::StatusOr<int64_t> {
    if (!j.contains(name) || !j[name].is_number_integer()) {
      return absl::DataLossError(
          absl::StrCat(path_, ":", line_no, ": ", event, " event without an integer \"", name, "\""));
    }
    return j[name].get<int64_t>();
  };
  auto world_field = [&]() -> absl::StatusOr<int> {
    E3_ASSIGN_OR_RETURN(const int64_t world, field("world"));
    if (world < 1 || world > kMaxWorldSize) {
      return absl::DataLossError(absl::StrCat(path_, ":", line_no, ": ", event, " event with world ", world,
                                              "; expected 1 <= world <= ", kMaxWorldSize));
    }
    return static_cast<int>(world);
  };
  if (event == "open") {
    E3_ASSIGN_OR_RETURN(*open_samples, field("dataset_samples"));
    return absl::OkStatus();
  }
  if (event == "world") {
    E3_ASSIGN_OR_RETURN(restored_.world, world_field());
    return absl::OkStatus();
  }
  if (event == "subscribe") {
    E3_ASSIGN_OR_RETURN(subscribed_world_, world_field());
    return absl::OkStatus();
  }
  if (event == "rewind") {
    E3_ASSIGN_OR_RETURN(const int64_t rank, field("rank"));
    E3_ASSIGN_OR_RETURN(const int64_t to_epoch, field("to_epoch"));
    E3_ASSIGN_OR_RETURN(const int64_t to_batch, field("to_batch"));
    restored_.committed[static_cast<int>(rank)] = {to_epoch, to_batch};
    return absl::OkStatus();
  }
  if (event != "deliver" && event != "commit") return absl::OkStatus();  // reclaim, ...
  E3_ASSIGN_OR_RETURN(const int64_t rank, field("rank"));
  E3_ASSIGN_OR_RETURN(const int64_t epoch, field("epoch"));
  E3_ASSIGN_OR_RETURN(const int64_t index, field("index"));
  const int r = static_cast<int>(rank);
  if (event == "deliver") {
    ++deliveries_[{r, epoch, index}];
    restored_.delivered[r] = Furthest(restored_.delivered[r], {epoch, index + 1});
    return absl::OkStatus();
  }
  if (!j.contains("samples") || !j["samples"].is_array()) {
    return absl::DataLossError(absl::StrCat(path_, ":", line_no, ": commit event without a \"samples\" array"));
  }
  std::vector<int64_t> samples;
  for (const auto& s : j["samples"]) {
    if (!s.is_number_integer()) {
      return absl::DataLossError(absl::StrCat(path_, ":", line_no, ": a sample id that is not an integer"));
    }
    samples.push_back(s.get<int64_t>());
  }
  CountCommit(r, epoch, index, samples);
  saw_commit_ = true;
  // Commits are recorded in cursor order, so the last one read is the
  // rank's furthest (a rewind in between moved it back first).
  restored_.committed[r] = {epoch, index + 1};
  return absl::OkStatus();
}

void Ledger::CountCommit(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids) {
  ++commits_[{rank, epoch, index}];
  auto& per_sample = committed_per_epoch_[epoch];
  for (int64_t s : sample_ids) ++per_sample[s];
}

absl::Status Ledger::Failed(const std::string& what, int error) {
  ++write_failures_;
  absl::Status status = absl::UnavailableError(absl::StrCat(
      "ledger ", path_, ": ", what, " (", std::strerror(error), "); the teacher takes no commit until it can "
      "write the ledger again"));
  if (first_failure_.ok()) first_failure_ = status;
  // One line per failure burst keeps a full disk from flooding the log.
  if (write_failures_ == 1 || write_failures_ % 1000 == 0) {
    std::fprintf(stderr, "teacher: %s; %ld failure(s) so far\n", std::string(status.message()).c_str(),
                 static_cast<long>(write_failures_));
  }
  return status;
}

absl::Status Ledger::Append(const std::string& line, bool sync) {
  if (fd_ < 0) return absl::OkStatus();
  // A failed write may have left a fragment that could not be cut then;
  // nothing may follow it until it is gone.
  if (cut_pending_) {
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) return Failed("cannot cut off a failed write", errno);
    cut_pending_ = false;
  }
  const std::string data = line + "\n";
  size_t written = 0;
  int error = 0;
  while (written < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      break;
    }
    written += static_cast<size_t>(n);
  }
  if (error == 0 && sync && ::fsync(fd_) != 0) error = errno;
  if (error != 0) {
    cut_pending_ = ::ftruncate(fd_, static_cast<off_t>(size_)) != 0;
    return Failed(sync ? "cannot write and sync a line" : "cannot write a line", error);
  }
  size_ += static_cast<int64_t>(data.size());
  unsynced_ = !sync;
  return absl::OkStatus();
}

absl::Status Ledger::RecordDelivery(int rank, int64_t epoch, int64_t index,
                                    const std::vector<int64_t>& sample_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = deliveries_[{rank, epoch, index}] + 1;
  E3_RETURN_IF_ERROR(Append(absl::StrCat("{\"event\":\"deliver\",\"rank\":", rank, ",\"epoch\":", epoch,
                                         ",\"index\":", index, ",\"send\":", n, ",\"samples\":[",
                                         absl::StrJoin(sample_ids, ","), "]}"),
                            /*sync=*/false));
  deliveries_[{rank, epoch, index}] = n;
  return absl::OkStatus();
}

absl::Status Ledger::RecordCommit(int rank, int64_t epoch, int64_t index, const std::vector<int64_t>& sample_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = commits_[{rank, epoch, index}] + 1;
  E3_RETURN_IF_ERROR(Append(absl::StrCat("{\"event\":\"commit\",\"rank\":", rank, ",\"epoch\":", epoch,
                                         ",\"index\":", index, ",\"commit\":", n, ",\"samples\":[",
                                         absl::StrJoin(sample_ids, ","), "]}"),
                            /*sync=*/true));
  CountCommit(rank, epoch, index, sample_ids);
  return absl::OkStatus();
}

absl::Status Ledger::RecordWorld(int world) {
  std::lock_guard<std::mutex> lock(mu_);
  E3_RETURN_IF_ERROR(Append(absl::StrCat("{\"event\":\"world\",\"world\":", world, "}"), /*sync=*/true));
  restored_.world = world;
  return absl::OkStatus();
}

absl::Status Ledger::RecordEvent(const std::string& json_object) {
  std::lock_guard<std::mutex> lock(mu_);
  return Append(json_object, /*sync=*/false);
}

absl::Status Ledger::SyncDeliveries() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0 || !unsynced_) return absl::OkStatus();
  if (::fdatasync(fd_) != 0) return Failed("cannot sync the deliveries written", errno);
  unsynced_ = false;
  return absl::OkStatus();
}

absl::Status Ledger::first_failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_failure_;
}

LedgerReport Ledger::Report(int64_t complete_epochs) const {
  std::lock_guard<std::mutex> lock(mu_);
  LedgerReport r;
  r.epochs = complete_epochs;
  r.dataset_samples = dataset_samples_;
  r.write_failures = write_failures_;
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
