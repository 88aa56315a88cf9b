#include "common/base/crc32c.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace e3 {

namespace crc32c_internal {

// ISA-L's crc32_iscsi neither inverts its initial value nor its result;
// the standard CRC-32C does both, so a standard CRC continues as
// ~crc32_iscsi(data, ~crc). ISA-L only reads the buffer it is given.
uint32_t Crc32cChunked(const void* data, size_t size, uint32_t crc, size_t max_chunk) {
  auto* bytes = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t state = ~crc;
  while (size > 0) {
    const size_t n = std::min(size, max_chunk);
    state = crc32_iscsi(bytes, static_cast<int>(n), state);
    bytes += n;
    size -= n;
  }
  return ~state;
}

}  // namespace crc32c_internal

namespace {

// Read size of Crc32cOfFile: large enough that the CRC, not the syscalls,
// sets the pace; small enough to cost little memory beside a checkpoint.
constexpr size_t kFileChunkBytes = size_t{4} << 20;

// TFRecord's mask constant (tensorflow/core/lib/hash/crc32c.h).
constexpr uint32_t kMaskDelta = 0xA282EAD8u;

// Crc32c of what is left to read from `fd`; `path` names it in errors.
absl::StatusOr<uint32_t> Crc32cOfDescriptor(int fd, const std::string& path) {
  std::vector<unsigned char> buffer(kFileChunkBytes);
  uint32_t crc = 0;
  uint64_t offset = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed at byte ", offset));
    }
    if (n == 0) return crc;
    crc = Crc32c(buffer.data(), static_cast<size_t>(n), crc);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  return crc32c_internal::Crc32cChunked(data, size, crc, INT_MAX);
}

uint32_t MaskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

absl::StatusOr<uint32_t> Crc32cOfFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open to checksum"));
  absl::StatusOr<uint32_t> crc = Crc32cOfDescriptor(fd, path);
  ::close(fd);
  return crc;
}

}  // namespace e3
