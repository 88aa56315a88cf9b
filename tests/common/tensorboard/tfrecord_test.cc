// TFRecord framing byte for byte against a record built by TensorBoard's
// Python reader's own CRC code, and SplitTfRecords on good, corrupt and
// torn input.
#include "common/tensorboard/tfrecord.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace e3 {
namespace {

// "abc" framed with struct.pack and TensorBoard's masked_crc32c
// (tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py).
const std::string kAbcRecord(
    "\x03\x00\x00\x00\x00\x00\x00\x00\xb0\x99\x49\x0e"
    "abc"
    "\x6e\x57\xf1\x21",
    19);

std::string Framed(const std::vector<std::string>& records) {
  std::string out;
  for (const std::string& r : records) AppendTfRecord(r, &out);
  return out;
}

TEST(TfRecordTest, FramesLikeTensorBoard) { EXPECT_EQ(Framed({"abc"}), kAbcRecord); }

TEST(TfRecordTest, SplitsRecordsWithTheirOffsets) {
  const std::string bytes = Framed({"abc", "", std::string(1000, 'x')});
  absl::StatusOr<std::vector<TfRecord>> records = SplitTfRecords(bytes, "f");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[0].offset, 0u);
  EXPECT_EQ((*records)[0].data, "abc");
  EXPECT_EQ((*records)[1].offset, 19u);
  EXPECT_EQ((*records)[1].data, "");
  EXPECT_EQ((*records)[2].offset, 35u);
  EXPECT_EQ((*records)[2].data, std::string(1000, 'x'));
  EXPECT_TRUE(SplitTfRecords("", "f")->empty());
}

// Every prefix that ends inside the last record is a torn write.
TEST(TfRecordTest, EveryCutInsideTheLastRecordIsTruncation) {
  const std::string bytes = Framed({"abc", "defgh"});
  for (size_t cut = kAbcRecord.size() + 1; cut < bytes.size(); ++cut) {
    absl::StatusOr<std::vector<TfRecord>> records =
        SplitTfRecords(bytes.substr(0, cut), "f.tfrecord");
    ASSERT_FALSE(records.ok()) << "cut at " << cut;
    EXPECT_EQ(records.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(records.status().message().find("f.tfrecord: truncated record at offset 19"), 0u)
        << records.status();
  }
}

TEST(TfRecordTest, AFlippedBitFailsTheCrcOfItsPart) {
  const std::string bytes = Framed({"abc", "defgh"});
  const struct {
    size_t at;
    const char* message;
  } cases[] = {
      {19 + 2, "f: CRC mismatch in the length of the record at offset 19"},
      {19 + 9, "f: CRC mismatch in the length of the record at offset 19"},
      {19 + 12 + 4, "f: CRC mismatch in the data of the record at offset 19"},
      {bytes.size() - 1, "f: CRC mismatch in the data of the record at offset 19"},
  };
  for (const auto& c : cases) {
    std::string corrupt = bytes;
    corrupt[c.at] ^= 0x10;
    absl::StatusOr<std::vector<TfRecord>> records = SplitTfRecords(corrupt, "f");
    ASSERT_FALSE(records.ok()) << "byte " << c.at;
    EXPECT_EQ(records.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(records.status().message(), c.message) << "byte " << c.at;
  }
}

}  // namespace
}  // namespace e3
