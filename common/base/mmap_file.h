// A read-only memory map of a whole file. Weights are read through it so a
// model is never copied into process memory twice.
#ifndef E3_COMMON_BASE_MMAP_FILE_H_
#define E3_COMMON_BASE_MMAP_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace e3 {

class MmapFile {
 public:
  static absl::StatusOr<std::unique_ptr<MmapFile>> Open(const std::string& path);
  ~MmapFile();
  MmapFile(const MmapFile&) = delete;
  MmapFile& operator=(const MmapFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MmapFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace e3

#endif  // E3_COMMON_BASE_MMAP_FILE_H_
