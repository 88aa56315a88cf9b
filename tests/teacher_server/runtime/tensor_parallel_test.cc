// Teacher tensor and expert parallelism on CPU: real processes, a Gloo
// group on loopback. TP=2 (and TP=4) must give the aux states, last hidden
// state, logits and argmax of TP=1.
//
// Tolerance: 1e-5 relative (max abs error over the tensor's max abs) for
// fp32. A sharded row-parallel product sums its partial products in a
// different order than the whole matmul; in fp32 that moves results by a
// few ulps per layer, ~1e-6 relative after 6 layers (measured below).
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "teacher_server/models/decoder_lm.h"
#include "teacher_server/parallel/micro_batches.h"
#include "teacher_server/parallel/tp_group.h"
#include "tests/teacher_server/tp_harness.h"

namespace e3 {
namespace {

// The plan of TP rank `rank` of a teacher of `tp` ranks in `ep` expert groups.
absl::StatusOr<ShardPlan> PlanFor(const ModelConfig& c, int rank, int tp, int ep) {
  absl::StatusOr<ParallelLayout> layout = ParallelLayout::Make(rank, tp, tp, ep);
  if (!layout.ok()) return layout.status();
  return ShardPlan::Make(c, *layout);
}

using testing::RunTpProcesses;
using testing::TpRun;

constexpr double kFp32Tol = 1e-5;

TEST(TensorParallelTest, ChildRole) {
  const char* spec = std::getenv("E3_TP_CHILD");
  if (spec == nullptr) GTEST_SKIP() << "runs only as a rank started by the tests below";
  testing::RunTpChild(spec);
}

// sgl, with its batches split into two overlapped micro-batches.
TpRun Sgl(TpRun r) {
  r.sgl = true;
  r.overlap_min_tokens = 1;
  return r;
}

// One vocab row fewer: ranks hold vocab shards of different sizes.
TpRun Trimmed(TpRun r) {
  r.vocab_trim = 1;
  return r;
}

class TensorParallelCpuTest : public ::testing::TestWithParam<TpRun> {
 protected:
  void SetUp() override {
#ifdef E3_HAS_CUDA
    GTEST_SKIP() << "CPU tensor parallelism needs Gloo, which pip's LibTorch lacks (the GPU test covers NCCL)";
#endif
    if (std::getenv("E3_TP_CHILD") != nullptr) GTEST_SKIP();
  }
};

TEST_P(TensorParallelCpuTest, MatchesTheUnshardedModel) {
  const TpRun run = GetParam();
  const std::string dir = testing::ScratchDir("tp_" + run.golden_case);
  const nlohmann::json r = RunTpProcesses(run, "TensorParallelTest.ChildRole", dir);
  ASSERT_FALSE(r.empty());
  ASSERT_FALSE(r.contains("forward_error")) << r.dump();
  std::printf("[%s tp=%d ep=%d%s, vocab trimmed by %d] vs TP=1: aux %.3g, last %.3g, logits %.3g, argmax agreement "
              "%.4f; vs HF: aux %.3g\n",
              run.golden_case.c_str(), run.tp_size, run.ep_size, run.sgl ? " sgl" : "",
              static_cast<int>(run.vocab_trim), r["aux_vs_tp1"].get<double>(), r["last_vs_tp1"].get<double>(), r["logits_vs_tp1"].get<double>(),
              r["argmax_agreement_tp1"].get<double>(), r.value("aux_vs_hf", -1.0));
  EXPECT_TRUE(r["shapes_match"].get<bool>());
  EXPECT_EQ(r["vocab_size"].get<int64_t>() % run.tp_size != 0, run.vocab_trim > 0) << "uneven vocab shards";
  EXPECT_LT(r["aux_vs_tp1"].get<double>(), kFp32Tol);
  EXPECT_LT(r["last_vs_tp1"].get<double>(), kFp32Tol);
  EXPECT_LT(r["logits_vs_tp1"].get<double>(), kFp32Tol);
  EXPECT_EQ(r["argmax_agreement_tp1"].get<double>(), 1.0);
  EXPECT_TRUE(r["argmax_equals_own_logits"].get<bool>());
  // Each rank's argmax from its own logits, combined: the argmax of the
  // gathered logits, ties included.
  EXPECT_EQ(r["argmax_alone_agreement"].get<double>(), 1.0);
  EXPECT_EQ(r["fp8_argmax_calls"].get<int64_t>(), 0) << "no FP8 search on the CPU";
  // DeepSeek and GPT-OSS run every batch whole (no micro-batch overlap).
  const bool own_file = run.golden_case.find("deepseek") != std::string::npos ||
                        run.golden_case.find("gpt_oss") != std::string::npos;
  EXPECT_EQ(r["overlapped_forwards"].get<int64_t>(), run.sgl && !own_file ? 1 : 0)
      << "sgl splits these batches, hf does not";
  if (run.vocab_trim == 0) {
    EXPECT_LT(r["aux_vs_hf"].get<double>(), 1e-4);  // the golden tests' bound
  }
  EXPECT_TRUE(r["repeat_bitwise_equal"].get<bool>());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorParallelCpuTest,
    ::testing::Values(TpRun{"rand_llama3_gqa", 2, 1},        // 8 q heads, 2 kv heads: 1 kv head per rank
                      TpRun{"rand_yarn_mqa", 2, 1},          // 1 kv head: replicated on both ranks
                      TpRun{"rand_linear_headdim", 2, 1},    // tied embeddings: vocab-parallel both ways
                      TpRun{"rand_qwen2", 2, 1},             // q/k/v biases sliced
                      TpRun{"rand_qwen3", 2, 1},             // q/k norms replicated
                      TpRun{"rand_mixtral", 2, 1},           // EP=1: every expert split over 2 ranks
                      TpRun{"rand_qwen3_moe", 2, 2},         // EP=2: whole experts per rank
                      TpRun{"rand_qwen3_moe", 4, 2},         // 2 groups of 2: experts and their slices
                      TpRun{"rand_qwen3_moe_unnorm", 4, 4},  // 1 expert per rank, kv replicated
                      // GPT-OSS: sinks and q/k/v biases split by head, o_proj's
                      // bias added once; each expert's intermediate split with
                      // its gate/up biases, its down bias added once.
                      TpRun{"rand_gpt_oss", 2, 1},
                      TpRun{"rand_gpt_oss_mxfp4", 2, 2},  // EP=2: whole MXFP4 experts per rank
                      TpRun{"rand_gpt_oss_mxfp4", 4, 2},  // kv replicated, experts in 2 groups of 2
                      // sgl: fused qkv (with biases) and fused gate-up per local
                      // expert per shard; micro-batches of 200 and 103 tokens.
                      Sgl(TpRun{"rand_qwen2", 2, 1}), Sgl(TpRun{"rand_qwen3_moe", 2, 2}),
                      // a vocab of 255: shards of 128 and 127 rows (untied and tied heads)
                      Trimmed(TpRun{"rand_llama3_gqa", 2, 1}), Trimmed(Sgl(TpRun{"rand_linear_headdim", 2, 1})),
                      // DeepSeek MLA: heads of q_b/kv_b/o_proj split, q_a/kv_a
                      // replicated; every expert's slice on both ranks (EP=1),
                      // the shared expert split
                      TpRun{"rand_deepseek_v3", 2, 1},
                      // 2 expert groups of 2 ranks, FP8 weights dequantized per slice
                      TpRun{"rand_deepseek_v3_fp8", 4, 2},
                      // whole experts per rank, softmax routing, plain q_proj split
                      TpRun{"rand_deepseek_v2_lite", 2, 2},
                      // V2's group-limited greedy routing, its groups' experts
                      // on two ranks
                      TpRun{"rand_deepseek_v2_glg", 2, 2},
                      // sgl: grouped experts under EP (GPT-OSS's biases with
                      // its down bias on one rank per expert; DeepSeekMoE's
                      // routing), fused gate-up of the shared expert's slice
                      Sgl(TpRun{"rand_gpt_oss_mxfp4", 4, 2}), Sgl(TpRun{"rand_deepseek_v3", 2, 2})),
    [](const ::testing::TestParamInfo<TpRun>& info) {
      return absl::StrCat(info.param.golden_case, "_tp", info.param.tp_size, "_ep", info.param.ep_size,
                          info.param.sgl ? "_sgl" : "", info.param.vocab_trim > 0 ? "_uneven_vocab" : "");
    });

TEST(TensorParallelFaultTest, LeaderReportsADeadFollowerInsteadOfHanging) {
#ifdef E3_HAS_CUDA
  GTEST_SKIP() << "needs Gloo";
#endif
  if (std::getenv("E3_TP_CHILD") != nullptr) GTEST_SKIP();
  TpRun run{"rand_default_mha", 2, 1};
  run.follower_fault = "exit_after_load";
  const auto start = std::chrono::steady_clock::now();
  const nlohmann::json r =
      RunTpProcesses(run, "TensorParallelTest.ChildRole", testing::ScratchDir("tp_fault"));
  if (r.contains("leader_exit_status")) {
    // The follower died after the header reached it: the leader's forward
    // failed mid-way and it exited rather than serve a broken group.
    EXPECT_EQ(r["leader_exit_status"].get<int>(), 3);
    EXPECT_NE(r["leader_log"].get<std::string>().find("the group cannot recover"), std::string::npos)
        << r["leader_log"].get<std::string>();
    std::printf("leader exited: %s\n", r["leader_log"].get<std::string>().c_str());
  } else {
    ASSERT_TRUE(r.contains("forward_error")) << r.dump();
    std::printf("leader's error: %s\n", r["forward_error"].get<std::string>().c_str());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(90));
}

TEST(ShardPlanTest, SplitsHeadsVocabAndExperts) {
  ModelConfig c;
  c.source = "config.json";
  c.num_hidden_layers = 2;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.intermediate_size = 14336;
  c.vocab_size = 128257;  // odd: the last rank's shard is shorter
  auto p = PlanFor(c, 3, 4, 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->q_heads.begin, 24);
  EXPECT_EQ(p->q_heads.size, 8);
  EXPECT_EQ(p->kv_heads.begin, 6);
  EXPECT_EQ(p->kv_heads.size, 2);
  EXPECT_EQ(p->intermediate.begin, 3 * 3584);
  EXPECT_EQ(p->vocab.begin, 3 * 32065);
  EXPECT_EQ(p->vocab.end(), 128257);

  // GQA with fewer KV heads than ranks: ranks 0-3 read kv head 0, 4-7 head 1.
  c.num_key_value_heads = 2;
  for (int r = 0; r < 8; ++r) {
    auto q = PlanFor(c, r, 8, 1);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->kv_heads.begin, r / 4);
    EXPECT_EQ(q->kv_heads.size, 1);
    // Its query heads' group (heads / kv = 16 per kv head) is that head.
    EXPECT_EQ(q->q_heads.begin / 16, q->kv_heads.begin);
  }

  c.moe.num_experts = 8;
  c.moe.intermediate_size = 768;
  auto m = PlanFor(c, 5, 8, 2);  // 2 groups of 4 ranks
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->experts.begin, 4);
  EXPECT_EQ(m->experts.size, 4);
  EXPECT_EQ(m->expert_intermediate.begin, 192);
  EXPECT_EQ(m->expert_intermediate.size, 192);

  // Every layer routed (Mixtral): the dense intermediate size is unused
  // and need not divide.
  c.intermediate_size = 14335;
  EXPECT_TRUE(PlanFor(c, 5, 8, 2).ok());
  c.moe.mlp_only_layers = {0};  // one dense layer: now it must
  EXPECT_FALSE(PlanFor(c, 5, 8, 2).ok());
}

// The combine of a vocab-parallel argmax against at::argmax over the whole
// row: ties across ranks go to the lower id, a NaN wins, -0 ties with +0.
TEST(VocabParallelArgmaxTest, PicksWhatArgmaxPicksOverTheWholeRow) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // Rows of the whole [n, 6] logits; rank 0 holds ids 0-2, rank 1 ids 3-5.
  const at::Tensor logits = torch::tensor({1.f, 5.f, 2.f, 5.f, 0.f, 1.f,       // tie across ranks: 1
                                           1.f, 2.f, 3.f, 4.f, 9.f, 4.f,       // rank 1 wins: 4
                                           1.f, 2.f, 3.f, nan, 9.f, 4.f,       // NaN on rank 1: 3
                                           nan, 2.f, 3.f, nan, 9.f, 4.f,       // first NaN: 0
                                           -0.f, -1.f, -2.f, 0.f, -3.f, -4.f,  // signed zeros tie: 0
                                           -inf, -inf, -inf, -inf, -inf, -inf})
                               .view({6, 6});
  std::vector<at::Tensor> best, ids;
  for (int64_t r = 0; r < 2; ++r) {
    const at::Tensor local = logits.narrow(1, 3 * r, 3);
    const at::Tensor where = local.argmax(-1);
    best.push_back(local.gather(-1, where.unsqueeze(-1)).squeeze(-1));
    ids.push_back(where + 3 * r);
  }
  const at::Tensor got = PickVocabParallelArgmax(best, ids);
  EXPECT_TRUE(got.equal(logits.argmax(-1).to(at::kInt))) << got;
  EXPECT_TRUE(got.equal(torch::tensor({1, 4, 3, 0, 0, 0}, at::kInt))) << got;
}

TEST(MicroBatchesTest, SplitsAtTheSampleBoundaryNearestHalf) {
  EXPECT_EQ(OverlapSplitPoint({0, 200, 213, 303}, 1), 1);  // 200 | 103 beats 213 | 90
  EXPECT_EQ(OverlapSplitPoint({0, 100, 200, 300, 400}, 1), 2);
  EXPECT_EQ(OverlapSplitPoint({0, 100, 300, 400}, 1), 1) << "a tie goes to the lower boundary";
  EXPECT_EQ(OverlapSplitPoint({0, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192}, 512), 4);
  EXPECT_EQ(OverlapSplitPoint({0, 200, 2248, 2760, 4160, 4480, 5380, 7130, 7770}, 512), 4);  // the chat mix
}

TEST(MicroBatchesTest, LeavesSmallOrSingleSampleBatchesWhole) {
  EXPECT_EQ(OverlapSplitPoint({0, 8192}, 1), 0) << "one sample cannot be split";
  EXPECT_EQ(OverlapSplitPoint({0}, 1), 0);
  EXPECT_EQ(OverlapSplitPoint({0, 600, 1000}, 512), 0) << "a 400-token half is below the minimum";
  EXPECT_EQ(OverlapSplitPoint({0, 600, 1200}, 512), 1);
  EXPECT_EQ(OverlapSplitPoint({0, 600, 1200}, 0), 0) << "0 turns the split off";
}

TEST(MicroBatchesTest, RebasesASampleRange) {
  EXPECT_EQ(SampleRangeOffsets({0, 200, 213, 303}, 1, 3), (std::vector<int64_t>{0, 13, 103}));
  EXPECT_EQ(SampleRangeOffsets({0, 200, 213, 303}, 0, 1), (std::vector<int64_t>{0, 200}));
}

TEST(ShardPlanTest, NamesTheFieldThatDoesNotDivide) {
  ModelConfig c;
  c.source = "m/config.json";
  c.num_hidden_layers = 2;
  c.num_attention_heads = 12;
  c.num_key_value_heads = 3;
  c.intermediate_size = 64;
  c.vocab_size = 100;
  auto p = PlanFor(c, 0, 8, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("\"num_attention_heads\" = 12"), std::string::npos) << p.status();
  c.num_attention_heads = 16;
  p = PlanFor(c, 0, 4, 1);  // 3 kv heads over 4 ranks
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("num_key_value_heads"), std::string::npos) << p.status();
  c.num_key_value_heads = 4;
  EXPECT_FALSE(PlanFor(c, 0, 4, 2).ok());  // EP on a dense model
  EXPECT_FALSE(PlanFor(c, 0, 4, 3).ok());  // ep does not divide tp
  EXPECT_FALSE(PlanFor(c, 4, 4, 1).ok());  // rank outside
}

}  // namespace
}  // namespace e3
