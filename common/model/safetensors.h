// Reader and writer for the safetensors format
// (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header mapping names to {dtype, shape, data_offsets}, then
// the raw data. The reader validates every field against the file before
// handing out a view, so a corrupt file is an error, never a crash.
#ifndef E3_COMMON_MODEL_SAFETENSORS_H_
#define E3_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mmap_file.h"
#include "common/model/dtype.h"

namespace e3 {

// A tensor's bytes inside a mapped file. Valid while its file is open.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // where it came from, for error messages

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  bool Contains(const std::string& name) const { return tensors_.count(name) > 0; }
  // NotFound naming the file and the tensor when absent.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  std::vector<std::string> Names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::unique_ptr<MmapFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write; `data` must hold numel * DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// Writes atomically and durably (WriteFilePiecesAtomically: temp file,
// fsync, rename, fsync of the directory), tensors in name order, each
// aligned to 8 bytes as the reference writer does. A failed write names the
// file and the bytes it could not write, and leaves the old file.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace e3

#endif  // E3_COMMON_MODEL_SAFETENSORS_H_
