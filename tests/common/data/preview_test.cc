// The data preview (teacher_server --preview_data): PreviewLines gives the
// same samples Dataset::Load trains on, line by line, with the rendering
// each token came from; FormatLinePreview marks the trained tokens, says
// why a line is no sample, and warns of reasoning the template dropped.
#include "common/data/preview.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/data/dataset.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

constexpr char kPreviewModelDir[] = E3_SOURCE_DIR "/examples/tiny-code-llama";
constexpr char kPreviewTrainData[] = E3_SOURCE_DIR "/examples/data/train_conversations.jsonl";
constexpr char kPreviewReasoning[] = E3_SOURCE_DIR "/tests/fixtures/preview_reasoning.jsonl";
constexpr char kPreviewQwen3Template[] = E3_SOURCE_DIR "/tests/fixtures/chat_templates/qwen3.jinja";

class PreviewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::FromFile(std::string(kPreviewModelDir) + "/tokenizer.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(tokenizer).value();
  }

  ChatTemplate Template(const std::string& file = "", bool train_reasoning = true) const {
    ChatTemplateOptions options;
    options.file = file;
    options.train_reasoning = train_reasoning;
    auto t = ChatTemplate::Load(kPreviewModelDir, options);
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }

  static std::string Write(const std::string& name, const std::string& text) {
    const std::string path = testing::ScratchPath(name, ".jsonl");
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::vector<LinePreview> Preview(const DatasetOptions& options, const ChatTemplate& t, int64_t lines) const {
    auto previews = PreviewLines(options, *tokenizer_, t, lines);
    EXPECT_TRUE(previews.ok()) << previews.status();
    return previews.ok() ? *previews : std::vector<LinePreview>();
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

DatasetOptions PreviewOptions(const std::string& path, int64_t max_length = 0) {
  DatasetOptions d;
  d.path = path;
  d.max_length = max_length;
  return d;
}

std::string WithoutPreviewMarkers(const std::string& text) {
  return absl::StrReplaceAll(text, {{"[[", ""}, {"]]", ""}});
}

// The text between each [[ and ]].
std::vector<std::string> MarkedRuns(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = text.find("[["); at != std::string::npos; at = text.find("[[", at)) {
    const size_t end = text.find("]]", at);
    if (end == std::string::npos) break;
    out.push_back(text.substr(at + 2, end - at - 2));
    at = end;
  }
  return out;
}

TEST_F(PreviewTest, TheSamplesAreTheOnesTrainingReads) {
  const ChatTemplate t = Template();
  // Cut at 64 tokens, some of the first lines keep no trained token.
  for (int64_t max_length : {0, 64}) {
    DatasetOptions options = PreviewOptions(kPreviewTrainData, max_length);
    options.max_samples = 20;
    auto dataset = Dataset::Load(options, *tokenizer_, t);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    const int64_t last_line = (**dataset)[(**dataset).size() - 1].line;
    const std::vector<LinePreview> previews = Preview(options, t, last_line);
    ASSERT_EQ(static_cast<int64_t>(previews.size()), last_line);
    int64_t kept = 0;
    for (size_t i = 0; i < previews.size(); ++i) {
      const LinePreview& p = previews[i];
      EXPECT_EQ(p.line, static_cast<int64_t>(i) + 1);
      EXPECT_TRUE(p.conversation);
      if (p.outcome != LineOutcome::kKept) {
        EXPECT_EQ(p.outcome, LineOutcome::kNoTrainedToken) << "line " << p.line;
        EXPECT_GT(max_length, 0);
        continue;
      }
      const Sample& sample = (**dataset)[kept++];
      EXPECT_EQ(sample.line, p.line);
      EXPECT_EQ(p.input_ids, sample.input_ids) << "line " << p.line;
      EXPECT_EQ(p.loss_mask, sample.loss_mask) << "line " << p.line;
      EXPECT_EQ(p.offsets.size(), p.input_ids.size());
      // The tokens' spans tile the rendering, in order.
      size_t cursor = 0;
      for (const auto& [begin, end] : p.offsets) {
        EXPECT_EQ(begin, cursor) << "line " << p.line;
        cursor = end;
      }
      if (max_length == 0) {
        EXPECT_EQ(cursor, p.text.size());
      }
      if (max_length > 0) {
        EXPECT_LE(static_cast<int64_t>(p.input_ids.size()), max_length);
      }
    }
    EXPECT_EQ(kept, (**dataset).size());
  }
}

TEST_F(PreviewTest, TheMarkedTextIsTheRenderingWithTheTrainedTokensBracketed) {
  const std::vector<LinePreview> previews = Preview(PreviewOptions(kPreviewTrainData), Template(), 2);
  ASSERT_EQ(previews.size(), 2u);
  for (const LinePreview& p : previews) {
    const std::string out = FormatLinePreview(p, "train.jsonl", *tokenizer_, BracketMarkers());
    int64_t trained = 0;
    for (uint8_t m : p.loss_mask) trained += m;
    const std::string header = out.substr(0, out.find('\n'));
    EXPECT_EQ(header.rfind("--- train.jsonl:" + std::to_string(p.line) + ": conversation, " +
                               std::to_string(p.input_ids.size()) + " tokens, " + std::to_string(trained) +
                               " trained (",
                           0),
              0u)
        << header;
    const std::string body = out.substr(header.size() + 1);
    EXPECT_EQ(WithoutPreviewMarkers(body), p.text + "\n\n");
    // One assistant turn: one trained run, its answer and <|eot_id|>, and
    // nothing of the user's turn or the assistant header.
    const std::vector<std::string> marked = MarkedRuns(body);
    ASSERT_EQ(marked.size(), 1u) << out;
    EXPECT_NE(marked[0].find("<|eot_id|>"), std::string::npos);
    EXPECT_EQ(marked[0].find("<|start_header_id|>"), std::string::npos);
    EXPECT_EQ(tokenizer_->Encode(marked[0]).ids.size(), static_cast<size_t>(trained));
  }
}

TEST_F(PreviewTest, ACutSampleEndsWhereItsTokensEndAndSaysSo) {
  const std::vector<LinePreview> previews = Preview(PreviewOptions(kPreviewTrainData, 40), Template(), 1);
  ASSERT_EQ(previews.size(), 1u);
  const LinePreview& p = previews[0];
  ASSERT_GT(p.tokens_before_cut, 40);
  const std::string out = FormatLinePreview(p, "t.jsonl", *tokenizer_, BracketMarkers());
  EXPECT_NE(out.find("40 tokens (cut from " + std::to_string(p.tokens_before_cut) + " to max_seq_len)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("[... " + std::to_string(p.tokens_before_cut - 40) + " tokens past max_seq_len not shown"),
            std::string::npos)
      << out;
  EXPECT_NE(WithoutPreviewMarkers(out).find(p.text.substr(0, p.offsets.back().second)), std::string::npos);
}

TEST_F(PreviewTest, ReasoningTheTemplateDropsIsWarnedAbout) {
  // Qwen3's template renders reasoning only in the turns after the last
  // user message: the first answer's reasoning is gone, the last one's kept.
  const std::vector<LinePreview> qwen3 = Preview(PreviewOptions(kPreviewReasoning), Template(kPreviewQwen3Template), 1);
  ASSERT_EQ(qwen3.size(), 1u);
  ASSERT_EQ(qwen3[0].warnings.size(), 1u);
  EXPECT_EQ(qwen3[0].warnings[0].rfind("messages[1] (assistant): its reasoning (\"reasoning_content\", 23 bytes) is "
                                       "not in the rendered text",
                                       0),
            0u)
      << qwen3[0].warnings[0];
  EXPECT_EQ(qwen3[0].text.find("Two plus three is five."), std::string::npos);
  EXPECT_NE(qwen3[0].text.find("Five times four is twenty."), std::string::npos);
  const std::string out = FormatLinePreview(qwen3[0], "r.jsonl", *tokenizer_, BracketMarkers());
  EXPECT_NE(out.find("\nwarning: r.jsonl:1: messages[1] (assistant): its reasoning"), std::string::npos) << out;
  // The last turn's reasoning is trained, unless train_reasoning is off.
  const std::vector<std::string> marked = MarkedRuns(out);
  ASSERT_EQ(marked.size(), 2u) << out;
  EXPECT_NE(marked[1].find("Five times four is twenty."), std::string::npos);
  const std::vector<LinePreview> answers_only =
      Preview(PreviewOptions(kPreviewReasoning), Template(kPreviewQwen3Template, /*train_reasoning=*/false), 1);
  ASSERT_EQ(answers_only.size(), 1u);
  const std::vector<std::string> answers =
      MarkedRuns(FormatLinePreview(answers_only[0], "r.jsonl", *tokenizer_, BracketMarkers()));
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[1].find("Five times four"), std::string::npos);
  EXPECT_EQ(answers[1].rfind("20", 0), 0u) << answers[1];
  // The bundled model's template renders no reasoning at all: both turns.
  const std::vector<LinePreview> plain = Preview(PreviewOptions(kPreviewReasoning), Template(), 1);
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(plain[0].warnings.size(), 2u);
  EXPECT_EQ(plain[0].warnings[1].rfind("messages[3] (assistant)", 0), 0u);
  // Inline <think> reasoning and the "thinking" field are found too.
  const std::string inline_think = Write(
      "think", R"({"messages": [{"role": "user", "content": "q"}, )"
               R"({"role": "assistant", "content": "<think>Let me see.</think>yes"}]})"
               "\n"
               R"({"messages": [{"role": "user", "content": "q"}, )"
               R"({"role": "assistant", "thinking": "Hmm.", "content": "no"}]})"
               "\n");
  const std::vector<LinePreview> both = Preview(PreviewOptions(inline_think), Template(), 2);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_TRUE(both[0].warnings.empty()) << both[0].warnings[0];  // the content, rendered whole
  ASSERT_EQ(both[1].warnings.size(), 1u);
  EXPECT_NE(both[1].warnings[0].find("(\"thinking\", 4 bytes)"), std::string::npos) << both[1].warnings[0];
}

TEST_F(PreviewTest, LinesThatAreNoSampleSayWhy) {
  const std::string path = Write(
      "mixed", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
               "\n\n"
               R"({"messages": [{"role": "bot", "content": "x"}]})"
               "\n"
               R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]})"
               "\n"
               R"({"messages": [{"role": "user", "content": "a question alone"}]})"
               "\n"
               R"({"input_ids": [5], "loss_mask": [1]})"
               "\n"
               "not json\n"
               R"({"messages": [{"role": "user", "content": "never read"}]})"
               "\n");
  const std::vector<LinePreview> previews = Preview(PreviewOptions(path), Template(), 7);
  ASSERT_EQ(previews.size(), 7u);
  std::vector<std::string> headers;
  for (const LinePreview& p : previews) {
    const std::string out = FormatLinePreview(p, path, *tokenizer_, BracketMarkers());
    headers.push_back(absl::StrReplaceAll(out.substr(0, out.find('\n')), {{path, "d.jsonl"}}));
  }
  EXPECT_EQ(headers[0], "--- d.jsonl:1: conversation, 18 tokens, 3 trained (16.7%)");
  EXPECT_EQ(headers[1], "--- d.jsonl:2: blank line, skipped");
  EXPECT_EQ(headers[2],
            "--- d.jsonl:3: malformed, not a sample: messages[0].role is \"bot\"; expected system, developer, user, "
            "assistant or tool");
  EXPECT_EQ(headers[3], "--- d.jsonl:4: input_ids, 3 tokens, 2 trained (66.7%)");
  EXPECT_EQ(headers[4].rfind("--- d.jsonl:5: conversation, 11 tokens, 0 trained (0.0%): dropped, no trained token", 0),
            0u)
      << headers[4];
  EXPECT_EQ(headers[5], "--- d.jsonl:6: input_ids, 1 token, 1 trained (100.0%): dropped, too short to train on");
  EXPECT_EQ(headers[6].rfind("--- d.jsonl:7: malformed, not a sample: invalid JSON at byte", 0), 0u) << headers[6];
  EXPECT_EQ(previews[2].error.rfind(path + ":3: ", 0), 0u) << previews[2].error;
  // A pre-tokenized line is its runs of tokens decoded.
  const std::string tokens = FormatLinePreview(previews[3], "d.jsonl", *tokenizer_, BracketMarkers());
  EXPECT_NE(tokens.find("\n" + tokenizer_->Decode(std::vector<int32_t>{1}) + "[[" +
                        tokenizer_->Decode(std::vector<int32_t>{2, 3}) + "]]\n"),
            std::string::npos)
      << tokens;
  const PreviewTotals totals = TotalsOf(previews);
  EXPECT_EQ(DescribeTotals(totals),
            "7 lines: 2 samples (21 tokens, 5 trained, 23.8%), 2 dropped, 2 malformed, 1 blank; 0 warnings");
  // Only the lines asked for are read.
  EXPECT_EQ(Preview(PreviewOptions(path), Template(), 2).size(), 2u);
  EXPECT_FALSE(PreviewLines(PreviewOptions(path + ".missing"), *tokenizer_, Template(), 1).ok());
}

}  // namespace
}  // namespace e3
