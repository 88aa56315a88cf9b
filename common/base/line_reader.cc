#include "common/base/line_reader.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"

namespace e3 {
namespace {

constexpr size_t kChunk = 1 << 20;

bool HasGzipMagic(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char magic[2] = {0, 0};
  const size_t n = std::fread(magic, 1, 2, f);
  std::fclose(f);
  return n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path) {
  if (!PathExists(path)) return absl::NotFoundError(absl::StrCat("file not found: ", path));
  if (IsDirectory(path)) return absl::InvalidArgumentError(absl::StrCat(path, " is a directory; expected a file"));
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  gzbuffer(file, kChunk);
  auto reader = std::unique_ptr<LineReader>(new LineReader());
  reader->path_ = path;
  reader->file_ = file;
  reader->compressed_ = HasGzipMagic(path);
  return reader;
}

LineReader::~LineReader() {
  if (file_ != nullptr) gzclose(static_cast<gzFile>(file_));
}

bool LineReader::Fill() {
  if (eof_ || !status_.ok()) return false;
  buffer_.erase(0, at_);
  at_ = 0;
  const size_t old = buffer_.size();
  buffer_.resize(old + kChunk);
  const int n = gzread(static_cast<gzFile>(file_), &buffer_[old], static_cast<unsigned>(kChunk));
  if (n < 0) {
    int code = 0;
    const char* why = gzerror(static_cast<gzFile>(file_), &code);
    status_ = absl::DataLossError(absl::StrCat("read error in ", path_, ": ", why));
    buffer_.resize(old);
    return false;
  }
  buffer_.resize(old + static_cast<size_t>(n));
  if (n == 0) {
    eof_ = true;
    int code = 0;
    const char* why = gzerror(static_cast<gzFile>(file_), &code);
    // A truncated gzip stream ends in Z_BUF_ERROR ("unexpected end of file").
    if (code != Z_OK && code != Z_STREAM_END) status_ = absl::DataLossError(absl::StrCat(path_, ": ", why));
    return false;
  }
  return true;
}

bool LineReader::Next(std::string* line, size_t* skipped_bytes) {
  size_t skipped = 0;  // bytes of an over-long line dropped so far
  if (skipped_bytes != nullptr) *skipped_bytes = 0;
  while (true) {
    const size_t newline = buffer_.find('\n', at_);
    const size_t length = (newline == std::string::npos ? buffer_.size() : newline) - at_;
    if (max_line_bytes_ > 0 && skipped + length > max_line_bytes_) {
      // Over the limit: what is buffered goes, and the rest of the line
      // is read past chunk by chunk.
      skipped += length;
      at_ += length;
      if (newline != std::string::npos) {
        ++at_;
        line->clear();
        if (skipped_bytes != nullptr) *skipped_bytes = skipped;
        return true;
      }
    } else if (newline != std::string::npos) {
      line->assign(buffer_, at_, length);
      at_ = newline + 1;
      return true;
    }
    if (!Fill()) break;
  }
  if (!status_.ok()) return false;
  if (skipped > 0) {  // the last line, over the limit
    line->clear();
    if (skipped_bytes != nullptr) *skipped_bytes = skipped;
    return true;
  }
  if (at_ >= buffer_.size()) return false;
  line->assign(buffer_, at_, std::string::npos);  // the last line, without '\n'
  at_ = buffer_.size();
  return true;
}

}  // namespace e3
