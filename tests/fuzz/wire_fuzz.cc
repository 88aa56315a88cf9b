// Hostile messages from a teacher, as the student decodes them (chosen by
// the first byte): a BatchDescriptor or an eval-set chunk resolved into
// tensors (proto/wire_codec.h), a GetWeights stream assembled under the
// dims of a small model (proto/weight_download.h), a GetInfo response's
// config and weight shapes. Refused with a message, or tensors whose bytes
// lie in memory the student holds and agree with shape and dtype.

#include <cstdint>
#include <cstring>

#include "common/model/model_config.h"
#include "proto/weight_download.h"
#include "proto/wire_codec.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/quiet_protobuf_init.h"

namespace {

// The prefix a teacher would announce in GetInfo: segments named otherwise
// must be refused before anything is opened.
constexpr char kTeacherShmPrefix[] = "/e3-1-";

void Resolve(const e3::v1::BatchDescriptor& d) {
  auto batch = e3::ReceivedBatch::Resolve(d, kTeacherShmPrefix);
  if (!batch.ok()) {
    E3_FUZZ_CHECK(!batch.status().message().empty());
    return;
  }
  for (const e3::v1::TensorRef& ref : d.tensors()) {
    auto t = (*batch)->Get(ref.name());
    E3_FUZZ_CHECK(t.ok());
    uint64_t numel = 1;
    for (int64_t x : t->shape) numel *= static_cast<uint64_t>(x);
    E3_FUZZ_CHECK(numel * e3::DTypeSize(t->dtype) == t->nbytes);
    if (t->data == nullptr) {
      // A device payload: the range lies in the block the client fetches.
      E3_FUZZ_CHECK((*batch)->on_device() && t->offset + t->nbytes <= (*batch)->payload_bytes());
      continue;
    }
    uint8_t sum = 0;
    for (size_t i = 0; i < t->nbytes; ++i) sum ^= t->data[i];
    (void)sum;
  }
}

// The rest of the input as WeightChunks, each a 2-byte length and that
// many bytes of message.
void Weights(const uint8_t* data, size_t size) {
  e3::v1::ModelInfo m;
  m.set_vocab_size(16);
  m.set_draft_vocab_size(4);
  m.set_hidden_size(8);
  e3::WeightDownload download(e3::ExpectedWeightsOf(m).value(), 1024, "fuzz teacher");
  while (size >= 2) {
    const size_t n = std::min<size_t>(size - 2, data[0] | (size_t{data[1]} << 8));
    e3::v1::WeightChunk chunk;
    if (!chunk.ParseFromArray(data + 2, static_cast<int>(n))) return;
    data += 2 + n;
    size -= 2 + n;
    absl::Status s = download.Add(chunk);
    E3_FUZZ_CHECK(download.total_bytes() <= 1024);
    if (!s.ok()) return;
  }
  for (const char* name : {"embed_tokens", "target_head", "target_head_rest", "d2t", "t2d"}) {
    auto t = download.Get(name);
    if (!t.ok()) continue;
    uint8_t sum = 0;
    for (size_t i = 0; i < t->nbytes; ++i) sum ^= t->data[i];
    (void)sum;
  }
}

void Info(const e3::v1::GetInfoResponse& resp) {
  auto config = e3::ParseModelConfig(resp.model().config_json(), "teacher config.json");
  auto expected = e3::ExpectedWeightsOf(resp.model());
  if (!expected.ok()) return;
  for (const auto& [name, w] : *expected) {
    for (int64_t d : w.shape) E3_FUZZ_CHECK(d >= 0);
  }
  (void)config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t kind = data[0] % 4;
  ++data;
  --size;
  switch (kind) {
    case 0: {
      e3::v1::BatchDescriptor d;
      if (d.ParseFromArray(data, static_cast<int>(size))) Resolve(d);
      break;
    }
    case 1: {
      e3::v1::EvalSetChunk c;
      if (c.ParseFromArray(data, static_cast<int>(size))) Resolve(c.batch());
      break;
    }
    case 2:
      Weights(data, size);
      break;
    default: {
      e3::v1::GetInfoResponse r;
      if (r.ParseFromArray(data, static_cast<int>(size))) Info(r);
      break;
    }
  }
  return 0;
}
