// A tiny EAGLE-3 draft with random frozen tensors and random packed
// batches, for the student's unit tests.
#ifndef E3_TESTS_STUDENT_TRAINER_TINY_DRAFT_H_
#define E3_TESTS_STUDENT_TRAINER_TINY_DRAFT_H_

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/torch/torch_core.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/step/ttt_step.h"

namespace e3::testing {

inline Eagle3DraftConfig TinyConfig() {
  Eagle3DraftConfig c;
  c.hidden_size = 32;
  c.target_hidden_size = 32;
  c.num_aux = 3;
  c.intermediate_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 10000.0;
  c.max_position_embeddings = 256;
  c.vocab_size = 50;
  c.draft_vocab_size = 20;
  c.aux_layer_ids = {1, 5, 8};
  return c;
}

// Draft vocab = the even target ids 0, 2, ..., 2N-2.
inline VocabMap EvenIdsVocab(int64_t vocab_size, int64_t draft_vocab_size) {
  VocabMap m;
  m.target_vocab_size = vocab_size;
  m.t2d.assign(static_cast<size_t>(vocab_size), 0);
  for (int64_t i = 0; i < draft_vocab_size; ++i) {
    m.d2t.push_back(i);  // target id 2i = i + i
    m.t2d[2 * i] = 1;
  }
  return m;
}

inline Eagle3FrozenTensors TinyFrozen(const Eagle3DraftConfig& c, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Eagle3FrozenTensors f;
  f.embed_tokens = at::randn({c.vocab_size, c.target_hidden_size}, gen, at::kFloat);
  f.target_lm_head = at::randn({c.vocab_size, c.target_hidden_size}, gen, at::kFloat) * 0.3;
  f.vocab = EvenIdsVocab(c.vocab_size, c.draft_vocab_size);
  return f;
}

// keep_full_target_head: for the LK losses (ttt_step.h).
inline Eagle3Draft MakeTinyDraft(at::ScalarType dtype = at::kFloat, uint64_t seed = 7,
                                 const Eagle3DraftConfig& config = TinyConfig(),
                                 bool keep_full_target_head = false) {
  Eagle3DraftOptions options;
  options.config = config;
  options.dtype = dtype;
  options.target_head_dtype = dtype;
  options.seed = seed;
  options.keep_full_target_head = keep_full_target_head;
  auto draft = CreateEagle3Draft(options, TinyFrozen(config, /*seed=*/11));
  EXPECT_TRUE(draft.ok()) << draft.status();
  return *draft;
}

// Random inputs for samples of `lengths`; every position trained, every
// target argmax in the draft vocab unless the test edits them.
inline TeacherBatch RandomBatch(const Eagle3DraftConfig& c, const std::vector<int64_t>& lengths,
                            uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t total = 0;
  std::vector<int64_t> cu = {0};
  for (int64_t n : lengths) cu.push_back(total += n);
  TeacherBatch b;
  b.input_ids = at::randint(0, c.vocab_size, {total}, gen, at::kInt);
  b.cu_seqlens = torch::tensor(cu, torch::kInt);
  b.loss_mask = torch::ones({total}, torch::kUInt8);
  b.aux_hidden = at::randn({total, c.num_aux * c.target_hidden_size}, gen, at::kFloat);
  b.last_hidden = at::randn({total, c.target_hidden_size}, gen, at::kFloat);
  b.target_argmax = (at::randint(0, c.draft_vocab_size, {total}, gen, at::kInt) * 2).to(at::kInt);
  return b;
}

// The rows [begin, begin + n) of every per-token tensor of `b`, as a
// batch of one sample.
inline TeacherBatch SliceSample(const TeacherBatch& b, int64_t begin, int64_t n) {
  TeacherBatch s;
  s.input_ids = b.input_ids.narrow(0, begin, n);
  s.cu_seqlens = torch::tensor(std::vector<int64_t>{0, n}, torch::kInt);
  s.loss_mask = b.loss_mask.narrow(0, begin, n);
  s.aux_hidden = b.aux_hidden.narrow(0, begin, n);
  s.last_hidden = b.last_hidden.narrow(0, begin, n);
  s.target_argmax = b.target_argmax.narrow(0, begin, n);
  return s;
}

}  // namespace e3::testing

#endif  // E3_TESTS_STUDENT_TRAINER_TINY_DRAFT_H_
