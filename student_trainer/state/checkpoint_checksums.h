// A checkpoint's manifest of its files: each one's size and CRC-32C, in
// checksums.json, written after every other file and checked before any
// is read. A flipped byte in a weight file parses as well as the original
// and would be trained on silently; with the manifest it is damage like a
// truncated file, and the resume falls back to an older checkpoint. No
// LibTorch here: the reader is fuzzed with the trainer state's.
#ifndef E3_STUDENT_TRAINER_STATE_CHECKPOINT_CHECKSUMS_H_
#define E3_STUDENT_TRAINER_STATE_CHECKPOINT_CHECKSUMS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace e3 {

inline constexpr char kChecksumsFile[] = "checksums.json";

struct FileChecksum {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};
using ChecksumManifest = std::map<std::string, FileChecksum>;  // file name -> its checksum

std::string ChecksumManifestToJson(const ChecksumManifest& manifest);
// `source` names the file in errors; DataLoss when a field is missing or
// of the wrong type, or a name is not a plain file name.
absl::StatusOr<ChecksumManifest> ParseChecksumManifest(const std::string& text, const std::string& source);

// Checksums every regular file in `dir` and writes the manifest there
// (atomically, fsynced).
absl::Status WriteChecksums(const std::string& dir);
// OK when `dir` has no manifest (a checkpoint written before they were
// kept) or every file it lists has its recorded size and CRC; DataLoss
// naming the first file that does not.
absl::Status VerifyChecksums(const std::string& dir);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STATE_CHECKPOINT_CHECKSUMS_H_
