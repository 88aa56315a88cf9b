// Data regeneration on the bundled tiny-code-llama (CPU, fp32): each
// assistant turn becomes the model's own continuation of the conversation
// before it (later turns see the earlier regenerated ones), everything
// else is kept, the result is a training file the dataset reader takes,
// its cache is reused only under the same fingerprint, and sampling is
// reproducible from its seed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "common/data/dataset.h"
#include "common/model/model_dir.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "nlohmann/json.hpp"
#include "teacher_server/data/regenerate.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/runtime/generation.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

const std::string kModel = std::string(E3_SOURCE_DIR) + "/examples/tiny-code-llama";

class RegenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ModelDir::Open(kModel).value().release();
    model_ = LoadCausalLM(*dir_, ModelOptions{}).value().release();
    tokenizer_ = Tokenizer::FromFile(kModel + "/tokenizer.json").value().release();
    template_ = new ChatTemplate(ChatTemplate::Load(kModel, {}).value());
  }
  static void TearDownTestSuite() {
    delete template_;
    delete tokenizer_;
    delete model_;
    delete dir_;
  }
  // A file of this test's scratch, and the fingerprint the regenerator
  // writes beside a data file; both go when the test passes.
  std::string Path(const std::string& name) const {
    testing::ScratchPath("e3_regen", "_" + name + ".fingerprint");
    return testing::ScratchPath("e3_regen", "_" + name);
  }
  std::string WriteData(const std::string& name) const {
    const std::string path = Path(name);
    std::ofstream(path) << R"({"conversations": [{"role": "user", "content": "def add(a, b):"}, )"
                        << R"({"role": "assistant", "content": "old answer one"}, )"
                        << R"({"role": "user", "content": "and subtract?"}, )"
                        << R"({"role": "assistant", "content": "old answer two"}]})" << "\n"
                        << R"({"conversations": [{"role": "user", "content": "no answer here"}]})" << "\n"
                        << R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]})" << "\n"
                        << "not json\n"
                        << R"({"conversations": [{"from": "human", "value": "import os"}, )"
                        << R"({"from": "gpt", "value": "old"}]})" << "\n";
    return path;
  }
  RegenerateOptions Options(const std::string& cache, double temperature = 0) const {
    RegenerateOptions o;
    o.generation.max_new_tokens = 8;
    o.generation.temperature = temperature;
    o.generation.seed = 5;
    for (int64_t id : model_->config().eos_token_ids) o.generation.stop_ids.push_back(static_cast<int32_t>(id));
    o.cache_path = Path(cache);
    return o;
  }
  // What the model continues `context` with, decoded, its stop id dropped.
  std::string Continue(const std::vector<ChatMessage>& context, const GenerationOptions& g) const {
    auto ids = TokenizePrompt(*tokenizer_, *template_, context);
    EXPECT_TRUE(ids.ok());
    auto out = GenerateContinuations(*model_, {*ids}, g);
    EXPECT_TRUE(out.ok()) << out.status();
    std::vector<int32_t> c = out->front();
    for (int32_t stop : g.stop_ids)
      if (!c.empty() && c.back() == stop) c.pop_back();
    return tokenizer_->Decode(c);
  }

  static inline ModelDir* dir_ = nullptr;
  static inline CausalLM* model_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ChatTemplate* template_ = nullptr;
};

TEST_F(RegenerateTest, EachAssistantTurnBecomesTheModelsContinuation) {
  const std::string data = WriteData("data.jsonl");
  const RegenerateOptions o = Options("greedy.jsonl");
  auto fp = RegenerationFingerprint(data, "cfg", template_->fingerprint(), o.generation);
  ASSERT_TRUE(fp.ok()) << fp.status();
  auto report = RegenerateData(*model_, *tokenizer_, *template_, data, *fp, o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->reused);
  EXPECT_EQ(report->conversations, 2);
  EXPECT_EQ(report->turns, 3);
  EXPECT_EQ(report->pretokenized, 1);
  EXPECT_EQ(report->malformed, 1);
  EXPECT_GT(report->tokens, 0);

  auto lines = ReadChatLines(o.cache_path, /*skip_malformed=*/false, &report->malformed);
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 4u);
  const auto& a = (*lines)[0].messages;
  ASSERT_EQ(a.size(), 4u);
  const std::string first = Continue({{"user", "def add(a, b):"}}, o.generation);
  EXPECT_EQ(a[1].content, first);
  // The second turn continues the conversation with the regenerated first.
  EXPECT_EQ(a[3].content, Continue({{"user", "def add(a, b):"}, {"assistant", first}, {"user", "and subtract?"}},
                                   o.generation));
  EXPECT_EQ(a[2].content, "and subtract?");
  EXPECT_EQ((*lines)[1].messages.size(), 1u);  // nothing to regenerate
  EXPECT_EQ(nlohmann::json::parse((*lines)[2].pretokenized),
            nlohmann::json::parse(R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]})"));
  EXPECT_EQ((*lines)[3].messages[1].content, Continue({{"user", "import os"}}, o.generation));

  // A training file like any other: the regenerated turns are trained.
  DatasetOptions d;
  d.path = o.cache_path;
  auto dataset = Dataset::Load(d, *tokenizer_, *template_);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 3);  // the answerless conversation has no trained token
  EXPECT_EQ((*dataset)->stats().malformed, 0);

  // The same fingerprint reuses the cache; another regenerates.
  auto again = RegenerateData(*model_, *tokenizer_, *template_, data, *fp, o);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->reused);
  std::ofstream(data, std::ios::app) << R"({"conversations": [{"role": "user", "content": "x"}]})" << "\n";
  auto changed = RegenerationFingerprint(data, "cfg", template_->fingerprint(), o.generation);
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(*changed, *fp);
  auto redone = RegenerateData(*model_, *tokenizer_, *template_, data, *changed, o);
  ASSERT_TRUE(redone.ok());
  EXPECT_FALSE(redone->reused);
  EXPECT_EQ(ReadFileToString(o.cache_path + ".fingerprint").value(), *changed + "\n");
}

TEST_F(RegenerateTest, SamplingIsReproducibleFromItsSeed) {
  const std::string data = WriteData("data2.jsonl");
  const RegenerateOptions greedy = Options("g.jsonl"), s1 = Options("s1.jsonl", 1.5), s2 = Options("s2.jsonl", 1.5);
  auto fg = RegenerationFingerprint(data, "cfg", template_->fingerprint(), greedy.generation);
  auto fs = RegenerationFingerprint(data, "cfg", template_->fingerprint(), s1.generation);
  ASSERT_TRUE(fg.ok() && fs.ok());
  EXPECT_NE(*fg, *fs);
  ASSERT_TRUE(RegenerateData(*model_, *tokenizer_, *template_, data, *fg, greedy).ok());
  ASSERT_TRUE(RegenerateData(*model_, *tokenizer_, *template_, data, *fs, s1).ok());
  ASSERT_TRUE(RegenerateData(*model_, *tokenizer_, *template_, data, *fs, s2).ok());
  const std::string g = ReadFileToString(greedy.cache_path).value();
  const std::string a = ReadFileToString(s1.cache_path).value(), b = ReadFileToString(s2.cache_path).value();
  EXPECT_EQ(a, b);  // the same seed, the same draws
  EXPECT_NE(a, g);  // and not the argmax
}

}  // namespace
}  // namespace e3
