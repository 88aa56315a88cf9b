#include "common/model/model_dir.h"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::unique_ptr<ModelDir>> ModelDir::Open(const std::string& dir) {
  auto out = std::unique_ptr<ModelDir>(new ModelDir());
  out->dir_ = dir;
  E3_ASSIGN_OR_RETURN(out->config_, LoadModelConfig(dir + "/config.json"));

  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> index;  // tensor -> shard file name
  if (FileExists(index_path)) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::DataLossError(absl::StrCat(index_path, ": expected a JSON object with a \"weight_map\" object"));
    }
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::DataLossError(absl::StrCat(index_path, ": weight_map.\"", it.key(), "\" is not a file name"));
      }
      std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos) {
        return absl::DataLossError(absl::StrCat(index_path, ": weight_map.\"", it.key(),
                                                "\" points outside the directory: ", file));
      }
      index[it.key()] = file;
      shards.insert(file);
    }
    shard_names.assign(shards.begin(), shards.end());
  } else if (FileExists(single_path)) {
    shard_names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
  }

  std::map<std::string, const SafetensorsFile*> by_file;
  for (const std::string& shard : shard_names) {
    E3_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/" + shard));
    by_file[shard] = file.get();
    out->files_.push_back(std::move(file));
  }
  if (index.empty()) {
    for (const auto& name : out->files_[0]->Names()) index[name] = shard_names[0];
  }
  for (const auto& [name, shard] : index) {
    const SafetensorsFile* file = by_file.at(shard);
    if (!file->Contains(name)) {
      return absl::DataLossError(absl::StrCat(index_path, ": tensor \"", name, "\" is mapped to ", shard,
                                              " but that file does not hold it"));
    }
    out->where_[name] = file;
    auto view = file->Get(name);
    out->total_bytes_ += static_cast<int64_t>(view->nbytes);
  }
  return out;
}

absl::StatusOr<TensorView> ModelDir::Get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": missing tensor \"", name, "\""));
  }
  return it->second->Get(name);
}

absl::StatusOr<TensorView> ModelDir::Get(const std::string& name, const std::vector<int64_t>& shape) const {
  E3_ASSIGN_OR_RETURN(TensorView view, Get(name));
  if (view.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor \"", name, "\" has shape ",
                                                   ShapeString(view.shape), ", expected ", ShapeString(shape),
                                                   " from ", config_.source));
  }
  return view;
}

std::vector<std::string> ModelDir::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : where_) names.push_back(name);
  return names;
}

}  // namespace e3
