// The order in which one row's candidate logits compare for the target
// argmax, as at::argmax picks: a NaN beats everything, then the larger
// value (-0 ties with +0), then the lower column. Packed into one unsigned
// 64-bit key so that a GPU kernel can merge candidates from many tiles
// with atomicMax: the value's bits made monotonic in the high word, the
// complemented column in the low word. Key 0 is below every real key.
// Host and device code (hopper_gemm_kernel.cuh, row_argmax.cu,
// fp8_argmax.cu; tested on the CPU by tests/kernels/argmax_key_test).
#ifndef E3_KERNELS_ARGMAX_KEY_H_
#define E3_KERNELS_ARGMAX_KEY_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define E3_HOST_DEVICE __host__ __device__
#else
#define E3_HOST_DEVICE
#endif

namespace e3::kernels {

E3_HOST_DEVICE inline unsigned long long ArgmaxKey(float v, uint32_t col) {
  uint32_t ordered;
  if (v != v) {
    ordered = 0xffffffffu;
  } else {
    if (v == 0.f) v = 0.f;  // -0 ties with +0
    uint32_t u;
    memcpy(&u, &v, 4);
    ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  return (static_cast<unsigned long long>(ordered) << 32) | (0xffffffffu - col);
}

E3_HOST_DEVICE inline int32_t ArgmaxFromKey(unsigned long long key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu));
}

// The value a key was made from (a NaN for a NaN, +0 for -0; -inf for key
// 0, which no value makes): what a vocab-parallel rank sends its peers, so
// that they compare its best logit with theirs.
E3_HOST_DEVICE inline float ArgmaxValueFromKey(unsigned long long key) {
  const uint32_t ordered = static_cast<uint32_t>(key >> 32);
  uint32_t u;
  if (key == 0) {
    u = 0xff800000u;  // -inf
  } else if (ordered == 0xffffffffu) {
    u = 0x7fc00000u;  // a quiet NaN
  } else {
    u = (ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered;
  }
  float v;
  memcpy(&v, &u, 4);
  return v;
}

// The same order on (value, column) pairs, for reductions that keep the two
// apart (the row argmax kernel): whether (a, ia) beats (b, ib). Equal to
// ArgmaxKey(a, ia) > ArgmaxKey(b, ib) for distinct columns (argmax_key_test);
// a total order, so any reduction tree finds at::argmax's answer.
E3_HOST_DEVICE inline bool ArgmaxPrefers(float a, int32_t ia, float b, int32_t ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
  return a > b || (a == b && ia < ib);
}

}  // namespace e3::kernels

#undef E3_HOST_DEVICE

#endif  // E3_KERNELS_ARGMAX_KEY_H_
