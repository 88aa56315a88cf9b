// A damaged checksums.json in a checkpoint: refused naming the file, or a
// manifest of plain file names that writes back to the same manifest.
#include <cstdint>

#include "student_trainer/state/checkpoint_checksums.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto manifest = e3::ParseChecksumManifest(e3::fuzz::AsString(data, size), "ckpt/checksums.json");
  if (!manifest.ok()) {
    E3_FUZZ_CHECK(manifest.status().message().rfind("ckpt/checksums.json: ", 0) == 0);
    E3_FUZZ_CHECK(manifest.status().message().size() < 512);
    return 0;
  }
  for (const auto& [name, sum] : *manifest) {
    E3_FUZZ_CHECK(!name.empty() && name.find('/') == std::string::npos && sum.bytes >= 0);
  }
  auto again = e3::ParseChecksumManifest(e3::ChecksumManifestToJson(*manifest), "again");
  E3_FUZZ_CHECK(again.ok() && again->size() == manifest->size());
  return 0;
}
