#include "common/data/dataset.h"

#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "common/data/vocab_map.h"
#include "common/stream/sample_order.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kModelDir[] = E3_SOURCE_DIR "/examples/tiny-code-llama";
constexpr char kTrainData[] = E3_SOURCE_DIR "/examples/data/train_conversations.jsonl";
constexpr char kTokenizerHead[] = E3_SOURCE_DIR "/tests/fixtures/tokenizer_head.jsonl";
constexpr int64_t kTrainLines = 2999;

class DatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tokenizer = Tokenizer::FromFile(std::string(kModelDir) + "/tokenizer.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(tokenizer).value().release();
    auto chat_template = ChatTemplate::Load(kModelDir, {});
    ASSERT_TRUE(chat_template.ok()) << chat_template.status();
    template_ = new ChatTemplate(*chat_template);
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete template_;
    tokenizer_ = nullptr;
    template_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(tokenizer_, nullptr) << "tokenizer failed to load";
    ASSERT_NE(template_, nullptr) << "chat template failed to load";
    dir_ = std::filesystem::temp_directory_path() /
           ("e3_dataset_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    out << text;
    return path;
  }

  absl::StatusOr<std::unique_ptr<Dataset>> Load(const DatasetOptions& options) const {
    return Dataset::Load(options, *tokenizer_, *template_);
  }

  DatasetOptions Options(const std::string& path) const {
    DatasetOptions options;
    options.path = path;
    return options;
  }

  static Tokenizer* tokenizer_;
  static ChatTemplate* template_;
  std::filesystem::path dir_;
};

Tokenizer* DatasetTest::tokenizer_ = nullptr;
ChatTemplate* DatasetTest::template_ = nullptr;

// absl::string_view is not std::string_view in this build; gmock's string
// matchers need a std::string.
std::string Msg(const absl::Status& status) { return std::string(status.message()); }

int64_t Sum(const std::vector<uint8_t>& mask) {
  return std::accumulate(mask.begin(), mask.end(), int64_t{0});
}

TEST_F(DatasetTest, RoleContentAndFromValueAgree) {
  const std::string path = Write(
      "chat.jsonl",
      R"({"conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]})"
      "\n"
      R"({"id": "x1", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there"}]})"
      "\n"
      R"({"conversations": [{"from": "system", "value": "Be brief."}, {"from": "user", "value": "Hi"}, {"from": "chatgpt", "value": "Hello there"}]})"
      "\n"
      R"({"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}, {"from": "bot", "value": "Hello there"}]})"
      "\n"
      R"({"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}, {"from": "assistant", "value": "Hello there"}]})"
      "\n");
  auto dataset = Load(Options(path));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Dataset& d = **dataset;
  ASSERT_EQ(d.size(), 5);
  EXPECT_EQ(d.stats().conversations, 5);
  EXPECT_EQ(d.stats().malformed, 0);
  for (int64_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d[i].id, i);
    EXPECT_EQ(d[i].line, i + 1);
    EXPECT_EQ(d[i].input_ids, d[0].input_ids) << "line " << i + 1;
    EXPECT_EQ(d[i].loss_mask, d[0].loss_mask) << "line " << i + 1;
  }

  // The tokens match rendering the chat by hand and encoding it whole.
  const std::string text =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHello there<|eot_id|>";
  EXPECT_EQ(d[0].input_ids, tokenizer_->Encode(text).ids);
  // Only the assistant's words and its <|eot_id|> are trained.
  const std::vector<int32_t> reply = tokenizer_->Encode("Hello there").ids;
  const std::vector<uint8_t>& mask = d[0].loss_mask;
  EXPECT_EQ(Sum(mask), static_cast<int64_t>(reply.size()) + 1);
  EXPECT_EQ(mask.front(), 0);
  EXPECT_EQ(mask.back(), 1);
  EXPECT_EQ(d[0].input_ids.back(), *tokenizer_->TokenToId("<|eot_id|>"));
  // The trained tokens are the tail of the sample.
  const size_t n = mask.size();
  for (size_t t = 0; t < n; ++t) EXPECT_EQ(mask[t], t + reply.size() + 1 >= n ? 1 : 0) << t;

  DatasetOptions all = Options(path);
  all.train_on_all_tokens = true;
  auto everything = Load(all);
  ASSERT_TRUE(everything.ok());
  EXPECT_EQ((**everything)[0].input_ids, d[0].input_ids);
  EXPECT_EQ(Sum((**everything)[0].loss_mask), static_cast<int64_t>(n));
}

// Eval prompts: a conversation up to its last user turn with the
// generation prompt, as a serving engine renders it; a pre-tokenized
// line's ids before its last trained run; nothing trained.
TEST_F(DatasetTest, PromptsOnlyKeepWhatPrecedesTheLastAnswer) {
  const std::string path = Write(
      "prompts.jsonl",
      R"({"conversations": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},)"
      R"( {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})"
      "\n"
      R"({"conversations": [{"role": "user", "content": "only a question"}]})"
      "\n"
      R"({"input_ids": [5, 6, 7, 8, 9, 10, 11], "loss_mask": [0, 0, 1, 1, 0, 1, 1]})"
      "\n"
      R"({"input_ids": [5, 6], "loss_mask": [0, 0]})"
      "\n"
      R"({"conversations": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "x"}]})"
      "\n");
  DatasetOptions o = Options(path);
  o.prompts_only = true;
  o.drop_empty_loss_mask = false;
  o.min_length = 1;
  auto dataset = Load(o);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Dataset& d = **dataset;
  ASSERT_EQ(d.size(), 4);
  auto prompt = TokenizePrompt(*tokenizer_, *template_,
                               {{"user", "a"}, {"assistant", "b"}, {"user", "c"}});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(d[0].input_ids, *prompt);
  auto rendered = template_->Render({{"user", "a"}, {"assistant", "b"}, {"user", "c"}}, true);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(tokenizer_->Decode(d[0].input_ids), rendered->text);  // ends with the assistant header
  EXPECT_THAT(d[2].input_ids, ElementsAre(5, 6, 7, 8, 9));
  EXPECT_THAT(d[3].input_ids, ElementsAre(5, 6));
  for (const Sample& sample : d.samples()) EXPECT_EQ(Sum(sample.loss_mask), 0);
  EXPECT_EQ(d.stats().malformed, 1);
  ASSERT_EQ(d.stats().first_errors.size(), 1u);
  EXPECT_THAT(d.stats().first_errors[0], HasSubstr("no user turn"));
}

TEST_F(DatasetTest, PretokenizedLines) {
  const std::string path =
      Write("ids.jsonl", R"({"input_ids": [1, 2, 3, 8191], "loss_mask": [0, 0, 1, 1]})"
                         "\n"
                         R"({"input_ids": [7, 7, 7], "loss_mask": [false, true, true]})"
                         "\n");
  auto dataset = Load(Options(path));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Dataset& d = **dataset;
  ASSERT_EQ(d.size(), 2);
  EXPECT_THAT(d[0].input_ids, ElementsAre(1, 2, 3, 8191));
  EXPECT_THAT(d[0].loss_mask, ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(d[1].input_ids, ElementsAre(7, 7, 7));
  EXPECT_THAT(d[1].loss_mask, ElementsAre(0, 1, 1));
  EXPECT_EQ(d.stats().pretokenized, 2);
  EXPECT_EQ(d.stats().total_tokens, 7);
  EXPECT_EQ(d.stats().loss_tokens, 4);
  EXPECT_EQ(d.stats().max_sample_length, 4);
  EXPECT_THAT(d.Lengths(), ElementsAre(4, 3));

  // A bigger vocab_size admits ids the tokenizer does not know.
  const std::string big = Write("big.jsonl", R"({"input_ids": [9000, 1], "loss_mask": [1, 1]})");
  auto narrow = Load(Options(big));
  ASSERT_TRUE(narrow.ok());
  EXPECT_EQ((**narrow).size(), 0);
  EXPECT_EQ((**narrow).stats().malformed, 1);
  DatasetOptions wide = Options(big);
  wide.vocab_size = 10000;
  auto widened = Load(wide);
  ASSERT_TRUE(widened.ok());
  EXPECT_EQ((**widened).size(), 1);
}

// One malformed line per case: what it is and what the message must say.
struct MalformedCase {
  const char* name;
  const char* line;
  const char* expected;
};

const std::vector<MalformedCase>& MalformedCases() {
  static const auto* cases = new std::vector<MalformedCase>{
      {"bad_json", R"({"conversations": [)", "invalid JSON at byte"},
      {"not_object", R"([1, 2, 3])", "line is a JSON array; expected an object"},
      {"no_known_key", R"({"text": "hello"})",
       "expected a \"messages\" or \"conversations\" array, or \"input_ids\" and \"loss_mask\" arrays"},
      {"conversations_not_array", R"({"conversations": "hi"})",
       "\"conversations\" is string; expected an array of turns"},
      {"conversations_empty", R"({"conversations": []})", "\"conversations\" is empty"},
      {"turn_not_object", R"({"conversations": ["hi"]})",
       "conversations[0] is string; expected an object"},
      {"missing_content", R"({"conversations": [{"role": "user"}]})",
       "conversations[0] has no \"content\""},
      {"content_number", R"({"conversations": [{"role": "user", "content": 5}]})",
       "conversations[0].content is number; expected a string, null or a list of text parts"},
      {"image_part", R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type is \"image_url\"; expected \"text\""},
      {"missing_value", R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt"}]})",
       "conversations[1] has no \"value\""},
      {"unknown_role", R"({"conversations": [{"role": "robot", "content": "beep"}]})",
       "conversations[0].role is \"robot\"; expected system, developer, user, assistant or tool"},
      {"unknown_from", R"({"conversations": [{"from": "narrator", "value": "once"}]})",
       "conversations[0].from is \"narrator\"; expected human/user, gpt/assistant, system or tool/observation"},
      {"no_role_or_from", R"({"conversations": [{"speaker": "user", "text": "x"}]})",
       "conversations[0] has neither \"role\"/\"content\" nor \"from\"/\"value\""},
      {"mismatched_lengths", R"({"input_ids": [1, 2, 3], "loss_mask": [1, 1]})",
       "\"input_ids\" has 3 values but \"loss_mask\" has 2; expected the same length"},
      {"missing_mask", R"({"input_ids": [1, 2, 3]})", "has \"input_ids\" but no \"loss_mask\""},
      {"id_too_big", R"({"input_ids": [1, 8192], "loss_mask": [1, 1]})",
       "input_ids[1] is 8192; expected an integer in [0, 8192)"},
      {"id_negative", R"({"input_ids": [-1, 2], "loss_mask": [1, 1]})",
       "input_ids[0] is -1; expected an integer in [0, 8192)"},
      {"id_huge", R"({"input_ids": [18446744073709551615], "loss_mask": [1]})",
       "input_ids[0] is 18446744073709551615"},
      {"id_float", R"({"input_ids": [1.5], "loss_mask": [1]})", "input_ids[0] is 1.5"},
      {"mask_value", R"({"input_ids": [1, 2], "loss_mask": [1, 2]})",
       "loss_mask[1] is 2; expected 0 or 1"},
      {"ids_not_array", R"({"input_ids": 5, "loss_mask": [1]})",
       "\"input_ids\" is number; expected an array of token ids"},
      {"both_kinds",
       R"({"conversations": [{"role": "user", "content": "x"}], "input_ids": [1], "loss_mask": [1]})",
       "has both a conversation and \"input_ids\""},
  };
  return *cases;
}

constexpr char kGoodIds[] = R"({"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]})";

TEST_F(DatasetTest, MalformedLinesSkippedAndCounted) {
  std::string text = std::string(kGoodIds) + "\n";
  for (const MalformedCase& c : MalformedCases()) text += std::string(c.line) + "\n";
  text += std::string(kGoodIds) + "\n";
  const std::string path = Write("mixed.jsonl", text);
  DatasetOptions options = Options(path);
  options.skip_malformed = true;
  options.max_error_messages = 100;
  auto dataset = Load(options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Dataset& d = **dataset;
  const int64_t num_bad = static_cast<int64_t>(MalformedCases().size());
  EXPECT_EQ(d.size(), 2);
  EXPECT_EQ(d.stats().malformed, num_bad);
  EXPECT_EQ(d.stats().lines_read, num_bad + 2);
  EXPECT_EQ(d[1].line, num_bad + 2);
  ASSERT_EQ(static_cast<int64_t>(d.stats().first_errors.size()), num_bad);
  for (int64_t i = 0; i < num_bad; ++i) {
    const std::string& error = d.stats().first_errors[i];
    EXPECT_THAT(error, StartsWith(path + ":" + std::to_string(i + 2) + ": ")) << error;
    EXPECT_THAT(error, HasSubstr(MalformedCases()[i].expected)) << MalformedCases()[i].name;
  }
  EXPECT_THAT(d.Summary(), HasSubstr(std::to_string(num_bad) + " malformed"));
  // Counted by cause, the counts summing to the total.
  int64_t by_cause = 0;
  for (const auto& [cause, n] : d.stats().malformed_by_cause) by_cause += n;
  EXPECT_EQ(by_cause, num_bad);
  EXPECT_EQ(d.stats().malformed_by_cause.at("invalid JSON"), 1);
  EXPECT_EQ(d.stats().malformed_by_cause.at("bad input_ids/loss_mask"), 8);
  EXPECT_THAT(d.Summary(), HasSubstr("malformed by cause: "));
  EXPECT_THAT(d.Summary(), HasSubstr("1 invalid JSON"));
  EXPECT_THAT(d.Summary(), HasSubstr("first malformed: " + path + ":2: "));

  // Only the first few messages are kept; the count stays exact.
  options.max_error_messages = 3;
  auto few = Load(options);
  ASSERT_TRUE(few.ok());
  EXPECT_EQ((**few).stats().first_errors.size(), 3u);
  EXPECT_EQ((**few).stats().malformed, num_bad);
}

TEST_F(DatasetTest, MalformedLineIsFatalWithFileAndLine) {
  for (const MalformedCase& c : MalformedCases()) {
    const std::string path = Write(std::string(c.name) + ".jsonl",
                                   std::string(kGoodIds) + "\n" + c.line + "\n" + kGoodIds);
    DatasetOptions options = Options(path);
    options.skip_malformed = false;
    auto dataset = Load(options);
    ASSERT_FALSE(dataset.ok()) << c.name;
    EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(Msg(dataset.status()), StartsWith(path + ":2: ")) << c.name;
    EXPECT_THAT(Msg(dataset.status()), HasSubstr(c.expected)) << c.name;
  }
}

// The same conversations as OpenAI messages, ShareGPT turns and inside a
// .jsonl.gz give the same samples; a cut-off gzip stream is an error.
TEST_F(DatasetTest, MessagesShareGptAndGzipAgree) {
  const std::string messages =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})";
  const std::string share_gpt =
      R"({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]})";
  const std::string text = messages + "\n" + share_gpt + "\n" + kGoodIds + "\n";
  const std::string plain = Write("mixed.jsonl", text);
  const std::string gz = (dir_ / "mixed.jsonl.gz").string();
  gzFile f = gzopen(gz.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
  auto a = Load(Options(plain));
  auto b = Load(Options(gz));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((**a).size(), 3);
  ASSERT_EQ((**b).size(), 3);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ((**a)[i].input_ids, (**b)[i].input_ids);
    EXPECT_EQ((**a)[i].loss_mask, (**b)[i].loss_mask);
  }
  EXPECT_EQ((**a)[0].input_ids, (**a)[1].input_ids);
  EXPECT_EQ((**a)[0].loss_mask, (**a)[1].loss_mask);

  std::ifstream in(gz, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = Write("cut.jsonl.gz", bytes.substr(0, bytes.size() - 12));
  auto truncated = Load(Options(cut));
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Msg(truncated.status()), HasSubstr(cut));
}

// A conversation the template refuses is counted under its own cause.
TEST_F(DatasetTest, TemplateRefusalIsCountedByCause) {
  auto t = ChatTemplate::FromText("{% if messages[0].role == 'system' %}{{ raise_exception('no system turns') }}{% endif %}"
                                  "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}",
                                  "strict.jinja", nlohmann::ordered_json::object());
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string path = Write("refused.jsonl",
                                 R"({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]})"
                                 "\n" R"({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]})"
                                 "\n");
  auto d = Dataset::Load(Options(path), *tokenizer_, *t);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((**d).size(), 1);
  EXPECT_EQ((**d).stats().malformed_by_cause.at("template could not render"), 1);
  ASSERT_EQ((**d).stats().first_errors.size(), 1u);
  EXPECT_THAT((**d).stats().first_errors[0], HasSubstr("strict.jinja) could not render the conversation: "
                                                       "TemplateError: no system turns"));
}

TEST_F(DatasetTest, EmptyLinesAreNotMalformed) {
  const std::string path = Write("gaps.jsonl", std::string("\n   \n") + kGoodIds + "\r\n\r\n\t\n" +
                                                   kGoodIds + "\n" + R"({"oops": 1})" + "\n\n");
  DatasetOptions options = Options(path);
  auto dataset = Load(options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Dataset& d = **dataset;
  EXPECT_EQ(d.size(), 2);
  EXPECT_EQ(d.stats().empty_lines, 5);
  EXPECT_EQ(d.stats().malformed, 1);
  EXPECT_EQ(d.stats().lines_read, 8);
  EXPECT_EQ(d[0].line, 3);
  EXPECT_EQ(d[1].line, 6);
  // Line numbers count the empty lines too.
  options.skip_malformed = false;
  auto fatal = Load(options);
  ASSERT_FALSE(fatal.ok());
  EXPECT_THAT(Msg(fatal.status()), StartsWith(path + ":7: "));

  const std::string blank = Write("blank.jsonl", "\n\n");
  auto none = Load(Options(blank));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((**none).size(), 0);
  EXPECT_EQ((**none).stats().empty_lines, 2);
}

TEST_F(DatasetTest, MaxLengthCutsAndCounts) {
  const std::string path = Write(
      "long.jsonl",
      R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "loss_mask": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]})"
      "\n"
      R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]})"
      "\n"
      // Only the cut-off tail is trained: nothing left to learn.
      R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "loss_mask": [0, 0, 0, 0, 0, 0, 1, 1]})"
      "\n"
      R"({"conversations": [{"role": "user", "content": "Write a long story about a dragon who learns to code in Python."}, {"role": "assistant", "content": "Once upon a time there was a dragon."}]})"
      "\n");
  DatasetOptions options = Options(path);
  options.max_length = 6;
  auto dataset = Load(options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Dataset& d = **dataset;
  EXPECT_EQ(d.stats().truncated, 3);
  EXPECT_EQ(d.stats().dropped_empty_mask, 2);  // line 3, and the chat's reply was cut away
  ASSERT_EQ(d.size(), 2);
  EXPECT_THAT(d[0].input_ids, ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(d[0].loss_mask, ElementsAre(1, 1, 1, 1, 1, 1));
  EXPECT_THAT(d[1].input_ids, ElementsAre(1, 2, 3));
  EXPECT_EQ(d.stats().max_sample_length, 6);
  EXPECT_EQ(d.stats().total_tokens, 9);

  // Without the empty-mask rule the cut samples stay, at max_length.
  options.drop_empty_loss_mask = false;
  auto kept = Load(options);
  ASSERT_TRUE(kept.ok());
  ASSERT_EQ((**kept).size(), 4);
  for (const Sample& s : (**kept).samples()) EXPECT_LE(s.size(), 6);
  EXPECT_EQ((**kept)[3].size(), 6);

  options.max_length = -1;
  EXPECT_EQ(Load(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DatasetTest, ShortAndUntrainedSamplesDropped) {
  const std::string path =
      Write("small.jsonl", R"({"input_ids": [1], "loss_mask": [1]})"
                           "\n"
                           R"({"input_ids": [], "loss_mask": []})"
                           "\n"
                           R"({"input_ids": [1, 2, 3], "loss_mask": [0, 0, 0]})"
                           "\n" +
                               std::string(kGoodIds) + "\n");
  auto dataset = Load(Options(path));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Dataset& d = **dataset;
  EXPECT_EQ(d.size(), 1);
  EXPECT_EQ(d.stats().dropped_short, 2);
  EXPECT_EQ(d.stats().dropped_empty_mask, 1);
  EXPECT_EQ(d[0].id, 0);
  EXPECT_EQ(d[0].line, 4);
  EXPECT_THAT(d.Summary(), HasSubstr("2 too short, 1 without trained tokens"));

  DatasetOptions lenient = Options(path);
  lenient.min_length = 0;
  lenient.drop_empty_loss_mask = false;
  auto all = Load(lenient);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((**all).size(), 4);
}

TEST_F(DatasetTest, MissingFileAndDirectory) {
  const std::string missing = (dir_ / "does_not_exist.jsonl").string();
  auto dataset = Load(Options(missing));
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(dataset.status()), HasSubstr(missing));

  auto dir = Load(Options(dir_.string()));
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(dir.status()), HasSubstr("is a directory"));
}

// A line past the byte limit is counted malformed and never held whole:
// the lines around it load as usual, whatever chunk boundaries it spans.
TEST_F(DatasetTest, AnOverLongLineIsSkippedUnread) {
  const std::string chat =
      R"({"conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]})";
  std::string words;
  for (int i = 0; i < 200000; ++i) words += "hello ";  // 1.2 MB, spanning chunk boundaries
  const std::string huge =
      R"({"conversations": [{"role": "user", "content": ")" + words + R"("}, {"role": "assistant", "content": "ok"}]})";
  const std::string path = Write("long.jsonl", chat + "\n" + huge + "\n" + chat + "\n" + huge);
  DatasetOptions options = Options(path);
  options.max_line_bytes = 1 << 20;
  auto dataset = Load(options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->size(), 2);
  const DatasetStats& stats = (*dataset)->stats();
  EXPECT_EQ(stats.malformed, 2);
  EXPECT_EQ(stats.malformed_by_cause.at("line too long"), 2);
  ASSERT_FALSE(stats.first_errors.empty());
  EXPECT_NE(stats.first_errors[0].find(path + ":2: the line is " + std::to_string(huge.size()) +
                                       " bytes, over the limit of 1048576"),
            std::string::npos)
      << stats.first_errors[0];
}

TEST_F(DatasetTest, MaxSamplesStopsEarly) {
  std::string text;
  for (int i = 0; i < 10; ++i) text += std::string(kGoodIds) + "\n";
  text += "not json\n";
  DatasetOptions options = Options(Write("many.jsonl", text));
  options.max_samples = 4;
  options.skip_malformed = false;  // the bad line lies past the cutoff
  auto dataset = Load(options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((**dataset).size(), 4);
  EXPECT_EQ((**dataset).stats().lines_read, 4);
}

TEST_F(DatasetTest, FromSamples) {
  Sample a;
  a.id = 9;
  a.input_ids = {1, 2, 3};
  a.loss_mask = {0, 1, 1};
  Sample b = a;
  b.input_ids = {4, 5};
  b.loss_mask = {1, 1};
  auto d = Dataset::FromSamples({a, b}, "regenerated");
  ASSERT_EQ(d->size(), 2);
  EXPECT_EQ((*d)[0].id, 0);
  EXPECT_EQ((*d)[1].id, 1);
  EXPECT_EQ(d->stats().kept, 2);
  EXPECT_EQ(d->stats().total_tokens, 5);
  EXPECT_EQ(d->stats().loss_tokens, 4);
  EXPECT_THAT(d->Summary(), StartsWith("regenerated: 2 lines, 2 samples kept"));
}

TEST_F(DatasetTest, FullTrainingFile) {
  DatasetOptions options = Options(kTrainData);
  options.skip_malformed = false;
  const auto start = std::chrono::steady_clock::now();
  auto dataset = Load(options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Dataset& d = **dataset;
  std::cout << d.Summary() << "\n  loaded in " << seconds << " s\n";
  const DatasetStats& s = d.stats();
  EXPECT_EQ(s.lines_read, kTrainLines);
  EXPECT_EQ(s.kept, kTrainLines);
  EXPECT_EQ(s.conversations, kTrainLines);
  EXPECT_EQ(s.malformed + s.empty_lines + s.truncated + s.dropped_short + s.dropped_empty_mask, 0);
  EXPECT_GT(s.total_tokens, 100 * kTrainLines);
  EXPECT_GT(s.loss_tokens, s.total_tokens / 10);
  EXPECT_LT(s.loss_tokens, s.total_tokens);
  int64_t total = 0;
  for (const Sample& sample : d.samples()) {
    ASSERT_EQ(sample.input_ids.size(), sample.loss_mask.size());
    ASSERT_GE(sample.size(), 2);
    EXPECT_EQ(sample.loss_mask[0], 0);      // BOS is never trained
    EXPECT_EQ(sample.loss_mask.back(), 1);  // the closing <|eot_id|> is
    total += sample.size();
  }
  EXPECT_EQ(total, s.total_tokens);

  // The first samples match Hugging Face's tokenization of the same chats
  // (tests/fixtures/tokenizer_head.jsonl, made with transformers).
  std::ifstream head(kTokenizerHead);
  std::string line;
  int compared = 0;
  while (std::getline(head, line)) {
    nlohmann::json entry = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(entry.is_discarded());
    if (entry["source"] != "train" || entry["generation_prompt"] != false) continue;
    const int64_t index = entry["index"].get<int64_t>();
    EXPECT_EQ(d[index].input_ids, entry["ids"].get<std::vector<int32_t>>()) << "sample " << index;
    ++compared;
  }
  EXPECT_GT(compared, 10);

  // Thread count never changes the result.
  options.max_samples = 200;
  options.num_threads = 1;
  auto serial = Load(options);
  options.num_threads = 3;
  auto parallel = Load(options);
  ASSERT_TRUE(serial.ok() && parallel.ok());
  ASSERT_EQ((**serial).size(), 200);
  ASSERT_EQ((**parallel).size(), 200);
  for (int64_t i = 0; i < 200; ++i) {
    EXPECT_EQ((**serial)[i].input_ids, d[i].input_ids);
    EXPECT_EQ((**parallel)[i].input_ids, d[i].input_ids);
    EXPECT_EQ((**parallel)[i].loss_mask, d[i].loss_mask);
  }

  // End to end with the other data pieces: calibrate a draft vocab and
  // batch an epoch.
  auto vocab = CalibrateVocabMap(d.samples(), tokenizer_->vocab_size(), 2048);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->counted_tokens, s.loss_tokens);
  auto coverage = ComputeCoverage(*vocab, d.samples());
  ASSERT_TRUE(coverage.ok());
  std::cout << "  draft vocab 2048 of " << tokenizer_->vocab_size() << " covers "
            << 100 * coverage->fraction() << "% of trained tokens\n";
  EXPECT_GT(coverage->fraction(), 0.5);
  EXPECT_LT(coverage->fraction(), 1.0);

  BatcherOptions batcher;
  batcher.max_tokens = 8192;
  batcher.oversize = OversizePolicy::kOwnBatch;
  auto batches = PackBatches(EpochOrder(d.size(), 1234, 0), d.Lengths(), batcher, 0);
  ASSERT_TRUE(batches.ok()) << batches.status();
  int64_t batched_tokens = 0;
  for (const GlobalBatch& batch : *batches) batched_tokens += batch.num_tokens;
  EXPECT_EQ(batched_tokens, s.total_tokens);
}

}  // namespace
}  // namespace e3
