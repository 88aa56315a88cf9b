#include "common/tensorboard/event_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/tensorboard/summary.pb.h"
#include "common/tensorboard/tfrecord.h"

namespace e3 {
namespace {

// TensorBoard's event format version and the writer it credits.
constexpr char kFileVersion[] = "brain.Event:2";
constexpr char kWriterName[] = "e3train";
// Queued bytes that make AddScalar write them without waiting for Flush.
constexpr size_t kAutoFlushBytes = size_t{256} << 10;
// Queued bytes past which, writes failing, new scalars are dropped: about
// 250k scalars, the bound on what a disk that stays full costs in memory.
constexpr size_t kMaxPendingBytes = size_t{16} << 20;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string EventFileName(double wall_time) {
  return absl::StrFormat("events.out.tfevents.%010d.%s.%d.e3", static_cast<int64_t>(wall_time),
                         HostName(), ::getpid());
}

std::string SerializedFileVersionEvent(double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version(kFileVersion);
  event.mutable_source_metadata()->set_writer(kWriterName);
  return event.SerializeAsString();
}

// A double narrowed to float32; values beyond its range become +-inf
// (a plain cast of those is undefined behaviour).
float ToFloat32(double value) {
  constexpr double kMax = std::numeric_limits<float>::max();
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  if (value > kMax) return kInfinity;
  if (value < -kMax) return -kInfinity;
  return static_cast<float>(value);
}

std::string SerializedScalarEvent(const std::string& tag, int64_t step, double value,
                                  double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary::Value* summary_value = event.mutable_summary()->add_value();
  summary_value->set_tag(tag);
  summary_value->set_simple_value(ToFloat32(value));
  return event.SerializeAsString();
}

}  // namespace

EventFileWriter::EventFileWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Open(const std::string& dir) {
  E3_RETURN_IF_ERROR(MakeDirs(dir));
  const double now = NowSeconds();
  std::string path = JoinPath(dir, EventFileName(now));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot create event file"));
  std::unique_ptr<EventFileWriter> writer(new EventFileWriter(std::move(path), fd));
  E3_RETURN_IF_ERROR(writer->Enqueue(SerializedFileVersionEvent(now), "the file version"));
  E3_RETURN_IF_ERROR(writer->Flush());
  return writer;
}

EventFileWriter::~EventFileWriter() {
  (void)Flush();
  ::close(fd_);
}

absl::Status EventFileWriter::AddScalar(const std::string& tag, int64_t step, double value) {
  return AddScalar(tag, step, value, NowSeconds());
}

absl::Status EventFileWriter::AddScalar(const std::string& tag, int64_t step, double value,
                                        double wall_time) {
  return Enqueue(SerializedScalarEvent(tag, step, value, wall_time),
                 absl::StrCat("scalar '", tag, "' of step ", step));
}

absl::Status EventFileWriter::Enqueue(const std::string& event, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.size() >= kMaxPendingBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(path_, ": ", pending_.size(),
                                                     " bytes of events could not be written yet; ",
                                                     what, " dropped"));
  }
  AppendTfRecord(event, &pending_);
  if (pending_.size() >= kAutoFlushBytes) return FlushLocked();
  return absl::OkStatus();
}

absl::Status EventFileWriter::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  return FlushLocked();
}

absl::Status EventFileWriter::FlushLocked() {
  while (!pending_.empty()) {
    const ssize_t n = ::write(fd_, pending_.data(), pending_.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::ErrnoToStatus(n < 0 ? errno : EIO,
                                 absl::StrCat(path_, ": cannot write ", pending_.size(),
                                              " bytes of events (kept for the next flush)"));
    }
    pending_.erase(0, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace e3
