// Checkpoints round-trip the draft, the optimizer state and the cursor,
// keep only the newest ones, and report damage clearly. Both optimizer
// implementations write one state format, so a checkpoint of either
// resumes with either, and both still read LibTorch's archive of earlier
// checkpoints. Damage to the newest (truncation, bad JSON, a missing file,
// a size that does not match) falls back to the one before; a full disk
// (the file size limit standing in for it) leaves every checkpoint as it
// was. All on real files.
#include "student_trainer/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <functional>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "student_trainer/checkpoint/checkpoint_manager.h"
#include "tests/file_size_limit.h"
#include "tests/scratch_dir.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

std::unique_ptr<DraftOptimizer> Optimizer(DraftOptimizerKind kind, Eagle3Draft& d) {
  DraftOptimizerOptions o;
  o.weight_decay = 0.1;
  auto opt = CreateDraftOptimizer(kind, *d, nullptr, nullptr, o);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(opt).value();
}

// One optimizer step with every gradient `g`.
void StepWith(DraftOptimizer& opt, Eagle3Draft& d, double g) {
  opt.BeginStep();
  d->flat().grad().fill_(g);
  ASSERT_TRUE(opt.FinishStep(1e-2).ok());
}

const char* KindName(DraftOptimizerKind k) { return k == DraftOptimizerKind::kFused ? "fused" : "reference"; }

std::string Scratch(const std::string& name) {
  std::string dir = testing::ScratchPath(name);
  (void)RemoveAll(dir);
  return dir;
}

struct KindPair {
  DraftOptimizerKind save, load;
};

class CheckpointRoundTripTest : public ::testing::TestWithParam<KindPair> {};

TEST_P(CheckpointRoundTripTest, RoundTripsWeightsOptimizerAndCursor) {
  const KindPair kinds = GetParam();
  const std::string dir = Scratch(std::string("ckpt_roundtrip_") + KindName(kinds.save) + "_" + KindName(kinds.load));
  Eagle3Draft a = testing::MakeTinyDraft(at::kFloat, 1);
  auto opt_a = Optimizer(kinds.save, a);
  // One real step so the optimizer has moments to save.
  StepWith(*opt_a, a, 1.0);
  TrainerState st;
  st.step = 12;
  st.cursors = {{1, 5}, {0, 7}};
  st.tokens = 3456;
  st.subscriber_id = "rank-0";
  auto path = SaveCheckpoint(dir, st, *a, *opt_a);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_TRUE(IsRegularFile(JoinPath(*path, "model.safetensors")));
  EXPECT_TRUE(IsRegularFile(JoinPath(*path, "optimizer.safetensors")));

  Eagle3Draft b = testing::MakeTinyDraft(at::kFloat, 2);  // different init
  auto opt_b = Optimizer(kinds.load, b);
  auto loaded = LoadNewestCheckpoint(dir, *b, *opt_b);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->state.has_value());
  EXPECT_TRUE(loaded->problems.empty());
  EXPECT_EQ(loaded->path, *path);
  const TrainerState& back = *loaded->state;
  EXPECT_EQ(back.step, 12);
  ASSERT_EQ(back.cursors.size(), 2u);
  EXPECT_EQ(back.cursors[0].epoch, 1);
  EXPECT_EQ(back.cursors[0].next_batch, 5);
  EXPECT_EQ(back.cursors[1].next_batch, 7);
  EXPECT_EQ(back.tokens, 3456);
  auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i])) << i;
  // The same gradient then moves both alike: the moments and the step
  // count came along (the two implementations round an ulp apart).
  StepWith(*opt_a, a, 0.5);
  StepWith(*opt_b, b, 0.5);
  for (size_t i = 0; i < pa.size(); ++i) {
    const double diff = (pa[i] - pb[i]).abs().max().item<double>();
    if (kinds.save == kinds.load) {
      EXPECT_EQ(diff, 0.0) << i;
    } else {
      EXPECT_LE(diff, 1e-6) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, CheckpointRoundTripTest,
                         ::testing::Values(KindPair{DraftOptimizerKind::kReference, DraftOptimizerKind::kReference},
                                           KindPair{DraftOptimizerKind::kFused, DraftOptimizerKind::kFused},
                                           KindPair{DraftOptimizerKind::kFused, DraftOptimizerKind::kReference},
                                           KindPair{DraftOptimizerKind::kReference, DraftOptimizerKind::kFused}));

TEST(CheckpointTest, EarlierCheckpointsWithLibTorchsArchiveStillLoad) {
  const std::string dir = Scratch("ckpt_legacy");
  Eagle3Draft a = testing::MakeTinyDraft(at::kFloat, 1);
  auto opt_a = Optimizer(DraftOptimizerKind::kReference, a);
  StepWith(*opt_a, a, 1.0);
  TrainerState st;
  st.step = 1;
  auto path = SaveCheckpoint(dir, st, *a, *opt_a);
  ASSERT_TRUE(path.ok()) << path.status();
  // Rewrite the optimizer state as LibTorch's archive, as checkpoints
  // were before optimizer.safetensors.
  {
    std::vector<at::Tensor> params;
    for (const auto& [name, p] : a->ExportedParameters()) params.push_back(p);
    torch::optim::AdamW torch_opt(params, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1));
    for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    torch::serialize::OutputArchive archive;
    torch_opt.step();
    torch_opt.save(archive);
    archive.save_to(JoinPath(*path, "optimizer.pt"));
    ASSERT_TRUE(RemoveAll(JoinPath(*path, "optimizer.safetensors")).ok());
    ASSERT_TRUE(RemoveAll(JoinPath(*path, "checksums.json")).ok());  // nor did they keep a manifest
  }
  for (DraftOptimizerKind kind : {DraftOptimizerKind::kReference, DraftOptimizerKind::kFused}) {
    SCOPED_TRACE(KindName(kind));
    Eagle3Draft b = testing::MakeTinyDraft(at::kFloat, 2);
    auto opt_b = Optimizer(kind, b);
    auto loaded = LoadNewestCheckpoint(dir, *b, *opt_b);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->state.has_value()) << loaded->problems.front();
  }
}

TEST(CheckpointTest, KeepsTheNewestAndStartsFreshWithoutOne) {
  const std::string dir = Scratch("ckpt_keep");
  Eagle3Draft d = testing::MakeTinyDraft();
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  auto none = LoadNewestCheckpoint(dir, *d, *opt);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->state.has_value());
  EXPECT_TRUE(none->problems.empty()) << "no directory is a first run, not a problem";
  TrainerState st;
  for (int64_t s : {10, 20, 30}) {
    st.step = s;
    ASSERT_TRUE(SaveCheckpoint(dir, st, *d, *opt, /*keep=*/2).ok());
  }
  auto entries = ListDir(dir);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000020", "step-00000030"}));
  EXPECT_EQ(*ReadFileToString(JoinPath(dir, "latest")), "step-00000030\n");
  auto one = SaveCheckpoint(dir, st, *d, *opt, /*keep=*/1);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(std::string(one.status().message()).find("expected at least 2"), std::string::npos) << one.status();
}

// A save that crashed left its temporary; the next save removes it.
TEST(CheckpointTest, ATemporaryLeftByACrashedSaveIsRemoved) {
  const std::string dir = Scratch("ckpt_stale_tmp");
  Eagle3Draft d = testing::MakeTinyDraft();
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  ASSERT_TRUE(MakeDirs(JoinPath(dir, "step-00000007.tmp")).ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "step-00000007.tmp/model.safetensors"), "half").ok());
  TrainerState st;
  st.step = 5;
  ASSERT_TRUE(SaveCheckpoint(dir, st, *d, *opt).ok());
  EXPECT_FALSE(PathExists(JoinPath(dir, "step-00000007.tmp")));
  auto loaded = LoadNewestCheckpoint(dir, *d, *opt);
  ASSERT_TRUE(loaded.ok() && loaded->state.has_value());
  EXPECT_EQ(loaded->state->step, 5);
}

// Two checkpoints whose weights differ, so that which one loaded shows.
struct TwoCheckpoints {
  std::string dir, older, newer;
  std::vector<at::Tensor> older_weights;
};

TwoCheckpoints SaveTwo(const std::string& name) {
  TwoCheckpoints t;
  t.dir = Scratch(name);
  Eagle3Draft d = testing::MakeTinyDraft(at::kFloat, 1);
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  StepWith(*opt, d, 1.0);
  TrainerState st;
  st.step = 10;
  st.cursors = {{0, 10}};
  t.older = SaveCheckpoint(t.dir, st, *d, *opt).value();
  for (const at::Tensor& p : d->parameters()) t.older_weights.push_back(p.detach().clone());
  StepWith(*opt, d, -1.0);
  st.step = 20;
  st.cursors = {{0, 20}};
  t.newer = SaveCheckpoint(t.dir, st, *d, *opt).value();
  return t;
}

void Truncate(const std::string& path) {
  auto bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(WriteFileAtomically(path, bytes->substr(0, bytes->size() / 2)).ok());
}

// model.safetensors whole and well formed, but fc.weight one row short.
void ShrinkFc(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : (*file)->Names()) {
    TensorView v = *(*file)->Get(name);
    TensorToWrite t{name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)};
    if (name == "fc.weight") {
      t.shape[0] -= 1;
      t.data.resize(t.data.size() / (t.shape[0] + 1) * t.shape[0]);
    }
    tensors.push_back(std::move(t));
  }
  file->reset();
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
}

// Flips `count` bytes of tensor `name` in a safetensors file, leaving it
// well formed: only a checksum can tell.
void FlipTensorBytes(const std::string& path, const std::string& name, size_t count) {
  std::string bytes = ReadFileToString(path).value();
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof(header));
  const nlohmann::json j = nlohmann::json::parse(bytes.substr(8, header));
  const size_t begin = 8 + header + j[name]["data_offsets"][0].get<size_t>();
  const size_t end = 8 + header + j[name]["data_offsets"][1].get<size_t>();
  ASSERT_LE(count, end - begin);
  for (size_t i = 0; i < count; ++i) bytes[begin + i] = static_cast<char>(bytes[begin + i] ^ 0x5a);
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
}

struct Damage {
  const char* name;
  std::function<void(const std::string& checkpoint)> apply;
  const char* file;    // the file the warning must name
  const char* reason;  // and what it says is wrong
  // Damage the manifest (checksums.json) cannot see is still caught by
  // the loaders' own checks: those cases run without it, as checkpoints
  // written before it was kept do.
  bool keep_manifest = false;
};

// Test names show the damage, not its bytes.
void PrintTo(const Damage& damage, std::ostream* os) { *os << damage.name; }

class CheckpointDamageTest : public ::testing::TestWithParam<Damage> {};

TEST_P(CheckpointDamageTest, TheNewestFallsBackToTheOneBeforeNamingTheFile) {
  const Damage& damage = GetParam();
  TwoCheckpoints two = SaveTwo(std::string("ckpt_damage_") + damage.name);
  ASSERT_TRUE(IsRegularFile(JoinPath(two.newer, "checksums.json")));
  if (!damage.keep_manifest) ASSERT_TRUE(RemoveAll(JoinPath(two.newer, "checksums.json")).ok());
  damage.apply(two.newer);

  Eagle3Draft fresh = testing::MakeTinyDraft(at::kFloat, 2);
  auto opt = Optimizer(DraftOptimizerKind::kFused, fresh);
  auto loaded = LoadNewestCheckpoint(two.dir, *fresh, *opt);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->state.has_value());
  EXPECT_EQ(loaded->state->step, 10);
  EXPECT_EQ(loaded->state->cursors[0].next_batch, 10);
  EXPECT_EQ(loaded->path, two.older);
  ASSERT_EQ(loaded->problems.size(), 1u);
  const std::string& problem = loaded->problems[0];
  EXPECT_NE(problem.find(JoinPath(two.newer, damage.file)), std::string::npos) << problem;
  EXPECT_NE(problem.find(damage.reason), std::string::npos) << problem;
  auto params = fresh->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].equal(two.older_weights[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, CheckpointDamageTest,
    ::testing::Values(
        Damage{"truncated_weights", [](const std::string& c) { Truncate(JoinPath(c, "model.safetensors")); },
               "model.safetensors", "truncated"},
        Damage{"truncated_optimizer",
               [](const std::string& c) { Truncate(JoinPath(c, "optimizer.safetensors")); },
               "optimizer.safetensors", "truncated"},
        Damage{"bad_json",
               [](const std::string& c) {
                 ASSERT_TRUE(WriteFileAtomically(JoinPath(c, "trainer_state.json"), "{\"step\": 20, \"cur").ok());
               },
               "trainer_state.json", "not a JSON object"},
        Damage{"missing_config",
               [](const std::string& c) { ASSERT_TRUE(RemoveAll(JoinPath(c, "config.json")).ok()); },
               "config.json", "cannot open"},
        Damage{"missing_optimizer",
               [](const std::string& c) { ASSERT_TRUE(RemoveAll(JoinPath(c, "optimizer.safetensors")).ok()); },
               "optimizer.safetensors", "missing"},
        Damage{"size_mismatch", [](const std::string& c) { ShrinkFc(JoinPath(c, "model.safetensors")); },
               "model.safetensors", "\"fc.weight\": expected shape"},
        Damage{"flipped_weight_bytes",
               [](const std::string& c) { FlipTensorBytes(JoinPath(c, "model.safetensors"), "fc.weight", 64); },
               "model.safetensors", "CRC-32C", /*keep_manifest=*/true},
        Damage{"truncated_with_manifest",
               [](const std::string& c) { Truncate(JoinPath(c, "optimizer.safetensors")); },
               "optimizer.safetensors", "bytes, but checksums.json records", /*keep_manifest=*/true},
        Damage{"damaged_manifest",
               [](const std::string& c) {
                 ASSERT_TRUE(WriteFileAtomically(JoinPath(c, "checksums.json"), "{\"files\": 3}").ok());
               },
               "checksums.json", "expected an object with a \"files\" object", /*keep_manifest=*/true}),
    [](const ::testing::TestParamInfo<Damage>& info) { return std::string(info.param.name); });

// None loads: the draft and optimizer stay as they were (every check comes
// before the first copy), and every checkpoint is named with its damage.
TEST(CheckpointTest, WhenNoneLoadsTheDraftIsUntouchedAndEachIsNamed) {
  TwoCheckpoints two = SaveTwo("ckpt_none_loads");
  Truncate(JoinPath(two.newer, "optimizer.safetensors"));
  ShrinkFc(JoinPath(two.older, "model.safetensors"));
  ASSERT_TRUE(WriteFileAtomically(JoinPath(two.dir, "latest"), "step-99999999\n").ok());
  Eagle3Draft d = testing::MakeTinyDraft(at::kFloat, 2);
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : d->parameters()) before.push_back(p.detach().clone());
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  auto loaded = LoadNewestCheckpoint(two.dir, *d, *opt);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->state.has_value());
  ASSERT_EQ(loaded->problems.size(), 3u);
  EXPECT_NE(loaded->problems[0].find("step-99999999"), std::string::npos) << loaded->problems[0];
  EXPECT_NE(loaded->problems[1].find(two.newer), std::string::npos) << loaded->problems[1];
  EXPECT_NE(loaded->problems[2].find(two.older), std::string::npos) << loaded->problems[2];
  auto params = d->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].equal(before[i])) << i;
  // The optimizer too: one step from here moves it as a fresh one moves.
  Eagle3Draft twin = testing::MakeTinyDraft(at::kFloat, 2);
  auto twin_opt = Optimizer(DraftOptimizerKind::kFused, twin);
  StepWith(*opt, d, 0.5);
  StepWith(*twin_opt, twin, 0.5);
  auto twin_params = twin->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].equal(twin_params[i])) << i;
}

// The manager decides what "none loads" means: stop, naming each, unless
// the user asked to start from the initial draft.
TEST(CheckpointTest, NoLoadableCheckpointStopsUnlessStartingFreshWasAsked) {
  TwoCheckpoints two = SaveTwo("ckpt_manager_policy");
  Truncate(JoinPath(two.newer, "model.safetensors"));
  Truncate(JoinPath(two.older, "model.safetensors"));
  Eagle3Draft d = testing::MakeTinyDraft(at::kFloat, 2);
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  CheckpointManagerOptions o;
  o.dir = two.dir;
  auto stopped = CheckpointManager(o).Resume(*d, *opt, 1);
  ASSERT_FALSE(stopped.ok());
  const std::string message(stopped.status().message());
  EXPECT_NE(message.find("no checkpoint in " + two.dir + " loads"), std::string::npos) << message;
  EXPECT_NE(message.find(JoinPath(two.newer, "model.safetensors")), std::string::npos) << message;
  EXPECT_NE(message.find(JoinPath(two.older, "model.safetensors")), std::string::npos) << message;
  EXPECT_NE(message.find("--on_checkpoint_load_error=start_fresh"), std::string::npos) << message;
  o.on_load_error = OnCheckpointLoadError::kStartFresh;
  auto fresh = CheckpointManager(o).Resume(*d, *opt, 1);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->has_value());
  EXPECT_FALSE(ParseOnCheckpointLoadError("sometimes").ok());
  EXPECT_NE(std::string(ParseOnCheckpointSaveError("retry").status().message()).find("--on_checkpoint_save_error"),
            std::string::npos);
}

// A save after a fallback sets the skipped checkpoint aside instead of
// letting it stand beside (and, by its name, before) the new one.
TEST(CheckpointTest, ASaveAfterAFallbackSetsTheSkippedOneAside) {
  TwoCheckpoints two = SaveTwo("ckpt_set_aside");
  Truncate(JoinPath(two.newer, "model.safetensors"));
  Eagle3Draft d = testing::MakeTinyDraft(at::kFloat, 2);
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  auto loaded = LoadNewestCheckpoint(two.dir, *d, *opt);
  ASSERT_TRUE(loaded.ok() && loaded->state.has_value());
  TrainerState st = *loaded->state;
  st.step = 15;
  ASSERT_TRUE(SaveCheckpoint(two.dir, st, *d, *opt).ok());
  auto entries = ListDir(two.dir);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000010", "step-00000015",
                                                "step-00000020.unloadable"}));
  auto again = LoadNewestCheckpoint(two.dir, *d, *opt);
  ASSERT_TRUE(again.ok() && again->state.has_value());
  EXPECT_EQ(again->state->step, 15);
  EXPECT_TRUE(again->problems.empty());
}

// A save that crashed after its directory was complete but before `latest`
// moved: that directory is the newest checkpoint, and it loads.
TEST(CheckpointTest, ACompleteCheckpointNewerThanLatestIsTheOneLoaded) {
  TwoCheckpoints two = SaveTwo("ckpt_newer_than_latest");
  ASSERT_TRUE(WriteFileAtomically(JoinPath(two.dir, "latest"), "step-00000010\n").ok());
  Eagle3Draft d = testing::MakeTinyDraft(at::kFloat, 2);
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  auto loaded = LoadNewestCheckpoint(two.dir, *d, *opt);
  ASSERT_TRUE(loaded.ok() && loaded->state.has_value());
  EXPECT_EQ(loaded->state->step, 20);
  EXPECT_TRUE(loaded->problems.empty());
}


TEST(CheckpointTest, AFullDiskFailsTheSaveNamingTheFileAndKeepsThePrevious) {
  TwoCheckpoints two = SaveTwo("ckpt_disk_full");
  const int64_t weights = static_cast<int64_t>(ReadFileToString(JoinPath(two.newer, "model.safetensors"))->size());
  const int64_t moments =
      static_cast<int64_t>(ReadFileToString(JoinPath(two.newer, "optimizer.safetensors"))->size());
  ASSERT_LT(weights, moments) << "the limit below must pass the weights and stop the optimizer state";
  const int64_t limit = (weights + moments) / 2;
  Eagle3Draft d = testing::MakeTinyDraft(at::kFloat, 3);
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  TrainerState st;
  st.step = 30;
  st.cursors = {{0, 30}};
  absl::StatusOr<std::string> saved;
  {
    testing::FileSizeLimit full(static_cast<rlim_t>(limit));
    ASSERT_TRUE(full.ok());
    saved = SaveCheckpoint(two.dir, st, *d, *opt);
  }
  ASSERT_FALSE(saved.ok());
  const std::string message(saved.status().message());
  EXPECT_NE(message.find(JoinPath(two.dir, "step-00000030.tmp/optimizer.safetensors")), std::string::npos)
      << message;
  EXPECT_NE(message.find(absl::StrCat("write failed after ", limit, " of ", moments, " bytes (",
                                      moments - limit, " bytes not written)")),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  auto entries = ListDir(two.dir);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000010", "step-00000020"}))
      << "the partial checkpoint is removed, the others are kept";
  EXPECT_EQ(*ReadFileToString(JoinPath(two.dir, "latest")), "step-00000020\n");
  auto loaded = LoadNewestCheckpoint(two.dir, *d, *opt);
  ASSERT_TRUE(loaded.ok() && loaded->state.has_value());
  EXPECT_EQ(loaded->state->step, 20);
  EXPECT_TRUE(loaded->problems.empty());
}

}  // namespace
}  // namespace e3
