// The GEMM sequence tuner on a GPU: it times real cuBLASLt candidates,
// installs only those that give the untuned path's bits, and a tuned model
// serves exactly what an untuned one serves (the bound is equality: the
// candidates differ in tiles, clusters and stages, never in the order in
// which an output's products are summed). Also: the cache file replays a
// tuning without timing, a corrupt cache is re-tuned and rewritten, and an
// algorithm cuBLASLt refuses falls back to the heuristic's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/random_samples.h"
#include "common/base/file_util.h"
#include "common/model/model_dir.h"
#include "common/torch/gemm.h"
#include "teacher_server/layers/gemm_tuning.h"
#include "teacher_server/models/causal_lm.h"
#include "tests/teacher_server/golden_fixture.h"

namespace e3 {
namespace {

constexpr int64_t kRows = 1024;

// Four layers of a small Llama's projections, bf16 on cuda:0, one with a
// bias (qkv, as Qwen2 has).
std::vector<GemmSite> SmallModelSites() {
  torch::manual_seed(7);
  const auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  std::vector<GemmSite> sites;
  for (int l = 0; l < 4; ++l) {
    sites.push_back({torch::randn({1536, 512}, o) * 0.05, torch::randn({1536}, o), false});
    sites.push_back({torch::randn({512, 1024}, o) * 0.05, at::Tensor(), true});
    sites.push_back({torch::randn({2816, 512}, o) * 0.05, at::Tensor(), false});
    sites.push_back({torch::randn({512, 1408}, o) * 0.05, at::Tensor(), true});
  }
  return sites;
}

// Both cuBLASLt paths on `n` rows of random activations, for every site.
void ExpectTunedEqualsUntuned(const std::vector<GemmSite>& sites, int64_t n) {
  for (size_t i = 0; i < sites.size(); ++i) {
    const GemmSite& s = sites[i];
    const auto o = s.weight.options();
    const at::Tensor x = torch::randn({n, s.weight.size(1)}, o);
    const at::Tensor r = s.residual ? torch::randn({n, s.weight.size(0)}, o) : at::Tensor();
    const at::Tensor want = Gemm(x, s.weight, s.bias, r, GemmPath::kCublasLt);
    EXPECT_TRUE(Gemm(x, s.weight, s.bias, r, GemmPath::kCublasLtTuned).equal(want)) << "site " << i << ", " << n
                                                                                    << " rows";
  }
}

GemmTuningOptions QuickOptions() {
  GemmTuningOptions o;
  o.rows = kRows;
  o.repeats = 2;
  o.confirm_rounds = 2;
  o.passes = 1;
  return o;
}

class GemmTuningGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
    ClearTunedGemmAlgos();
  }
  void TearDown() override { ClearTunedGemmAlgos(); }
};

TEST_F(GemmTuningGpuTest, TunedSequencesComputeTheUntunedBits) {
  const std::vector<GemmSite> sites = SmallModelSites();
  std::vector<std::string> log;
  GemmTuningOptions o = QuickOptions();
  o.log = [&log](const std::string& line) { log.push_back(line); };
  const int64_t lt_calls = LtGemmCalls();
  auto r = TuneGemmsInSequence(sites, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->skipped.empty());
  EXPECT_FALSE(r->from_cache);
  EXPECT_GT(LtGemmCalls(), lt_calls);
  ASSERT_EQ(r->problems.size(), 4u);
  int candidates = 0;
  bool changed = false;
  for (const TunedProblem& t : r->problems) {
    EXPECT_EQ(t.sites, 4) << t.problem.Name();
    EXPECT_GE(t.candidates, 1) << t.problem.Name();
    EXPECT_FALSE(t.algo_description.empty());
    candidates += t.candidates;
    changed = changed || t.changed;
  }
  EXPECT_GT(candidates, 4) << "cuBLASLt offered only its first choices";
  if (changed) {
    // Checked at TuningCheckRows; the range ends at one of them.
    const std::vector<int64_t> want = TuningCheckRows(kRows);
    ASSERT_EQ(r->checks.size(), want.size());
    bool at_a_check = false;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r->checks[i].rows, want[i]);
    for (const RowCheck& c : r->checks) {
      EXPECT_GT(c.tuned_ms, 0);
      EXPECT_GT(c.untuned_ms, 0);
      at_a_check = at_a_check || c.rows == r->min_rows;
    }
    EXPECT_TRUE(at_a_check) << r->min_rows;
  }
  EXPECT_FALSE(log.empty());
  std::printf("%s\n", r->Summary().c_str());
  for (int64_t n : {r->min_rows, (r->min_rows + kRows) / 2, kRows, kRows + 8, int64_t{64}}) {
    ExpectTunedEqualsUntuned(sites, n);
  }
}

TEST_F(GemmTuningGpuTest, EveryCandidateItAdmitsGivesTheFirstChoicesBits) {
  // The admission rule itself, per candidate: install each one alone and
  // compare with the untuned path wherever cuBLASLt takes it.
  const GemmSite site = SmallModelSites()[2];
  const GemmProblem p{0, at::kBFloat16, site.weight.size(0), site.weight.size(1), false, false};
  const std::vector<LtAlgo> all = LtCandidates(p, kRows, 16);
  ASSERT_FALSE(all.empty());
  const at::Tensor x = torch::randn({kRows, p.in}, site.weight.options());
  const at::Tensor want = Gemm(x, site.weight, at::Tensor(), at::Tensor(), GemmPath::kCublasLt);
  int equal = 0;
  for (const LtAlgo& a : all) {
    SetTunedGemmAlgo(p, 1, kRows, a);
    equal += Gemm(x, site.weight, at::Tensor(), at::Tensor(), GemmPath::kCublasLtTuned).equal(want) ? 1 : 0;
  }
  std::printf("%d of %zu candidates give the first choice's bits\n", equal, all.size());
  EXPECT_GE(equal, 1);  // the first choice itself
}

TEST_F(GemmTuningGpuTest, AnAlgorithmCublasLtRefusesFallsBackToTheHeuristic) {
  const GemmSite site = SmallModelSites()[1];
  const GemmProblem p{0, at::kBFloat16, site.weight.size(0), site.weight.size(1), false, true};
  SetTunedGemmAlgo(p, 1, 1 << 20, LtAlgo{});  // all-zero words: no algorithm
  ExpectTunedEqualsUntuned({site}, kRows);
}

TEST_F(GemmTuningGpuTest, TheCacheReplaysATuningAndACorruptOneIsRetuned) {
  auto dir = MakeTempDir("e3-gemm-tuning-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::vector<GemmSite> sites = SmallModelSites();
  GemmTuningOptions o = QuickOptions();
  o.cache_path = JoinPath(*dir, "sub/gemm.json");
  auto first = TuneGemmsInSequence(sites, o);
  ASSERT_TRUE(first.ok()) << first.status();
  auto text = ReadFileToString(o.cache_path);
  ASSERT_TRUE(text.ok()) << text.status();
  auto records = ParseGemmTuningCache(*text, o.cache_path);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].rows, kRows);
  EXPECT_EQ((*records)[0].min_rows, first->min_rows);
  EXPECT_FALSE((*records)[0].device_name.empty());
  EXPECT_EQ((*records)[0].cublaslt_version, CublasLtVersion());

  ClearTunedGemmAlgos();
  auto again = TuneGemmsInSequence(sites, o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->from_cache);
  EXPECT_EQ(again->min_rows, first->min_rows);
  ASSERT_EQ(again->problems.size(), first->problems.size());
  for (size_t i = 0; i < first->problems.size(); ++i) {
    EXPECT_EQ(again->problems[i].problem, first->problems[i].problem);
    EXPECT_EQ(again->problems[i].changed, first->problems[i].changed);
    EXPECT_EQ(again->problems[i].algo, first->problems[i].algo);
  }
  ExpectTunedEqualsUntuned(sites, kRows);

  // Another row count is another record, added beside the first.
  GemmTuningOptions half = o;
  half.rows = kRows / 2;
  ASSERT_TRUE(TuneGemmsInSequence(sites, half).ok());
  records = ParseGemmTuningCache(*ReadFileToString(o.cache_path), o.cache_path);
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->size(), 2u);

  ASSERT_TRUE(WriteFileAtomically(o.cache_path, "{ truncated").ok());
  std::vector<std::string> log;
  o.log = [&log](const std::string& line) { log.push_back(line); };
  auto retuned = TuneGemmsInSequence(sites, o);
  ASSERT_TRUE(retuned.ok()) << retuned.status();
  EXPECT_FALSE(retuned->from_cache);
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log[0].find("cache ignored"), std::string::npos) << log[0];
  EXPECT_NE(log[0].find(o.cache_path), std::string::npos) << log[0];
  EXPECT_TRUE(ParseGemmTuningCache(*ReadFileToString(o.cache_path), o.cache_path).ok());
  (void)RemoveAll(*dir);
}

TEST_F(GemmTuningGpuTest, ATunedModelServesTheUntunedModelsOutputs) {
  auto dir = ModelDir::Open(testing::SourcePath("examples/tiny-code-llama"));
  ASSERT_TRUE(dir.ok()) << dir.status();
  ModelOptions o;
  o.device = at::Device(at::kCUDA, 0);
  o.dtype = at::kBFloat16;
  ASSERT_TRUE(SetBackend("sgl", &o).ok());
  o.cuda_graphs = false;  // both forwards eager, so only the GEMMs' algorithms differ
  auto tuned = LoadCausalLM(**dir, o);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  o.gemm = GemmPath::kCublasLt;
  auto plain = LoadCausalLM(**dir, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NE((*tuned)->Techniques().find("algorithms tuned in sequence"), std::string::npos);
  EXPECT_NE((*plain)->Techniques().find("heuristic's algorithms"), std::string::npos);

  GemmTuningOptions t = QuickOptions();
  t.rows = 2048;
  auto r = (*tuned)->TuneGemms(t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->skipped.empty()) << r->skipped;
  // qkv, o_proj + residual, gate_up, down_proj + residual.
  EXPECT_EQ(r->problems.size(), 4u);
  auto untuned = (*plain)->TuneGemms(t);
  ASSERT_TRUE(untuned.ok());
  EXPECT_FALSE(untuned->skipped.empty());
  std::printf("%s\n", r->Summary().c_str());

  const ModelConfig& cfg = (*dir)->config();
  ForwardOptions fwd;
  fwd.aux_layer_ids = cfg.DefaultAuxLayerIds();
  for (const std::vector<int64_t>& lengths :
       {std::vector<int64_t>{512, 512, 512, 512}, std::vector<int64_t>{700, 300, 180, 411, 64, 200}}) {
    auto batch = PackSamples(bench::RandomSamples(lengths, cfg.vocab_size, 12345), cfg.vocab_size, o.device);
    ASSERT_TRUE(batch.ok()) << batch.status();
    auto a = (*tuned)->Forward(*batch, fwd);
    auto b = (*plain)->Forward(*batch, fwd);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(a->aux_hidden.equal(b->aux_hidden)) << batch->num_tokens() << " tokens";
    EXPECT_TRUE(a->last_hidden.equal(b->last_hidden)) << batch->num_tokens() << " tokens";
    EXPECT_TRUE(a->target_argmax.equal(b->target_argmax)) << batch->num_tokens() << " tokens";
  }
}

}  // namespace
}  // namespace e3
