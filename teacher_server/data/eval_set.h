// The acceptance eval set: the teacher's own greedy continuation of each
// eval prompt (generation.h, with a KV cache), then the aux hidden states
// of prompt + continuation, as for training. Students draft against it as
// a serving engine would (student_trainer/eval/acceptance.h), so the truth they
// verify against is what this target generates.
//
// Everything runs once, on a background thread that shares the model with
// the engine through SerializedCausalLM (one forward at a time, in arrival
// order), so training batches keep flowing while it generates. The result
// stays in host memory and is served to every student that asks
// (TeacherService.GetEvalSet), as inline payloads of input_ids,
// cu_seqlens, loss_mask (1 on the continuation's tokens) and aux_hidden.
#ifndef E3_TEACHER_SERVER_DATA_EVAL_SET_H_
#define E3_TEACHER_SERVER_DATA_EVAL_SET_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/transport/batch_payload.h"
#include "teacher_server/models/causal_lm.h"

namespace e3 {

struct EvalSetOptions {
  int64_t max_new_tokens = 256;
  std::vector<int32_t> stop_ids;  // the model's EOS ids
  std::vector<int32_t> aux_layer_ids;
  int64_t tokens_per_batch = 4096;  // eval batches hold up to this many tokens (at least one sample)
  int64_t generate_batch = 32;      // sequences decoded together
};

struct EvalSetProgress {
  int64_t prompts = 0;
  int64_t generated = 0;            // prompts whose continuation is done
  int64_t continuation_tokens = 0;  // once ready
  int64_t batches = 0;              // once ready
  double generate_seconds = 0;
  bool ready = false;
  absl::Status error;  // set when generation failed; the set never becomes ready
};

class EvalSet {
 public:
  // Starts generating for `prompts` (token ids, non-empty) at once.
  static std::unique_ptr<EvalSet> Start(CausalLM* model, std::vector<std::vector<int32_t>> prompts,
                                        EvalSetOptions options);
  ~EvalSet();  // cancels a generation still running and waits for it

  EvalSetProgress progress() const;
  // The eval batches, once ready (empty before).
  std::vector<std::shared_ptr<const PayloadBuffer>> batches() const;
  // The same with aux_hidden restricted to the captured layers at
  // `aux_positions` (indices into options.aux_layer_ids), in that order:
  // what one student reads. The batches themselves for every layer in
  // order; otherwise a copy, made once per plan (the students of a group
  // fetch the same), so a handler asking again copies nothing.
  absl::StatusOr<std::vector<std::shared_ptr<const PayloadBuffer>>> batches(
      const std::vector<int64_t>& aux_positions) const;

 private:
  EvalSet(CausalLM* model, std::vector<std::vector<int32_t>> prompts, EvalSetOptions options);
  void Run();
  absl::Status Generate();
  // Packs prompt + continuation samples and captures their aux states.
  absl::Status BuildBatches();

  CausalLM* model_;
  const std::vector<std::vector<int32_t>> prompts_;
  const EvalSetOptions options_;
  std::vector<std::vector<int32_t>> continuations_;
  std::atomic<bool> cancel_{false};
  mutable std::mutex mu_;
  EvalSetProgress progress_;
  std::vector<std::shared_ptr<const PayloadBuffer>> batches_;
  // Slices already made, by the positions they hold (guarded by mu_).
  mutable std::map<std::vector<int64_t>, std::vector<std::shared_ptr<const PayloadBuffer>>> sliced_;
  std::thread thread_;
};

}  // namespace e3

#endif  // E3_TEACHER_SERVER_DATA_EVAL_SET_H_
