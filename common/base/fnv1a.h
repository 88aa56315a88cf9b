// FNV-1a, 64 bits: fingerprints of inputs and checksums of fixtures, not a
// security boundary. Chained: pass the previous hash to continue it.
#ifndef E3_COMMON_BASE_FNV1A_H_
#define E3_COMMON_BASE_FNV1A_H_

#include <cstdint>
#include <string_view>

namespace e3 {

inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;
// The seed of the project's stored fingerprints (regeneration caches,
// chat templates): FNV's offset basis with its last digit lost. Kept, so
// that fingerprints already written stay valid.
inline constexpr uint64_t kFingerprintSeed = 1469598103934665603ull;

inline uint64_t Fnv1a(std::string_view bytes, uint64_t h = kFnv1aOffset) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace e3

#endif  // E3_COMMON_BASE_FNV1A_H_
