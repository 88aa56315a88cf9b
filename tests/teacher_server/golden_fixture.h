// Loads a golden case written by tests/golden/make_llama_golden.py.
#ifndef E3_TESTS_TEACHER_SERVER_GOLDEN_FIXTURE_H_
#define E3_TESTS_TEACHER_SERVER_GOLDEN_FIXTURE_H_

#include <map>
#include <string>
#include <vector>

#include "common/model/safetensors.h"
#include "common/torch/tensor_convert.h"
#include "common/torch/torch_core.h"
#include "nlohmann/json.hpp"
#include "tests/rel_inf.h"

namespace e3::testing {

struct GoldenCase {
  std::string name;
  std::string model_dir;
  std::vector<int32_t> aux_layer_ids;
  std::vector<int64_t> cu_seqlens;
  nlohmann::json meta;
  std::map<std::string, at::Tensor> tensors;  // fp32 / int as stored
};

inline std::string SourcePath(const std::string& rel) { return std::string(E3_SOURCE_DIR) + "/" + rel; }

inline GoldenCase LoadGoldenCase(const std::string& name) {
  GoldenCase c;
  c.name = name;
  auto file = SafetensorsFile::Open(SourcePath("tests/fixtures/golden/" + name + ".safetensors"));
  if (!file.ok()) throw std::runtime_error(std::string(file.status().message()));
  c.meta = nlohmann::json::parse((*file)->metadata().at("meta"));
  c.model_dir = SourcePath(c.meta.at("model_dir").get<std::string>());
  c.aux_layer_ids = c.meta.at("aux_layer_ids").get<std::vector<int32_t>>();
  for (const auto& tname : (*file)->Names()) {
    auto view = (*file)->Get(tname);
    auto type = ToScalarType(view->dtype);
    c.tensors[tname] = *ViewToTensor(*view, *type);
  }
  at::Tensor cu = c.tensors.at("cu_seqlens").to(at::kLong);
  c.cu_seqlens.assign(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
  return c;
}

}  // namespace e3::testing

#endif  // E3_TESTS_TEACHER_SERVER_GOLDEN_FIXTURE_H_
