// What one process of a run holds in its device's memory, estimated from
// the model's config.json and the run config before anything starts (the
// launcher's --plan). An estimate: it counts the tensors that scale with
// the model and the batch, not allocator slack, CUDA context or kernels'
// workspaces (count 1-3 GB more per GPU for those).
#ifndef E3_LAUNCHER_MEMORY_ESTIMATE_H_
#define E3_LAUNCHER_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <string>

#include "common/config/run_config.h"
#include "common/model/model_config.h"

namespace e3 {

struct MemoryEstimate {
  double weights = 0;      // bytes: the model shard, or the draft and its frozen tensors
  double optimizer = 0;    // fp32 master weights, AdamW moments, gradients
  double activations = 0;  // one forward (and backward) over one batch
  double buffers = 0;      // batches in flight: payloads a teacher holds, a student prefetches
  double total() const { return weights + optimizer + activations + buffers; }
};

// Parameters of the whole target model.
double TargetParameters(const ModelConfig& model);
// Parameters the draft trains (its lm_head over the draft vocab included).
double DraftParameters(const ModelConfig& model, const RunConfig& run);

// One tensor-parallel rank of a teacher, on a GPU (`gpu`) or the CPU;
// `students` is the number of ranks subscribed to it.
MemoryEstimate TeacherRankMemory(const ModelConfig& model, const RunConfig& run, bool gpu,
                                 int students);
// One student rank.
MemoryEstimate StudentRankMemory(const ModelConfig& model, const RunConfig& run, bool gpu);

// "12.3 GB", "850 MB".
std::string FormatBytes(double bytes);

}  // namespace e3

#endif  // E3_LAUNCHER_MEMORY_ESTIMATE_H_
