// Reads back TensorBoard event files written by EventFileWriter (or any
// writer of simple_value scalars): for tests, and for checking a run's
// curves without TensorBoard installed.
#ifndef E3_COMMON_TENSORBOARD_EVENT_READER_H_
#define E3_COMMON_TENSORBOARD_EVENT_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace e3 {

struct ScalarEvent {
  double wall_time = 0;  // seconds since the Unix epoch
  int64_t step = 0;
  std::string tag;
  float value = 0;
};

struct EventFileContents {
  std::string file_version;          // "brain.Event:2" from the first record
  std::string writer;                // its source_metadata.writer
  std::vector<ScalarEvent> scalars;  // in file order
};

// Every record of the file at `path`, both CRCs checked; events other than
// simple_value scalars are skipped. Errors are DataLoss naming the file
// and the record's byte offset: a CRC mismatch, a record that is no Event,
// or "truncated record at offset N" when the file ends inside a record (a
// write torn by a crash or still in progress).
absl::StatusOr<EventFileContents> ReadEventFile(const std::string& path);

// ReadEventFile's scalars alone.
absl::StatusOr<std::vector<ScalarEvent>> ReadScalarEvents(const std::string& path);

// The paths of the event files directly in `dir`, as TensorBoard finds
// them (names containing "tfevents"), sorted.
absl::StatusOr<std::vector<std::string>> ListEventFiles(const std::string& dir);

}  // namespace e3

#endif  // E3_COMMON_TENSORBOARD_EVENT_READER_H_
