// ReadEventFile on damaged files: a flipped byte fails as DataLoss naming
// the file and the record's offset, a file cut inside its last record says
// "truncated record", a record that is no Event is named; events other
// than simple_value scalars are skipped; ListEventFiles keeps TensorBoard's
// files only.
#include "common/tensorboard/event_reader.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/tensorboard/event_writer.h"
#include "common/tensorboard/summary.pb.h"
#include "common/tensorboard/tfrecord.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

// A file of the version record and three scalars; returns its path.
std::string WriteThreeScalars(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<EventFileWriter>> writer = EventFileWriter::Open(dir);
  EXPECT_TRUE(writer.ok()) << writer.status();
  if (!writer.ok()) return "";
  for (int step = 1; step <= 3; ++step) {
    EXPECT_TRUE((*writer)->AddScalar("loss", step, 1.0 / step).ok());
  }
  return (*writer)->path();
}

std::string Contents(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

// The offset of each record of the file at `path`.
std::vector<uint64_t> RecordOffsets(const std::string& path) {
  absl::StatusOr<std::vector<TfRecord>> records = SplitTfRecords(Contents(path), path);
  EXPECT_TRUE(records.ok()) << records.status();
  std::vector<uint64_t> offsets;
  if (records.ok()) {
    for (const TfRecord& r : *records) offsets.push_back(r.offset);
  }
  return offsets;
}

void Overwrite(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
}

TEST(EventReaderTest, AFlippedDataByteNamesTheFileAndOffset) {
  const std::string path = WriteThreeScalars(testing::ScratchDir("event_reader_flip"));
  const std::vector<uint64_t> offsets = RecordOffsets(path);
  ASSERT_EQ(offsets.size(), 4u);
  std::string bytes = Contents(path);
  bytes[offsets[2] + kTfRecordHeaderBytes + 3] ^= 0x01;
  Overwrite(path, bytes);
  absl::StatusOr<EventFileContents> contents = ReadEventFile(path);
  ASSERT_FALSE(contents.ok());
  EXPECT_EQ(contents.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(contents.status().message(),
            absl::StrCat(path, ": CRC mismatch in the data of the record at offset ", offsets[2]));
}

TEST(EventReaderTest, AFileCutInsideItsLastRecordIsTruncated) {
  const std::string path = WriteThreeScalars(testing::ScratchDir("event_reader_cut"));
  const std::vector<uint64_t> offsets = RecordOffsets(path);
  ASSERT_EQ(offsets.size(), 4u);
  const std::string bytes = Contents(path);
  for (size_t keep : {offsets[3] + 5, bytes.size() - 1}) {
    Overwrite(path, bytes.substr(0, keep));
    absl::StatusOr<std::vector<ScalarEvent>> scalars = ReadScalarEvents(path);
    ASSERT_FALSE(scalars.ok()) << "kept " << keep;
    EXPECT_EQ(scalars.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(scalars.status().message().find(
                  absl::StrCat(path, ": truncated record at offset ", offsets[3])),
              absl::string_view::npos)
        << scalars.status();
  }
  Overwrite(path, bytes.substr(0, offsets[3]));
  absl::StatusOr<std::vector<ScalarEvent>> whole_records = ReadScalarEvents(path);
  ASSERT_TRUE(whole_records.ok()) << whole_records.status();
  EXPECT_EQ(whole_records->size(), 2u);
}

TEST(EventReaderTest, ARecordThatIsNoEventIsNamed) {
  const std::string path = WriteThreeScalars(testing::ScratchDir("event_reader_garbage"));
  std::string bytes = Contents(path);
  const size_t offset = bytes.size();
  AppendTfRecord("\x0f\x0f\x0f", &bytes);  // field 1 with wire type 7: no proto
  Overwrite(path, bytes);
  absl::StatusOr<EventFileContents> contents = ReadEventFile(path);
  ASSERT_FALSE(contents.ok());
  EXPECT_EQ(contents.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(contents.status().message(),
            absl::StrCat(path, ": the record at offset ", offset, " is not an Event proto"));
}

// Tensor-form values (what newer writers emit) are skipped; a simple_value
// beside one in the same summary is read.
TEST(EventReaderTest, SkipsValuesOtherThanSimpleValue) {
  const std::string path = WriteThreeScalars(testing::ScratchDir("event_reader_skip"));
  tensorboard::Event event;
  event.set_step(4);
  tensorboard::Summary::Value* tensor_value = event.mutable_summary()->add_value();
  tensor_value->set_tag("tensor_form");
  tensor_value->mutable_tensor()->set_dtype(tensorboard::DT_FLOAT);
  tensor_value->mutable_tensor()->add_float_val(3.0f);
  tensorboard::Summary::Value* simple = event.mutable_summary()->add_value();
  simple->set_tag("loss");
  simple->set_simple_value(0.25f);
  std::string bytes = Contents(path);
  AppendTfRecord(event.SerializeAsString(), &bytes);
  Overwrite(path, bytes);
  absl::StatusOr<std::vector<ScalarEvent>> scalars = ReadScalarEvents(path);
  ASSERT_TRUE(scalars.ok()) << scalars.status();
  ASSERT_EQ(scalars->size(), 4u);
  EXPECT_EQ(scalars->back().tag, "loss");
  EXPECT_EQ(scalars->back().step, 4);
  EXPECT_EQ(scalars->back().value, 0.25f);
}

TEST(EventReaderTest, ListsOnlyEventFiles) {
  const std::string dir = testing::ScratchDir("event_reader_list");
  const std::string path = WriteThreeScalars(dir);
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "steps.jsonl"), "{}\n").ok());
  absl::StatusOr<std::vector<std::string>> files = ListEventFiles(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, std::vector<std::string>{path});
  EXPECT_FALSE(ListEventFiles(JoinPath(dir, "missing")).ok());
}

TEST(EventReaderTest, AMissingFileIsNamed) {
  const std::string path =
      JoinPath(testing::ScratchDir("event_reader_missing"), "events.out.tfevents.x");
  absl::StatusOr<EventFileContents> contents = ReadEventFile(path);
  ASSERT_FALSE(contents.ok());
  EXPECT_NE(contents.status().message().find(path), absl::string_view::npos) << contents.status();
}

}  // namespace
}  // namespace e3
