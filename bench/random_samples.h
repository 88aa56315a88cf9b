// Deterministic token ids for the benchmarks' packed batches: xorshift64,
// independent of LibTorch's RNG, so every run and machine gets the same
// batches.
#ifndef E3_BENCH_RANDOM_SAMPLES_H_
#define E3_BENCH_RANDOM_SAMPLES_H_

#include <cstdint>
#include <vector>

namespace e3::bench {

// Sample lengths of a chat-like ragged batch (37..700 tokens).
inline constexpr int64_t kChatLikeLengths[] = {37, 512, 129, 700, 64, 301, 90, 448};

// One sample of each length, ids in [0, vocab), drawn from `seed` (non-zero).
inline std::vector<std::vector<int32_t>> RandomSamples(const std::vector<int64_t>& lengths, int64_t vocab,
                                                       uint64_t seed) {
  std::vector<std::vector<int32_t>> out;
  uint64_t x = seed;
  for (int64_t n : lengths) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& id : ids) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      id = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
    }
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace e3::bench

#endif  // E3_BENCH_RANDOM_SAMPLES_H_
