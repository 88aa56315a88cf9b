#include "common/transport/batch_payload.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace e3 {
namespace {
constexpr size_t kAlign = 64;  // cache line; also satisfies every dtype
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

absl::StatusOr<PayloadLayout> PayloadBuffer::LayOut(const std::vector<PayloadSource>& sources) {
  PayloadLayout layout;
  size_t offset = 0;
  for (const auto& s : sources) {
    size_t numel = 1;
    for (int64_t d : s.shape) numel *= static_cast<size_t>(d);
    if (numel * DTypeSize(s.dtype) != s.nbytes) {
      return absl::InternalError(absl::StrCat("payload tensor ", s.name, ": ", s.nbytes, " bytes for ",
                                              numel, " elements of ", std::string(DTypeName(s.dtype))));
    }
    layout.tensors.push_back({s.name, s.dtype, s.shape, offset, s.nbytes});
    offset = AlignUp(offset + s.nbytes);
  }
  layout.total_bytes = offset;
  return layout;
}

absl::StatusOr<std::unique_ptr<PayloadBuffer>> PayloadBuffer::Build(TransportKind transport,
                                                                    const std::vector<PayloadSource>& sources,
                                                                    const std::string& shm_name) {
  auto layout = LayOut(sources);
  if (!layout.ok()) return layout.status();
  auto out = std::unique_ptr<PayloadBuffer>(new PayloadBuffer());
  out->transport_ = transport;
  out->tensors_ = std::move(layout->tensors);
  out->total_bytes_ = layout->total_bytes;
  uint8_t* dst = nullptr;
  if (transport == TransportKind::kShm) {
    auto seg = ShmSegment::Create(shm_name, out->total_bytes_);
    if (!seg.ok()) return seg.status();
    out->shm_ = std::move(seg).value();
    out->shm_name_ = shm_name;
    dst = out->shm_->data();
  } else if (transport == TransportKind::kInline) {
    out->bytes_.resize(out->total_bytes_);
    dst = out->bytes_.data();
  } else {
    return absl::InvalidArgumentError(absl::StrCat("payload transport ", TransportName(transport),
                                                   " keeps its bytes on a GPU: build it with BuildDevicePayload"));
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].nbytes > 0) std::memcpy(dst + out->tensors_[i].offset, sources[i].data, sources[i].nbytes);
  }
  return out;
}

std::unique_ptr<PayloadBuffer> PayloadBuffer::OnDevice(TransportKind transport, PayloadLayout layout,
                                                       std::shared_ptr<DeviceMemory> memory) {
  auto out = std::unique_ptr<PayloadBuffer>(new PayloadBuffer());
  out->transport_ = transport;
  out->tensors_ = std::move(layout.tensors);
  out->total_bytes_ = layout.total_bytes;
  out->device_ = std::move(memory);
  return out;
}

const uint8_t* PayloadBuffer::data() const {
  if (device_) return nullptr;
  return shm_ ? shm_->data() : bytes_.data();
}

}  // namespace e3
