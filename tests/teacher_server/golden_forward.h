// The golden tests' harness over a GoldenCase (golden_fixture.h): the
// model the case names, its forward on the case's packed inputs, and the
// comparison with transformers' outputs that every architecture's golden
// test makes (decoder_, deepseek_ and gpt_oss_golden_test.cc).
#ifndef E3_TESTS_TEACHER_SERVER_GOLDEN_FORWARD_H_
#define E3_TESTS_TEACHER_SERVER_GOLDEN_FORWARD_H_

#include <gtest/gtest.h>

#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/model/model_dir.h"
#include "teacher_server/models/causal_lm.h"
#include "tests/teacher_server/golden_fixture.h"

namespace e3::testing {

// A loaded model with the directory it was read from (kept open as long as
// the model).
struct GoldenModel {
  std::unique_ptr<ModelDir> dir;
  std::unique_ptr<CausalLM> model;
};

// The options the reference fixtures were made for: fp32, nothing fused,
// attention by `kernel`.
inline ModelOptions ReferenceOptions(AttentionKernel kernel) {
  ModelOptions options;
  options.dtype = at::kFloat;
  options.attention = kernel;
  return options;
}

// The model of case c under `options`; model is null (with a failure
// recorded) when it does not load.
inline GoldenModel LoadGoldenModel(const GoldenCase& c, const ModelOptions& options) {
  GoldenModel out;
  auto dir = ModelDir::Open(c.model_dir);
  EXPECT_TRUE(dir.ok()) << dir.status();
  if (!dir.ok()) return out;
  out.dir = std::move(dir).value();
  auto model = LoadCausalLM(*out.dir, options);
  EXPECT_TRUE(model.ok()) << model.status();
  if (model.ok()) out.model = std::move(model).value();
  return out;
}

// The forward of case c's packed samples, with its aux ids and the target
// argmax, and the logits where asked.
inline absl::StatusOr<ForwardOutput> GoldenForward(CausalLM& model, const GoldenCase& c, bool return_logits) {
  auto batch = MakePackedBatch(c.tensors.at("input_ids").to(at::kLong), c.cu_seqlens, model.config().vocab_size,
                               at::kCPU);
  if (!batch.ok()) return batch.status();
  ForwardOptions fwd;
  fwd.aux_layer_ids = c.aux_layer_ids;
  fwd.return_logits = return_logits;
  return model.Forward(*batch, fwd);
}

// Expects `out` to match case c within `tol` (RelInf) on the aux and last
// hidden states and, where out has them, the case's logits rows; and the
// target argmax to be the case's exactly (it can differ only where the top
// two logits tie within fp32 noise; none do in the fixtures). Records and
// prints the errors under `label`, so that a run shows the margins.
inline void ExpectMatchesGolden(const ForwardOutput& out, const GoldenCase& c, double tol, const std::string& label) {
  const double aux_err = RelInf(out.aux_hidden, c.tensors.at("aux_hidden"));
  const double last_err = RelInf(out.last_hidden, c.tensors.at("last_hidden"));
  EXPECT_EQ(out.aux_hidden.sizes(), c.tensors.at("aux_hidden").sizes());
  EXPECT_LT(aux_err, tol);
  EXPECT_LT(last_err, tol);
  ::testing::Test::RecordProperty("aux_rel_err", std::to_string(aux_err));
  ::testing::Test::RecordProperty("last_rel_err", std::to_string(last_err));
  if (out.logits.defined()) {
    const at::Tensor rows = c.tensors.at("logits_row_index").to(at::kLong);
    const double logit_err = RelInf(out.logits.index_select(0, rows), c.tensors.at("logits_rows"));
    EXPECT_LT(logit_err, tol);
    ::testing::Test::RecordProperty("logits_rel_err", std::to_string(logit_err));
    std::printf("[%s] rel inf error: aux %.3g, last %.3g, logits %.3g\n", label.c_str(), aux_err, last_err,
                logit_err);
  } else {
    std::printf("[%s] rel inf error: aux %.3g, last %.3g\n", label.c_str(), aux_err, last_err);
  }
  EXPECT_TRUE(out.target_argmax.equal(c.tensors.at("target_argmax")));
}

// Packing `a` before `b` must give b the outputs it gets alone: samples do
// not see each other (vocab: the model's vocabulary size).
inline void ExpectPackedLikeAlone(CausalLM& model, const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                                  const std::vector<int32_t>& aux_layer_ids, int64_t vocab) {
  ForwardOptions fwd;
  fwd.aux_layer_ids = aux_layer_ids;
  auto packed = model.Forward(*PackSamples({a, b}, vocab, at::kCPU), fwd);
  auto alone_b = model.Forward(*PackSamples({b}, vocab, at::kCPU), fwd);
  ASSERT_TRUE(packed.ok() && alone_b.ok());
  const int64_t begin = static_cast<int64_t>(a.size()), n = static_cast<int64_t>(b.size());
  EXPECT_TRUE(torch::allclose(packed->aux_hidden.narrow(0, begin, n), alone_b->aux_hidden, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(packed->last_hidden.narrow(0, begin, n), alone_b->last_hidden, 1e-5, 1e-6));
}

// A golden case under one attention kernel: the decoder and DeepSeek
// goldens run each case under eager attention and SDPA.
struct KernelCase {
  std::string name;
  AttentionKernel kernel;
};

inline std::vector<KernelCase> EagerAndSdpa(std::initializer_list<const char*> names) {
  std::vector<KernelCase> out;
  for (const char* name : names) {
    out.push_back({name, AttentionKernel::kEager});
    out.push_back({name, AttentionKernel::kSdpa});
  }
  return out;
}

inline std::string KernelCaseName(const ::testing::TestParamInfo<KernelCase>& info) {
  return info.param.name + (info.param.kernel == AttentionKernel::kEager ? "_eager" : "_sdpa");
}

}  // namespace e3::testing

#endif  // E3_TESTS_TEACHER_SERVER_GOLDEN_FORWARD_H_
