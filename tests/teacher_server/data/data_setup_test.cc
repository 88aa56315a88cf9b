// The teacher's data stage on the bundled model and conversations: the
// template renders, the draft vocab is calibrated on all the data before a
// teacher keeps its shard, and options that cannot work are refused by
// flag name before anything loads.
#include "teacher_server/data/data_setup.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "teacher_server/runtime/model_runtime.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

const std::string kSrc = E3_SOURCE_DIR;

TeacherDataOptions Options() {
  TeacherDataOptions o;
  o.model_dir = kSrc + "/examples/tiny-code-llama";
  o.data = kSrc + "/examples/data/train_conversations.jsonl";
  o.max_samples = 60;
  o.max_seq_len = 256;
  o.draft_vocab_size = 512;
  return o;
}

std::unique_ptr<CausalLM> TinyModel() {
  auto dir = ModelDir::Open(kSrc + "/examples/tiny-code-llama");
  EXPECT_TRUE(dir.ok()) << dir.status();
  ModelRuntimeOptions r;
  auto model = LoadTeacherModel(**dir, *MakeModelOptions(r), r);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

TEST(DataSetupTest, ShardsSplitTheSamplesByIdModuloTheirCount) {
  std::vector<Sample> samples(7);
  for (int i = 0; i < 7; ++i) samples[i].id = i;
  std::vector<int64_t> ids;
  for (const Sample& s : SamplesOfShard(samples, 3, 1)) ids.push_back(s.id);
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(SamplesOfShard(samples, 1, 0).size(), 7u);
}

TEST(DataSetupTest, OptionsThatCannotWorkAreRefusedByFlag) {
  TeacherDataOptions o = Options();
  o.data_shard = 2;
  o.num_data_shards = 2;
  EXPECT_EQ(ValidateTeacherDataOptions(o, false).message(),
            "--data_shard=2 is outside [0, --num_data_shards=2)");
  o = Options();
  o.data.clear();
  EXPECT_EQ(ValidateTeacherDataOptions(o, false).message(), "--data is required");
  o = Options();
  o.regenerate = true;
  EXPECT_TRUE(ValidateTeacherDataOptions(o, false).ok());
  EXPECT_NE(ValidateTeacherDataOptions(o, true).message().find("--regenerate"), std::string::npos);
  o = Options();
  o.eval_prompts = "eval.jsonl";
  EXPECT_NE(ValidateTeacherDataOptions(o, true).message().find("--eval_prompts"),
            std::string::npos);
}

TEST(DataSetupTest, EveryShardServesTheVocabCalibratedOnAllTheData) {
  std::unique_ptr<CausalLM> model = TinyModel();
  TeacherDataOptions whole = Options();
  auto all = SetUpTeacherData(whole, model.get());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->dataset->size(), 60);
  EXPECT_EQ(all->vocab.draft_vocab_size(), 512);

  std::set<int64_t> seen;  // source lines: a shard numbers its samples anew
  for (int shard = 0; shard < 2; ++shard) {
    TeacherDataOptions o = Options();
    o.num_data_shards = 2;
    o.data_shard = shard;
    auto mine = SetUpTeacherData(o, model.get());
    ASSERT_TRUE(mine.ok()) << mine.status();
    EXPECT_EQ(mine->vocab.d2t, all->vocab.d2t) << "shard " << shard;
    EXPECT_EQ(mine->dataset->size(), 30);
    for (const Sample& s : mine->dataset->samples())
      EXPECT_TRUE(seen.insert(s.line).second) << s.line;
  }
  EXPECT_EQ(seen.size(), 60u);
  auto none = StartEvalSet(whole, model.get(), *all, {1, 3, 4}, 1024);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);  // no eval prompts, no eval set
}

TEST(DataSetupTest, AVocabMapOfAnotherModelIsRefusedNamingTheFile) {
  std::unique_ptr<CausalLM> model = TinyModel();
  VocabMap other;
  other.target_vocab_size = 100;
  other.d2t = {0, 0};
  other.t2d.assign(100, 0);
  other.t2d[0] = other.t2d[1] = 1;
  const std::string path = testing::ScratchPath("other_vocab", ".safetensors");
  ASSERT_TRUE(SaveVocabMap(other, path).ok());
  TeacherDataOptions o = Options();
  o.vocab_map = path;
  auto data = SetUpTeacherData(o, model.get());
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().message(), path + ": target vocab 100 but the model has 8192");
}

// A system prompt and tool schema that fill --max_seq_len leave no answer
// to train on: the error says so and what to raise, not only "no samples".
TEST(DataSetupTest, DataCutBeforeAnyAnswerNamesMaxSeqLen) {
  std::unique_ptr<CausalLM> model = TinyModel();
  TeacherDataOptions o = Options();
  o.data = kSrc + "/tests/fixtures/newcomer/messages_a.jsonl";
  o.chat_template.file = kSrc + "/tests/fixtures/chat_templates/qwen3.jinja";
  o.max_seq_len = 96;
  auto data = SetUpTeacherData(o, model.get());
  ASSERT_FALSE(data.ok());
  EXPECT_NE(std::string(data.status().message()).find(
                "were cut to --max_seq_len=96 (data.max_seq_len) before any trained token: raise it"),
            std::string::npos)
      << data.status();
}

}  // namespace
}  // namespace e3
