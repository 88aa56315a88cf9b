// The conversation formats of training lines: OpenAI messages,
// conversations with role/content, ShareGPT from/value; content parts,
// tool calls, reasoning; errors that name the field.
#include "common/text/chat_message.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace e3 {
namespace {

using ::testing::HasSubstr;
using OrderedJson = nlohmann::ordered_json;

std::vector<ChatMessage> Parse(const char* line) {
  auto m = MessagesOfLine(OrderedJson::parse(line));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : std::vector<ChatMessage>();
}

std::string Error(const char* line) {
  auto m = MessagesOfLine(OrderedJson::parse(line));
  EXPECT_FALSE(m.ok());
  return std::string(m.status().message());
}

TEST(ChatMessageTest, ThreeFormatsGiveTheSameTurns) {
  const auto a = Parse(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})");
  const auto b = Parse(R"({"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})");
  const auto c = Parse(R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})");
  for (const auto* m : {&a, &b, &c}) {
    ASSERT_EQ(m->size(), 2u);
    EXPECT_EQ(MessageToJson((*m)[0]), OrderedJson({{"role", "user"}, {"content", "q"}}));
    EXPECT_EQ(MessageToJson((*m)[1]), OrderedJson({{"role", "assistant"}, {"content", "a"}}));
  }
}

TEST(ChatMessageTest, RolesOfShareGptAndOpenAi) {
  const auto m = Parse(R"({"conversations": [{"from": "system", "value": "s"}, {"from": "user", "value": "u"},
      {"from": "function_call", "value": "{}"}, {"from": "observation", "value": "o"}, {"from": "chatgpt", "value": "a"}]})");
  std::vector<std::string> roles;
  for (const auto& x : m) roles.push_back(x.role);
  EXPECT_THAT(roles, ::testing::ElementsAre("system", "user", "assistant", "tool", "assistant"));
  EXPECT_EQ(Parse(R"({"messages": [{"role": "developer", "content": "d"}]})")[0].role, "developer");
  EXPECT_THAT(Error(R"({"messages": [{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}]})"),
              HasSubstr("messages[1].role is \"bot\""));
  EXPECT_THAT(Error(R"({"conversations": [{"from": "alien", "value": "x"}]})"), HasSubstr("conversations[0].from"));
}

TEST(ChatMessageTest, ContentPartsToolCallsAndReasoning) {
  const auto m = Parse(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "reasoning_content": "think",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "content": "r", "tool_call_id": "1"},
      {"role": "assistant", "content": "done", "thinking": "t2"}]})");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].content, "a\nb");
  EXPECT_TRUE(m[1].content_is_null);
  EXPECT_TRUE(MessageToJson(m[1])["content"].is_null());
  // Arguments stay as written: templates differ in what they expect.
  EXPECT_EQ(m[1].fields["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
  EXPECT_EQ(m[1].fields["thinking"], "think");  // aliased both ways
  EXPECT_EQ(m[3].fields["reasoning_content"], "t2");
  EXPECT_EQ(ReasoningOf(m[3]), "t2");
  EXPECT_EQ(m[2].fields["tool_call_id"], "1");
}

TEST(ChatMessageTest, ErrorsNameTheField) {
  EXPECT_THAT(Error(R"({"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]})"),
              HasSubstr("messages[0].content[0].type is \"image\"; expected \"text\""));
  EXPECT_THAT(Error(R"({"messages": [{"role": "user"}]})"), HasSubstr("messages[0] has no \"content\""));
  EXPECT_THAT(Error(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})"),
              HasSubstr("messages[0].tool_calls[0] has no function name"));
  EXPECT_THAT(Error(R"({"messages": []})"), HasSubstr("\"messages\" is empty"));
  EXPECT_THAT(Error(R"({"messages": [], "conversations": []})"), HasSubstr("has both"));
  EXPECT_THAT(Error(R"({"messages": [{"role": "user", "content": 3}]})"), HasSubstr("messages[0].content is number"));
}

TEST(ChatMessageTest, ToolsOfLine) {
  EXPECT_TRUE(ToolsOfLine(OrderedJson::parse(R"({"messages": []})"))->is_null());
  EXPECT_EQ(ToolsOfLine(OrderedJson::parse(R"({"tools": [{"type": "function"}]})"))->size(), 1u);
  EXPECT_EQ(ToolsOfLine(OrderedJson::parse(R"({"tools": "[{\"type\": \"function\"}]"})"))->size(), 1u);
  EXPECT_FALSE(ToolsOfLine(OrderedJson::parse(R"({"tools": 3})")).ok());
}

}  // namespace
}  // namespace e3
