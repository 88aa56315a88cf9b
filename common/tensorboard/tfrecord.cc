#include "common/tensorboard/tfrecord.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"

namespace e3 {
namespace {

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t ReadLittleEndian(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return value;
}

// Whether the 4 bytes at `stored` hold the masked CRC of `data`.
bool CrcMatches(absl::string_view data, const char* stored) {
  return ReadLittleEndian(stored, 4) == MaskedCrc32c(data.data(), data.size());
}

absl::Status Truncated(const std::string& source, uint64_t offset, uint64_t needed, size_t left) {
  return absl::DataLossError(absl::StrCat(source, ": truncated record at offset ", offset,
                                          " (needs ", needed, " bytes, ", left,
                                          " left in the file)"));
}

absl::Status CrcMismatch(const std::string& source, uint64_t offset, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat(source, ": CRC mismatch in the ", what, " of the record at offset ", offset));
}

// The record at the start of `rest` (which begins at `offset` of the file).
absl::StatusOr<TfRecord> NextRecord(absl::string_view rest, uint64_t offset,
                                    const std::string& source) {
  if (rest.size() < kTfRecordHeaderBytes) {
    return Truncated(source, offset, kTfRecordHeaderBytes, rest.size());
  }
  if (!CrcMatches(rest.substr(0, 8), rest.data() + 8)) return CrcMismatch(source, offset, "length");
  const uint64_t length = ReadLittleEndian(rest.data(), 8);
  const size_t frame = kTfRecordHeaderBytes + kTfRecordFooterBytes;
  if (rest.size() < frame || length > rest.size() - frame) {
    return Truncated(source, offset, length + frame, rest.size());
  }
  const absl::string_view data = rest.substr(kTfRecordHeaderBytes, length);
  if (!CrcMatches(data, data.data() + length)) return CrcMismatch(source, offset, "data");
  return TfRecord{offset, data};
}

}  // namespace

void AppendTfRecord(absl::string_view data, std::string* out) {
  std::string header;
  AppendLittleEndian(data.size(), 8, &header);
  AppendLittleEndian(MaskedCrc32c(header.data(), header.size()), 4, &header);
  out->append(header);
  out->append(data.data(), data.size());
  AppendLittleEndian(MaskedCrc32c(data.data(), data.size()), 4, out);
}

absl::StatusOr<std::vector<TfRecord>> SplitTfRecords(absl::string_view bytes,
                                                     const std::string& source) {
  std::vector<TfRecord> records;
  uint64_t offset = 0;
  while (offset < bytes.size()) {
    absl::StatusOr<TfRecord> record = NextRecord(bytes.substr(offset), offset, source);
    if (!record.ok()) return record.status();
    offset += kTfRecordHeaderBytes + record->data.size() + kTfRecordFooterBytes;
    records.push_back(*record);
  }
  return records;
}

}  // namespace e3
