// Chat templates rendered by Jinja2 in the embedded Python: transformers'
// environment, where the template comes from, the assistant spans (from
// generation blocks and from each turn's own rendering), and the token
// mask over them. Golden renders of real templates are in
// chat_template_golden_test.cc.
#include "common/text/chat_template.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/source_path.h"

namespace e3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using OrderedJson = nlohmann::ordered_json;

using testing::SourcePath;

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

ChatTemplate Make(const std::string& source, OrderedJson variables = OrderedJson::object(), bool train_reasoning = true) {
  auto t = ChatTemplate::FromText(source, "test.jinja", std::move(variables), train_reasoning);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::string Text(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool gen = false,
                 const OrderedJson& tools = nullptr) {
  auto r = t.Render(messages, gen, tools);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->text : "";
}

// The spans' text, joined by '|'.
std::string Trained(const RenderedChat& r) {
  std::string out;
  for (const auto& [b, e] : r.assistant_spans) out += (out.empty() ? "" : "|") + r.text.substr(b, e - b);
  return out;
}

std::string TrainedOf(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  auto r = t.Render(messages, false);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? Trained(*r) : "";
}

constexpr char kChatMl[] =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplateEnvTest, TrimAndLstripBlocksAsTransformers) {
  // trim_blocks eats the newline after a block tag; lstrip_blocks the
  // indentation before one; a {{ }} keeps both.
  const ChatTemplate t = Make("{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n"
                              "    {% endif %}\n{% endfor %}\n");
  EXPECT_EQ(Text(t, {{"user", "a"}, {"system", "b"}, {"user", "c"}}), "U:a\nU:c\n");
}

TEST(ChatTemplateEnvTest, LoopControlsTojsonRaiseAndClock) {
  const ChatTemplate t = Make(
      "{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}{{ m | tojson }}{% endfor %}"
      "|{{ {'k': 'é', 'a': 1} | tojson(indent=1, sort_keys=True) }}|{{ strftime_now('%Y') }}");
  std::time_t now = std::time(nullptr);
  char year[8];
  std::strftime(year, sizeof(year), "%Y", std::gmtime(&now));
  const std::string text = Text(t, {{"user", "é"}, {"user", "x"}});
  // Non-ASCII kept, not \u-escaped, unlike Jinja's own tojson; HTML left alone.
  EXPECT_EQ(text.substr(0, text.rfind('|')),
            "{\"role\": \"user\", \"content\": \"é\"}|{\n \"a\": 1,\n \"k\": \"é\"\n}");
  EXPECT_THAT(text.substr(text.rfind('|') + 1), ::testing::AnyOf(std::string(year), std::to_string(std::stoi(year) - 1),
                                                                  std::to_string(std::stoi(year) + 1)));
  ASSERT_TRUE(PinTemplateClockForTesting("2024-07-26").ok());
  EXPECT_THAT(Text(t, {{"user", "x"}}), ::testing::EndsWith("|2024"));
  ASSERT_TRUE(PinTemplateClockForTesting("").ok());

  const ChatTemplate strict = Make("{% if messages[0].role != 'user' %}{{ raise_exception('roles must start with user') }}"
                                   "{% endif %}ok");
  auto refused = strict.Render({{"assistant", "x"}}, false);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("TemplateError: roles must start with user"));
}

TEST(ChatTemplateEnvTest, SandboxRefusesUnsafeCode) {
  const ChatTemplate t = Make("{{ messages.__class__.__mro__ }}");
  auto r = t.Render({{"user", "x"}}, false);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("SecurityError"));
  const ChatTemplate mutate = Make("{% set _ = messages.append(1) %}");
  EXPECT_FALSE(mutate.Render({{"user", "x"}}, false).ok());  // immutable sandbox
}

TEST(ChatTemplateEnvTest, SyntaxErrorNamesOriginAndLine) {
  auto t = ChatTemplate::FromText("line one\n{% for m in messages %}\n{{ m.content }}\n", "/models/x/chat_template.jinja",
                                  OrderedJson::object());
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("/models/x/chat_template.jinja: TemplateSyntaxError"));
  EXPECT_THAT(t.status().message(), HasSubstr("template line"));
}

TEST(ChatTemplateEnvTest, VariablesToolsAndNullContent) {
  const ChatTemplate t = Make(
      "{{ bos_token }}{% if enable_thinking is defined and not enable_thinking %}NT{% endif %}"
      "{% for tool in tools or [] %}[{{ tool.function.name }}]{% endfor %}"
      "{% for m in messages %}{% if m.content is none %}NONE{% else %}{{ m.content }}{% endif %}"
      "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}",
      OrderedJson{{"bos_token", "<s>"}, {"enable_thinking", false}});
  ChatMessage call("assistant", "");
  call.content_is_null = true;
  call.fields["tool_calls"] = OrderedJson::parse(R"([{"type":"function","function":{"name":"f","arguments":{"x":1}}}])");
  const OrderedJson tools = OrderedJson::parse(R"([{"type":"function","function":{"name":"f"}}])");
  EXPECT_EQ(Text(t, {{"user", "q"}, call}, false, tools), "<s>NT[f]qNONE{\"x\": 1}");
}

// Renders long enough that the interpreter would hand the GIL to another
// thread mid-render, each tracking its own generation spans.
TEST(ChatTemplateEnvTest, RendersFromManyThreads) {
  const ChatTemplate t = Make("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                              "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}");
  std::vector<std::thread> threads;
  std::vector<std::string> failures(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      std::vector<ChatMessage> chat;
      std::string expected;
      for (int k = 0; k < 400; ++k) {
        chat.emplace_back("user", "u" + std::to_string(i));
        chat.emplace_back("assistant", "a" + std::to_string(i));
        expected += "a" + std::to_string(i) + (k + 1 < 400 ? "|" : "");
      }
      for (int k = 0; k < 10 && failures[i].empty(); ++k) {
        auto r = t.Render(chat, false);
        if (!r.ok()) failures[i] = std::string(r.status().message());
        else if (Trained(*r) != expected) failures[i] = "spans of another render";
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(failures[i], "") << i;
}

TEST(AssistantSpansTest, TurnRenderingCoversContentAndTerminator) {
  const ChatTemplate t = Make(kChatMl);
  EXPECT_FALSE(t.has_generation_blocks());
  // The newline after <|im_end|> is between turns, not generated.
  EXPECT_EQ(TrainedOf(t, {{"user", "a"}, {"assistant", "b c"}, {"user", "d"}, {"assistant", "e"}}),
            "b c<|im_end|>|e<|im_end|>");
  // The same text in a user turn is never taken for the assistant's.
  EXPECT_EQ(TrainedOf(t, {{"user", "e"}, {"assistant", "e"}}), "e<|im_end|>");
}

TEST(AssistantSpansTest, GenerationBlocksAreTheSpans) {
  const ChatTemplate t = Make(
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</a>"
      "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}");
  EXPECT_TRUE(t.has_generation_blocks());
  // Offsets are bytes: the é before the block is two of them.
  EXPECT_EQ(TrainedOf(t, {{"user", "é"}, {"assistant", "ü1"}, {"user", "x"}, {"assistant", "2"}}), "ü1</a>|2</a>");
}

// A Qwen3-like template: the last turn after the last user query shows its
// reasoning, earlier ones drop it.
constexpr char kDropsEarlierReasoning[] =
    "{% set ns = namespace(last_user=0) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' and loop.index0 > ns.last_user %}"
    "<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

std::vector<ChatMessage> ReasoningChat() {
  ChatMessage first("assistant", "4"), second("assistant", "6");
  first.fields["reasoning_content"] = "2+2";
  second.fields["reasoning_content"] = "3+3";
  return {{"user", "2+2?"}, first, {"user", "3+3?"}, second};
}

TEST(AssistantSpansTest, ReasoningTrainedOrNotByFlag) {
  // The first turn renders without its reasoning in context: its visible
  // content and terminator are found instead.
  EXPECT_EQ(TrainedOf(Make(kDropsEarlierReasoning), ReasoningChat()), "4<|end|>|<think>3+3</think>6<|end|>");
  EXPECT_EQ(TrainedOf(Make(kDropsEarlierReasoning, OrderedJson::object(), /*train_reasoning=*/false), ReasoningChat()),
            "4<|end|>|6<|end|>");
  // Reasoning written inline in the content (DeepSeek-R1 data).
  const ChatTemplate inline_think = Make(kChatMl, OrderedJson::object(), /*train_reasoning=*/false);
  EXPECT_EQ(TrainedOf(inline_think, {{"user", "q"}, {"assistant", "<think>\nhm 1\n</think>\n\n1"}}), "1<|im_end|>");
}

TEST(AssistantSpansTest, ForcedGenerationPromptIsNotTrained) {
  // A generation prompt that opens the reasoning for the model (R1's
  // "<think>\n") is the prompt's, not the model's.
  const ChatTemplate t = Make(
      "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}");
  EXPECT_EQ(TrainedOf(t, {{"user", "q"}, {"assistant", "<think>\nx</think>y"}}), "x</think>y<|end|>");
}

TEST(AssistantSpansTest, UnlocatableTurnIsAnError) {
  // A template that never renders assistant turns.
  const ChatTemplate t = Make("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}");
  auto r = t.Render({{"user", "q"}, {"assistant", "a"}}, false);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("messages[1]: cannot locate the assistant turn"));
}

TEST(LoadTest, BundledModelTemplate) {
  auto t = ChatTemplate::Load(SourcePath("examples/tiny-code-llama"), {});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->origin(), ::testing::EndsWith("tiny-code-llama/chat_template.jinja"));
  EXPECT_EQ(Text(*t, {{"user", "x"}}), "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
  EXPECT_EQ(Text(*t, {{"user", "x"}}, true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(LoadTest, SourcesInTransformersOrder) {
  TempModelDir dir;
  dir.Write("tokenizer_config.json",
            OrderedJson{{"bos_token", {{"content", "<B>"}, {"lstrip", false}}},
                 {"eos_token", "<E>"},
                 {"chat_template", OrderedJson::array({{{"name", "default"}, {"template", "D{{ bos_token }}{{ eos_token }}"}},
                                                {{"name", "tool_use"}, {"template", "T{{ greeting }}"}}})}}
                .dump());
  auto d = ChatTemplate::Load(dir.path(), {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Text(*d, {{"user", "x"}}), "D<B><E>");  // AddedToken objects give their content
  ChatTemplateOptions named;
  named.name = "tool_use";
  named.kwargs = OrderedJson{{"greeting", "hi"}};
  auto t = ChatTemplate::Load(dir.path(), named);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Text(*t, {{"user", "x"}}), "Thi");
  named.name = "rag";
  auto missing = ChatTemplate::Load(dir.path(), named);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("no chat template named \"rag\"; it has default, tool_use"));

  dir.Write("chat_template.jinja", "J{{ bos_token }}\n");  // preferred; one trailing newline dropped, as Jinja does
  auto j = ChatTemplate::Load(dir.path(), {});
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(Text(*j, {{"user", "x"}}), "J<B>");
  ChatTemplateOptions file;
  file.file = dir.Write("override.jinja", "O");
  auto o = ChatTemplate::Load(dir.path(), file);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(Text(*o, {{"user", "x"}}), "O");
  EXPECT_NE(o->fingerprint(), j->fingerprint());
}

TEST(LoadTest, NoTemplateSaysWhatToPass) {
  TempModelDir dir;
  dir.Write("tokenizer_config.json", "{}");
  auto t = ChatTemplate::Load(dir.path(), {});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("pass --chat_template=FILE"));
  dir.Write("bad.json", "");
  TempModelDir broken;
  broken.Write("tokenizer_config.json", "{not json");
  auto b = ChatTemplate::Load(broken.path(), {});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("tokenizer_config.json: not a JSON object"));
}

TEST(KwargsTest, JsonOrKeyValue) {
  auto j = ParseTemplateKwargs(R"({"enable_thinking": false})");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(*j, OrderedJson({{"enable_thinking", false}}));
  auto kv = ParseTemplateKwargs("enable_thinking=false, reasoning_effort=high,n=3");
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(*kv, OrderedJson({{"enable_thinking", false}, {"reasoning_effort", "high"}, {"n", 3}}));
  EXPECT_FALSE(ParseTemplateKwargs("enable_thinking").ok());
  EXPECT_FALSE(ParseTemplateKwargs("{oops").ok());
  EXPECT_EQ(*ParseTemplateKwargs(""), OrderedJson::object());
}

class TokenizeChatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromFile(SourcePath("examples/tiny-code-llama/tokenizer.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(tok).value();
    auto t = ChatTemplate::Load(SourcePath("examples/tiny-code-llama"), {});
    ASSERT_TRUE(t.ok()) << t.status();
    template_ = std::make_unique<ChatTemplate>(*t);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
};

TEST_F(TokenizeChatTest, LossMaskMarksAssistantContentAndEot) {
  const std::vector<ChatMessage> chat = {{"user", "What is 2+2?"}, {"assistant", "4"}};
  auto tc = TokenizeChat(*tokenizer_, *template_, chat, /*train_on_all_tokens=*/false);
  ASSERT_TRUE(tc.ok()) << tc.status();
  ASSERT_EQ(tc->input_ids.size(), tc->loss_mask.size());
  auto rendered = template_->Render(chat, false);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(tc->input_ids, tokenizer_->Encode(rendered->text).ids);  // the text encoded once
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
  auto all = TokenizeChat(*tokenizer_, *template_, chat, /*train_on_all_tokens=*/true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->loss_mask, std::vector<uint8_t>(tc->input_ids.size(), 1));
}

TEST_F(TokenizeChatTest, TokenOverlappingASpanIsTrained) {
  // " b" is one token that starts before the span (the space is the
  // template's) and ends inside it: transformers' rule marks it.
  const ChatTemplate t = Make("{% for m in messages %}{% if m.role == 'assistant' %} {% generation %}{{ m.content }}"
                              "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}");
  auto tc = TokenizeChat(*tokenizer_, t, {{"user", "a"}, {"assistant", "b"}}, false);
  ASSERT_TRUE(tc.ok()) << tc.status();
  std::string trained;
  for (size_t i = 0; i < tc->input_ids.size(); ++i) {
    if (tc->loss_mask[i]) trained += tokenizer_->Decode({tc->input_ids[i]});
  }
  EXPECT_THAT(trained, ::testing::EndsWith("b"));
  EXPECT_EQ(tc->loss_mask.front(), 0);
}

TEST_F(TokenizeChatTest, PromptEndsWithTheGenerationPrompt) {
  auto ids = TokenizePrompt(*tokenizer_, *template_, {{"user", "hi"}});
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(tokenizer_->Decode(*ids), ::testing::EndsWith("<|start_header_id|>assistant<|end_header_id|>\n\n"));
}

}  // namespace
}  // namespace e3
