// A hostile config.json (a model directory, or the one a teacher sends in
// GetInfo): refused naming the file, or a config whose dims a model can
// be built from.
#include <cstdint>

#include "common/model/model_config.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = e3::ParseModelConfig(e3::fuzz::AsString(data, size), "fuzz/config.json");
  if (!config.ok()) {
    E3_FUZZ_CHECK(config.status().message().find("fuzz/config.json") != std::string::npos);
    return 0;
  }
  E3_FUZZ_CHECK(config->hidden_size > 0 && config->num_hidden_layers > 0 && config->vocab_size > 0);
  E3_FUZZ_CHECK(config->num_attention_heads > 0 && config->num_key_value_heads > 0 &&
                config->head_dim > 0);
  E3_FUZZ_CHECK(config->num_attention_heads % config->num_key_value_heads == 0);
  for (int32_t id : config->DefaultAuxLayerIds())
    E3_FUZZ_CHECK(id >= 0 && id < config->num_hidden_layers);
  return 0;
}
