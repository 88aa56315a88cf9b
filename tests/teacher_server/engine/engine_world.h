// What the teacher-engine tests share: the engine's world on a real small
// model (rand_default_mha: 6 layers of hidden size 64) over a synthetic
// dataset, and the wait for a subscription's next batch (the engine's
// worker computes asynchronously, so a loaded machine may take seconds).
#ifndef E3_TESTS_TEACHER_SERVER_ENGINE_ENGINE_WORLD_H_
#define E3_TESTS_TEACHER_SERVER_ENGINE_ENGINE_WORLD_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#include "common/model/model_dir.h"
#include "teacher_server/engine/engine.h"
#include "tests/teacher_server/golden_fixture.h"
#include "tests/teacher_server/synthetic_dataset.h"

namespace e3::testing {

struct EngineWorld {
  std::unique_ptr<ModelDir> dir;
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<Dataset> dataset;
};

inline EngineWorld MakeEngineWorld(int num_samples, uint32_t seed) {
  EngineWorld w;
  w.dir = std::move(ModelDir::Open(SourcePath("tests/fixtures/golden/rand_default_mha")).value());
  w.model = std::move(LoadCausalLM(*w.dir, ModelOptions{}).value());
  w.dataset = MakeSyntheticDataset(num_samples, seed);
  return w;
}

// The next batch of `rank`'s subscription `generation`, polled for up to
// 30 s (an empty batch and a test failure after that).
inline ReadyBatch NextBatch(Engine& e, int rank, uint64_t generation) {
  for (int i = 0; i < 15000; ++i) {
    auto b = e.TakeNext(rank, generation);
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return {};
    if (b->has_value()) return **b;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ADD_FAILURE() << "no batch within 30 s";
  return {};
}

}  // namespace e3::testing

#endif  // E3_TESTS_TEACHER_SERVER_ENGINE_ENGINE_WORLD_H_
