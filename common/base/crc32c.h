// CRC-32C (Castagnoli, the iSCSI polynomial): the checksum of TFRecord
// framing (TensorBoard event files) and of checkpoint files. Computed by
// Intel ISA-L, which picks SSE4.2/AVX-512 code at run time.
#ifndef E3_COMMON_BASE_CRC32C_H_
#define E3_COMMON_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace e3 {

// The standard CRC-32C of `size` bytes, continuing `crc` (the CRC of the
// bytes before them; 0 to start): Crc32c("123456789") == 0xE3069283 and
// Crc32c(b, nb, Crc32c(a, na)) == Crc32c(a followed by b).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// TFRecord's masked CRC-32C of `size` bytes: rotated and offset so that a
// CRC stored inside checksummed data does not checksum to a fixed value
// (tensorflow/core/lib/hash/crc32c.h, Mask).
uint32_t MaskedCrc32c(const void* data, size_t size);

// Crc32c of a whole file, read in pieces; errors name the file.
absl::StatusOr<uint32_t> Crc32cOfFile(const std::string& path);

namespace crc32c_internal {

// Crc32c, handing ISA-L at most `max_chunk` bytes per call (its length is
// an int). Crc32c passes INT_MAX; tests pass small chunks.
uint32_t Crc32cChunked(const void* data, size_t size, uint32_t crc, size_t max_chunk);

}  // namespace crc32c_internal

}  // namespace e3

#endif  // E3_COMMON_BASE_CRC32C_H_
