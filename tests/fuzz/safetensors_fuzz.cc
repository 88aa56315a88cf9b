// A hostile safetensors file (a model shard, a checkpoint, an optimizer
// state): Open either refuses it or hands out views that lie inside the
// file and agree with their shape and dtype.
#include <cstdint>

#include "common/model/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = e3::fuzz::AsFile(data, size, "model.safetensors");
  auto file = e3::SafetensorsFile::Open(path);
  if (!file.ok()) {
    E3_FUZZ_CHECK(!file.status().message().empty());
    return 0;
  }
  for (const std::string& name : (*file)->Names()) {
    auto view = (*file)->Get(name);
    E3_FUZZ_CHECK(view.ok());
    E3_FUZZ_CHECK(view->nbytes <= size);
    uint64_t numel = 1;
    for (int64_t d : view->shape) {
      E3_FUZZ_CHECK(d >= 0);
      numel *= static_cast<uint64_t>(d);
    }
    E3_FUZZ_CHECK(numel * e3::DTypeSize(view->dtype) == view->nbytes);
    // Touch every byte: a view outside the mapping faults under ASan.
    uint8_t sum = 0;
    for (size_t i = 0; i < view->nbytes; ++i) sum ^= view->data[i];
    (void)sum;
  }
  E3_FUZZ_CHECK(!(*file)->Get("\x01no such tensor").ok());
  return 0;
}
