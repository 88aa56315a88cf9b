#include "common/tensorboard/event_reader.h"

#include <climits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/tensorboard/summary.pb.h"
#include "common/tensorboard/tfrecord.h"

namespace e3 {
namespace {

// Adds what one Event says to `contents`.
void CollectEvent(const tensorboard::Event& event, EventFileContents* contents) {
  if (event.what_case() == tensorboard::Event::kFileVersion) {
    contents->file_version = event.file_version();
    contents->writer = event.source_metadata().writer();
    return;
  }
  for (const tensorboard::Summary::Value& value : event.summary().value()) {
    if (value.value_case() != tensorboard::Summary::Value::kSimpleValue) continue;
    contents->scalars.push_back(
        {event.wall_time(), event.step(), value.tag(), value.simple_value()});
  }
}

}  // namespace

absl::StatusOr<EventFileContents> ReadEventFile(const std::string& path) {
  E3_ASSIGN_OR_RETURN(const std::string bytes, ReadFileToString(path));
  E3_ASSIGN_OR_RETURN(const std::vector<TfRecord> records, SplitTfRecords(bytes, path));
  EventFileContents contents;
  tensorboard::Event event;
  for (const TfRecord& record : records) {
    const bool parsed =
        record.data.size() <= static_cast<size_t>(INT_MAX) &&
        event.ParseFromArray(record.data.data(), static_cast<int>(record.data.size()));
    if (!parsed) {
      return absl::DataLossError(
          absl::StrCat(path, ": the record at offset ", record.offset, " is not an Event proto"));
    }
    CollectEvent(event, &contents);
  }
  return contents;
}

absl::StatusOr<std::vector<ScalarEvent>> ReadScalarEvents(const std::string& path) {
  E3_ASSIGN_OR_RETURN(EventFileContents contents, ReadEventFile(path));
  return std::move(contents.scalars);
}

absl::StatusOr<std::vector<std::string>> ListEventFiles(const std::string& dir) {
  E3_ASSIGN_OR_RETURN(const std::vector<std::string> names, ListDir(dir));
  std::vector<std::string> paths;
  for (const std::string& name : names) {
    if (absl::StrContains(name, "tfevents")) paths.push_back(JoinPath(dir, name));
  }
  return paths;
}

}  // namespace e3
