// A deterministic dataset of short random samples (5..60 tokens, ids below
// 256, every third position untrained) for the engine and service tests.
#ifndef E3_TESTS_TEACHER_SERVER_SYNTHETIC_DATASET_H_
#define E3_TESTS_TEACHER_SERVER_SYNTHETIC_DATASET_H_

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/data/dataset.h"

namespace e3::testing {

inline std::unique_ptr<Dataset> MakeSyntheticDataset(int num_samples, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Sample> samples;
  for (int i = 0; i < num_samples; ++i) {
    Sample s;
    const int n = 5 + static_cast<int>(rng() % 56);
    for (int t = 0; t < n; ++t) {
      s.input_ids.push_back(static_cast<int32_t>(rng() % 256));
      s.loss_mask.push_back(t % 3 != 0);
    }
    samples.push_back(std::move(s));
  }
  return Dataset::FromSamples(std::move(samples), "synthetic");
}

}  // namespace e3::testing

#endif  // E3_TESTS_TEACHER_SERVER_SYNTHETIC_DATASET_H_
