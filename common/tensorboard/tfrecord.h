// TFRecord framing, the container of TensorBoard event files: each record
// is its length (uint64, little-endian), the masked CRC-32C of those 8
// bytes (uint32 LE), the data, and the masked CRC-32C of the data (uint32
// LE). The length's own CRC lets a reader reject a corrupt length before
// trusting it to skip ahead.
#ifndef E3_COMMON_TENSORBOARD_TFRECORD_H_
#define E3_COMMON_TENSORBOARD_TFRECORD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace e3 {

// Bytes a record adds around its data.
inline constexpr size_t kTfRecordHeaderBytes = 12;
inline constexpr size_t kTfRecordFooterBytes = 4;

// Appends `data` to `out` as one framed record.
void AppendTfRecord(absl::string_view data, std::string* out);

// One record found in a file: where its header starts, and its data.
struct TfRecord {
  uint64_t offset = 0;
  absl::string_view data;
};

// Splits a whole file's bytes into its records (views into `bytes`),
// checking both CRCs of each. Errors are DataLoss naming `source` and the
// record's byte offset: "CRC mismatch" for corrupt bytes, "truncated
// record" for a last record that ends early (a torn write).
absl::StatusOr<std::vector<TfRecord>> SplitTfRecords(absl::string_view bytes,
                                                     const std::string& source);

}  // namespace e3

#endif  // E3_COMMON_TENSORBOARD_TFRECORD_H_
