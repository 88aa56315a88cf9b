// Reads a text file line by line, gzip-compressed (.jsonl.gz, detected by
// its magic bytes, not its name) or plain. Lines may be of any length.
#ifndef E3_COMMON_BASE_LINE_READER_H_
#define E3_COMMON_BASE_LINE_READER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace e3 {

class LineReader {
 public:
  // NotFound / PermissionDenied naming the path when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\n' (a trailing '\r' is kept); false at the
  // end of the file or on an error, which status() then reports. A line
  // longer than set_max_line_bytes is skipped unread, never held whole: it
  // comes back empty with its length in *skipped_bytes (0 otherwise).
  bool Next(std::string* line, size_t* skipped_bytes = nullptr);
  // 0: lines of any length.
  void set_max_line_bytes(size_t bytes) { max_line_bytes_ = bytes; }
  // Ok, or DataLoss naming the path (a truncated or corrupt gzip stream,
  // a read error).
  const absl::Status& status() const { return status_; }
  bool compressed() const { return compressed_; }

 private:
  LineReader() = default;
  bool Fill();

  std::string path_;
  void* file_ = nullptr;  // gzFile; zlib reads plain files through as well
  bool compressed_ = false;
  std::string buffer_;
  size_t at_ = 0;
  bool eof_ = false;
  size_t max_line_bytes_ = 0;
  absl::Status status_;
};

}  // namespace e3

#endif  // E3_COMMON_BASE_LINE_READER_H_
