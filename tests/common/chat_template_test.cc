// Chat templates: byte-exact renders of each built-in, loss masks over the
// tokenized chat, and detection from a model directory.
#include "common/chat_template.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string SourcePath(const std::string& rel) { return std::string(E3_SOURCE_DIR) + "/" + rel; }

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "  Hi!\n"}, {"assistant", "Hello.\n"}};

// A model directory holding the given files; removed afterwards.
class TempModelDir {
 public:
  TempModelDir() {
    char name[] = "/tmp/e3_chat_template_test_XXXXXX";
    dir_ = mkdtemp(name);
  }
  ~TempModelDir() {
    for (const std::string& f : files_) std::remove(f.c_str());
    rmdir(dir_.c_str());
  }
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    files_.push_back(path);
    return path;
  }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::string> files_;
};

std::string RenderText(const std::string& name, const std::vector<ChatMessage>& messages,
                       bool gen) {
  auto t = ChatTemplate::ByName(name);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return "";
  auto r = t->Render(messages, gen);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->text : "";
}

TEST(ChatTemplateTest, BuiltinNames) {
  EXPECT_THAT(ChatTemplate::BuiltinNames(), ElementsAre("llama3", "qwen", "llama3-plain"));
}

TEST(ChatTemplateTest, Llama3PlainRendersContentVerbatim) {
  EXPECT_EQ(RenderText("llama3-plain", kChat, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n  Hi!\n<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.\n<|eot_id|>");
  EXPECT_EQ(RenderText("llama3-plain", {{"user", "q"}}, true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // {{ bos_token }} renders even without messages.
  EXPECT_EQ(RenderText("llama3-plain", {}, false), "<|begin_of_text|>");
}

TEST(ChatTemplateTest, Llama3TrimsContent) {
  EXPECT_EQ(RenderText("llama3", kChat, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Python's strip(): Unicode spaces and U+001C..U+001F go too.
  EXPECT_EQ(RenderText("llama3", {{"user", "\u3000\x1fx y\u00a0"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx y<|eot_id|>");
  // Meta's template glues BOS to the first message.
  EXPECT_EQ(RenderText("llama3", {}, true), "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, QwenIsChatMl) {
  EXPECT_EQ(RenderText("qwen", kChat, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n  Hi!\n<|im_end|>\n"
            "<|im_start|>assistant\nHello.\n<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, AssistantSpansCoverContentAndTerminator) {
  for (const std::string name : {"llama3", "qwen", "llama3-plain"}) {
    auto t = ChatTemplate::ByName(name);
    ASSERT_TRUE(t.ok());
    auto r = t->Render(kChat, false);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->assistant_spans.size(), 1u) << name;
    const auto [b, e] = r->assistant_spans[0];
    const std::string span = r->text.substr(b, e - b);
    const std::string expected = name == "llama3"         ? "Hello.<|eot_id|>"
                                 : name == "llama3-plain" ? "Hello.\n<|eot_id|>"
                                                          : "Hello.\n<|im_end|>";
    EXPECT_EQ(span, expected) << name;
  }
}

TEST(ChatTemplateTest, UnknownRoleAndName) {
  auto t = ChatTemplate::ByName("qwen");
  ASSERT_TRUE(t.ok());
  auto r = t->Render({{"user", "x"}, {"tool", "y"}}, false);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("role \"tool\""));
  auto unknown = ChatTemplate::ByName("vicuna");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown chat template \"vicuna\""));
}

class TokenizeChatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromFile(SourcePath("examples/tiny-code-llama/tokenizer.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(tok).value();
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TokenizeChatTest, LossMaskMarksAssistantContentAndEot) {
  auto t = ChatTemplate::ByName("llama3-plain");
  ASSERT_TRUE(t.ok());
  const std::vector<ChatMessage> chat = {{"user", "What is 2+2?"}, {"assistant", "4"}};
  auto tc = TokenizeChat(*tokenizer_, *t, chat, /*train_on_all_tokens=*/false);
  ASSERT_TRUE(tc.ok()) << tc.status();
  ASSERT_EQ(tc->input_ids.size(), tc->loss_mask.size());
  // The ids are those of the rendered text, encoded once.
  auto rendered = t->Render(chat, false);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(tc->input_ids, tokenizer_->Encode(rendered->text).ids);

  // Decode each trained token: the assistant's content and its <|eot_id|>.
  std::string trained;
  std::vector<int32_t> untrained_ids;
  for (size_t i = 0; i < tc->input_ids.size(); ++i) {
    if (tc->loss_mask[i]) {
      trained += tokenizer_->Decode({tc->input_ids[i]});
    } else {
      untrained_ids.push_back(tc->input_ids[i]);
    }
  }
  EXPECT_EQ(trained, "4<|eot_id|>");
  EXPECT_EQ(tokenizer_->Decode(untrained_ids),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(tc->loss_mask.back(), 1);
  EXPECT_EQ(tc->input_ids.back(), 4);

  auto all = TokenizeChat(*tokenizer_, *t, chat, /*train_on_all_tokens=*/true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->input_ids, tc->input_ids);
  EXPECT_EQ(all->loss_mask, std::vector<uint8_t>(tc->input_ids.size(), 1));
}

TEST_F(TokenizeChatTest, MultiTurnMasks) {
  auto t = ChatTemplate::ByName("qwen");
  ASSERT_TRUE(t.ok());
  const std::vector<ChatMessage> chat = {
      {"user", "a"}, {"assistant", "b c"}, {"user", "d"}, {"assistant", "e"}};
  auto tc = TokenizeChat(*tokenizer_, *t, chat, false);
  ASSERT_TRUE(tc.ok());
  std::string trained;
  for (size_t i = 0; i < tc->input_ids.size(); ++i) {
    if (tc->loss_mask[i]) trained += tokenizer_->Decode({tc->input_ids[i]});
  }
  // The tiny tokenizer has no <|im_end|>, so it is spelt out in bytes;
  // every one of those tokens starts inside the span.
  EXPECT_EQ(trained, "b c<|im_end|>e<|im_end|>");
  auto bad = TokenizeChat(*tokenizer_, *t, {{"bot", "x"}}, false);
  EXPECT_FALSE(bad.ok());
}

TEST(DetectTest, BundledModelIsLlama3Plain) {
  auto t = ChatTemplate::DetectFromModelDir(SourcePath("examples/tiny-code-llama"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "llama3-plain");
  auto r = t->Render({{"user", "x"}}, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
}

TEST(DetectTest, OfficialTemplatesFromTokenizerConfig) {
  const std::string llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
      "trim "
      "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
      "{{ content }}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
  {
    TempModelDir dir;
    dir.Write("tokenizer_config.json",
              nlohmann::json{{"bos_token", "<|begin_of_text|>"}, {"chat_template", llama3}}.dump());
    auto t = ChatTemplate::DetectFromModelDir(dir.path());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->name(), "llama3");
  }
  {
    // Reformatted over lines with whitespace control: renders the same.
    TempModelDir dir;
    dir.Write("chat_template.jinja",
              "{%- for message in messages %}\n"
              "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
              "'<|im_end|>' + '\\n' }}\n"
              "{%- endfor %}\n"
              "{%- if add_generation_prompt %}\n"
              "    {{- '<|im_start|>assistant\\n' }}\n"
              "{%- endif %}\n");
    auto t = ChatTemplate::DetectFromModelDir(dir.path());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->name(), "qwen");
  }
}

TEST(DetectTest, BosTokenComesFromTokenizerConfig) {
  TempModelDir dir;
  std::ifstream in(SourcePath("examples/tiny-code-llama/chat_template.jinja"), std::ios::binary);
  const std::string jinja((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  dir.Write("chat_template.jinja", jinja + "\n");  // a trailing newline is not rendered
  dir.Write("tokenizer_config.json", R"({"bos_token": {"content": "<s>"}})");
  auto t = ChatTemplate::DetectFromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = t->Render({{"user", "x"}}, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "<s><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
}

TEST(DetectTest, WhitespaceThatDoesNotRenderIsIgnored) {
  // The bundled template reformatted with a comment, `-` markers and
  // indented block tags; Jinja (trim_blocks, lstrip_blocks, as transformers
  // sets it) renders it the same, byte for byte.
  TempModelDir dir;
  dir.Write("chat_template.jinja",
            "{#- the tiny model's template -#}\n"
            "{{ bos_token }}\n"
            "{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
            "{{ m['content'] }}<|eot_id|>\n"
            "    {%- endfor %}\n"
            "  {% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
            "{% endif %}\n");
  auto t = ChatTemplate::DetectFromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "llama3-plain");

  // Whitespace that does render is not ignored: one newline after the header.
  TempModelDir other;
  other.Write(
      "chat_template.jinja",
      "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n"
      "\n  {{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
      "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}");
  EXPECT_FALSE(ChatTemplate::DetectFromModelDir(other.path()).ok());
}

TEST(DetectTest, UnsupportedTemplateIsAClearError) {
  TempModelDir dir;
  // One character differs from the bundled template's literal text.
  const std::string path = dir.Write(
      "chat_template.jinja",
      "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n"
      "{{ m['content'] }}<|eot_id|>{% endfor %}");
  auto t = ChatTemplate::DetectFromModelDir(dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "unsupported chat template in " + path +
                                      "; pass --chat_template=llama3|qwen|llama3-plain");

  TempModelDir empty;
  auto none = ChatTemplate::DetectFromModelDir(empty.path());
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("--chat_template="));
}

}  // namespace
}  // namespace e3
