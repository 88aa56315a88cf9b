// Shared by the EAGLE-3 TTT golden tests: loads a fixture written by
// tests/golden/make_eagle3_golden.py (an independent plain-PyTorch
// statement of the TTT semantics, run in fp64), builds the C++ draft from
// its weights on a dtype and device, runs TTT + backward and compares
// logits, losses, acc and every gradient within a tolerance.
#ifndef E3_TESTS_STUDENT_TRAINER_EAGLE3_GOLDEN_H_
#define E3_TESTS_STUDENT_TRAINER_EAGLE3_GOLDEN_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/model/safetensors.h"
#include "common/torch/tensor_convert.h"
#include "common/torch/torch_core.h"
#include "nlohmann/json.hpp"
#include "student_trainer/draft/draft_export.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/step/ttt_step.h"
#include "tests/rel_inf.h"

namespace e3::testing {

struct Golden {
  nlohmann::json meta;
  std::unique_ptr<SafetensorsFile> file;
  std::map<std::string, at::Tensor> t;  // as stored
};

inline Golden LoadGolden(const std::string& name) {
  Golden g;
  auto file = SafetensorsFile::Open(std::string(E3_SOURCE_DIR) + "/tests/fixtures/eagle3/" + name +
                                    ".safetensors");
  if (!file.ok()) throw std::runtime_error(std::string(file.status().message()));
  g.file = std::move(*file);
  g.meta = nlohmann::json::parse(g.file->metadata().at("meta"));
  for (const auto& name : g.file->Names()) {
    auto view = g.file->Get(name);
    auto type = ToScalarType(view->dtype);
    g.t[name] = *ViewToTensor(*view, *type);
  }
  return g;
}

inline Eagle3Draft MakeGoldenDraft(const Golden& g, at::ScalarType dtype, at::Device device = at::kCPU) {
  Eagle3DraftConfig c;
  c.hidden_size = g.meta["hidden_size"];
  c.target_hidden_size = c.hidden_size;
  c.num_aux = g.meta["num_aux"];
  c.intermediate_size = g.meta["intermediate_size"];
  c.num_heads = g.meta["num_heads"];
  c.num_kv_heads = g.meta["num_kv_heads"];
  c.head_dim = g.meta["head_dim"];
  c.rms_norm_eps = g.meta["rms_norm_eps"];
  c.rope.theta = g.meta["rope_theta"];
  c.max_position_embeddings = 2048;
  c.vocab_size = g.meta["vocab_size"];
  c.draft_vocab_size = g.meta["draft_vocab_size"];
  c.aux_layer_ids = {1, 2, 3};
  c.fc_norm = c.norm_output = g.meta.value("eagle31", false);

  Eagle3FrozenTensors frozen;
  frozen.embed_tokens = g.t.at("embed_tokens");
  frozen.target_lm_head = g.t.at("target_lm_head");
  at::Tensor d2t = g.t.at("d2t").contiguous();
  at::Tensor t2d = g.t.at("t2d").to(at::kByte).contiguous();
  frozen.vocab.target_vocab_size = c.vocab_size;
  frozen.vocab.d2t.assign(d2t.data_ptr<int64_t>(), d2t.data_ptr<int64_t>() + d2t.numel());
  frozen.vocab.t2d.assign(t2d.data_ptr<uint8_t>(), t2d.data_ptr<uint8_t>() + t2d.numel());

  Eagle3DraftOptions options;
  options.config = c;
  options.dtype = dtype;
  options.device = device;
  // Below fp32 the trainer keeps the target head in fp32 (the reference
  // distribution); the golden tests do the same.
  options.target_head_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
  auto draft = CreateEagle3Draft(options, frozen);
  EXPECT_TRUE(draft.ok()) << draft.status();
  // The golden file holds the weights under their export names (and d2t /
  // t2d, which must match the map above).
  absl::Status loaded = LoadDraftWeights(**draft, *g.file);
  EXPECT_TRUE(loaded.ok()) << loaded;
  return *draft;
}

inline TeacherBatch GoldenBatch(const Golden& g) {
  TeacherBatch b;
  b.input_ids = g.t.at("input_ids");
  b.cu_seqlens = g.t.at("cu_seqlens");
  b.loss_mask = g.t.at("loss_mask");
  b.aux_hidden = g.t.at("aux_hidden");
  b.last_hidden = g.t.at("last_hidden");
  b.target_argmax = g.t.at("target_argmax");
  return b;
}

struct Tolerance {
  double logits, loss, grad;
  int64_t acc_hits;       // allowed |hit count difference| per step
  double acc_share = 0;   // if > 0: allowed difference as a share of the step's loss tokens
};

// acc_hits: allowed |hit count difference| per step, as a count; with
// acc_share > 0 the bound is acc_share x the step's loss tokens instead.
inline void CompareWithGolden(const std::string& name, at::ScalarType dtype, const Tolerance& tol,
                              at::Device device = at::kCPU, TttKernels kernels = TttKernels::kReference) {
  Golden g = LoadGolden(name);
  Eagle3Draft draft = MakeGoldenDraft(g, dtype, device);
  TttOptions options;
  options.kernels = kernels;
  // Fixtures written before the positions became a choice used fixed ones.
  const std::string positions = g.meta.value("ttt_positions", std::string("fixed"));
  options.positions = positions == "advancing" ? TttPositions::kAdvancing : TttPositions::kFixed;
  options.length = g.meta["ttt_length"];
  options.step_weight = g.meta["step_weight"];
  options.keep_logits = true;
  auto out = RunTtt(*draft, GoldenBatch(g), options);
  ASSERT_TRUE(out.ok()) << out.status();
  out->loss.backward();

  const at::Tensor& ref_logits = g.t.at("ref.logits");
  at::Tensor ref_ploss = g.t.at("ref.ploss");
  at::Tensor ref_acc = g.t.at("ref.acc");
  at::Tensor ref_lmask = g.t.at("ref.loss_mask").to(at::kLong).sum(1);
  at::Tensor ref_pmask = g.t.at("ref.position_mask").to(at::kLong).sum(1);
  double max_logits = 0, max_loss = 0, max_grad = 0;
  for (int64_t j = 0; j < options.length; ++j) {
    SCOPED_TRACE(::testing::Message() << "step " << j);
    const double e_logits = RelInf(out->logits[j], ref_logits[j]);
    const double ref_p = ref_ploss[j].item<double>();
    const double e_loss = std::abs(out->ploss[j] - ref_p) / std::abs(ref_p);
    EXPECT_LE(e_logits, tol.logits);
    EXPECT_LE(e_loss, tol.loss);
    max_logits = std::max(max_logits, e_logits);
    max_loss = std::max(max_loss, e_loss);
    EXPECT_EQ(out->loss_tokens[j], ref_lmask[j].item<int64_t>());
    EXPECT_EQ(out->position_tokens[j], ref_pmask[j].item<int64_t>());
    const double ref_hits = ref_acc[j].item<double>() * static_cast<double>(out->loss_tokens[j]);
    const double allowed = tol.acc_share > 0 ? tol.acc_share * static_cast<double>(out->loss_tokens[j])
                                             : static_cast<double>(tol.acc_hits);
    EXPECT_LE(std::abs(static_cast<double>(out->correct[j]) - ref_hits), allowed + 1e-6)
        << "acc " << out->acc[j] << " vs " << ref_acc[j].item<double>();
  }
  const double ref_loss = g.t.at("ref.loss").item<double>();
  const double e_total = std::abs(out->loss.item<double>() - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(e_total, tol.loss);
  max_loss = std::max(max_loss, e_total);
  if (tol.acc_hits == 0 && tol.acc_share == 0) {
    EXPECT_NEAR(out->tau, g.t.at("ref.tau").item<double>(), 1e-12);
  }

  int64_t compared = 0;
  for (const auto& [name, param] : draft->ExportedParameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(param.grad().defined());
    const double e = RelInf(param.grad(), g.t.at("ref.grad." + name));
    EXPECT_LE(e, tol.grad);
    max_grad = std::max(max_grad, e);
    ++compared;
  }
  EXPECT_EQ(compared, g.meta.value("eagle31", false) ? 16 : 13);
  std::printf("[%s %s %s] rel inf error: logits %.3g, losses %.3g, grads %.3g; tau %.4f (ref %.4f)\n",
              name.c_str(), c10::toString(dtype), kernels == TttKernels::kFast ? "fast" : "reference", max_logits,
              max_loss, max_grad, out->tau, g.t.at("ref.tau").item<double>());
}

}  // namespace e3::testing

#endif  // E3_TESTS_STUDENT_TRAINER_EAGLE3_GOLDEN_H_
