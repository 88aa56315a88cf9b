// A Hugging Face model directory: config.json plus weights in
// model.safetensors or in shards listed by model.safetensors.index.json.
// Shards are mmap'd once; lookups return views into them.
#ifndef E3_COMMON_MODEL_MODEL_DIR_H_
#define E3_COMMON_MODEL_MODEL_DIR_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"

namespace e3 {

class ModelDir {
 public:
  static absl::StatusOr<std::unique_ptr<ModelDir>> Open(const std::string& dir);

  const std::string& path() const { return dir_; }
  const ModelConfig& config() const { return config_; }

  bool Contains(const std::string& name) const { return where_.count(name) > 0; }
  // NotFound names the directory, the tensor and the file the index points to.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  // Also checks the shape; the error gives both shapes and the file.
  absl::StatusOr<TensorView> Get(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> TensorNames() const;
  int64_t total_bytes() const { return total_bytes_; }

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  int64_t total_bytes_ = 0;
};

std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace e3

#endif  // E3_COMMON_MODEL_MODEL_DIR_H_
