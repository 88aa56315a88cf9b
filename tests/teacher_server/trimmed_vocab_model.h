// A model directory with a shorter vocabulary, written for tests: real
// models come with vocabularies that are not multiples of 16 (32001 with an
// added pad token), which the lm_head's FP8 candidate search does not take
// and tensor parallelism splits unevenly.
#ifndef E3_TESTS_TEACHER_SERVER_TRIMMED_VOCAB_MODEL_H_
#define E3_TESTS_TEACHER_SERVER_TRIMMED_VOCAB_MODEL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/base/file_util.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"

namespace e3::testing {

// A copy of `model_dir` under `out_dir` with `trim` rows cut from the end
// of its vocabulary: config.json's vocab_size, the embedding's and the
// lm_head's rows (tied heads have only the embedding), in every weight file
// (a sharded model keeps its index: the names and files stay). Returns its
// path.
inline std::string TrimmedVocabModel(const std::string& model_dir, int64_t trim, const std::string& out_dir) {
  const std::string dir = JoinPath(out_dir, "trimmed_model");
  EXPECT_TRUE(MakeDirs(dir).ok());
  nlohmann::json config = nlohmann::json::parse(ReadFile(JoinPath(model_dir, "config.json")));
  const int64_t vocab = config.at("vocab_size").get<int64_t>() - trim;
  config["vocab_size"] = vocab;
  std::ofstream(JoinPath(dir, "config.json")) << config.dump(2) << "\n";
  std::set<std::string> files{"model.safetensors"};
  const std::string index = JoinPath(model_dir, "model.safetensors.index.json");
  if (PathExists(index)) {
    files.clear();
    const nlohmann::json weight_map = nlohmann::json::parse(ReadFile(index)).at("weight_map");
    for (const auto& entry : weight_map.items()) files.insert(entry.value().get<std::string>());
    std::ofstream(JoinPath(dir, "model.safetensors.index.json")) << ReadFile(index);
  }
  for (const std::string& f : files) {
    auto file = SafetensorsFile::Open(JoinPath(model_dir, f));
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) continue;
    std::vector<TensorToWrite> tensors;
    for (const std::string& name : (*file)->Names()) {
      auto view = (*file)->Get(name);
      EXPECT_TRUE(view.ok()) << view.status();
      TensorToWrite t{name, view->dtype, view->shape, {}};
      size_t bytes = view->nbytes;
      if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
        bytes = bytes / static_cast<size_t>(t.shape[0]) * static_cast<size_t>(vocab);
        t.shape[0] = vocab;
      }
      t.data.assign(view->data, view->data + bytes);
      tensors.push_back(std::move(t));
    }
    const absl::Status st = WriteSafetensors(JoinPath(dir, f), tensors, {{"format", "pt"}});
    EXPECT_TRUE(st.ok()) << st;
  }
  return dir;
}

}  // namespace e3::testing

#endif  // E3_TESTS_TEACHER_SERVER_TRIMMED_VOCAB_MODEL_H_
