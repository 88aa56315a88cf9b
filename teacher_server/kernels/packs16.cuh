// What the memory-bound kernels share about their 16-byte accesses: a load
// or store moves 8 elements of a 2-byte dtype, and needs a 16-byte aligned
// address (checked on the host before a vectorised launch).
#ifndef E3_TEACHER_SERVER_KERNELS_PACKS16_CUH_
#define E3_TEACHER_SERVER_KERNELS_PACKS16_CUH_

#include <cstdint>

namespace e3::kernels {

constexpr int kPack16Elems = 8;  // bf16 or fp16 elements in 16 bytes

inline bool Is16ByteAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace e3::kernels

#endif  // E3_TEACHER_SERVER_KERNELS_PACKS16_CUH_
