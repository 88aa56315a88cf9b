// Writes TensorBoard event files, the format `tensorboard --logdir` reads:
// the student's step-log scalars go to run.out/tb/. Scalars are written in
// the legacy Summary.Value.simple_value form, which TensorBoard's
// EventAccumulator.Scalars() returns as is and which its loader migrates
// to scalar tensors for the UI (tensorboard/data_compat.py).
//
// Records are queued in memory and written by Flush(), which the caller
// runs every few seconds; a write error comes back as a Status (the file
// and errno's text) and never ends the process, so a full disk costs the
// curves, not the run. Its methods may be called from several threads.
#ifndef E3_COMMON_TENSORBOARD_EVENT_WRITER_H_
#define E3_COMMON_TENSORBOARD_EVENT_WRITER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace e3 {

class EventFileWriter {
 public:
  // Creates `dir` (with its parents) and a new file in it named
  // events.out.tfevents.<10-digit Unix time>.<hostname>.<pid>.e3
  // (TensorBoard reads every file whose name contains "tfevents"), whose
  // first record gives the format version, "brain.Event:2".
  static absl::StatusOr<std::unique_ptr<EventFileWriter>> Open(const std::string& dir);

  // Writes what is still queued and closes the file. Its errors are lost
  // here: call Flush() first to see them.
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // Queues `value` (stored as a float32, as TensorBoard stores scalars)
  // for `tag` at `step`, stamped with the current time. Fails only when
  // earlier records could not be written and too many are queued; the
  // scalar is then dropped.
  absl::Status AddScalar(const std::string& tag, int64_t step, double value);
  // The same with its wall time given (seconds since the Unix epoch).
  absl::Status AddScalar(const std::string& tag, int64_t step, double value, double wall_time);

  // Writes every queued record to the file (to the kernel; no fsync).
  // After a failed write the unwritten bytes stay queued and the next
  // Flush resumes them, so the file never holds half a record followed
  // by another.
  absl::Status Flush();

  const std::string& path() const { return path_; }

 private:
  EventFileWriter(std::string path, int fd);
  // Frames a serialized Event and queues it; flushes once enough is queued.
  absl::Status Enqueue(const std::string& event, const std::string& what);
  absl::Status FlushLocked();

  const std::string path_;
  const int fd_;
  std::mutex mu_;
  std::string pending_;  // framed records not yet written
};

}  // namespace e3

#endif  // E3_COMMON_TENSORBOARD_EVENT_WRITER_H_
