// Real chat templates (Llama 3.1-3.3, Qwen2.5/3, QwQ, DeepSeek-V3/R1,
// Gemma 3, Mistral Small, Mixtral, Phi-4, GPT-OSS) rendered here against
// transformers' own renders of the same conversations, text and trained
// spans byte for byte: tests/fixtures/chat_templates/golden.json, made by
// tests/golden/make_chat_template_golden.py. The conversations go through
// the data reader (MessagesOfLine) as a training line would.
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/text/chat_message.h"
#include "common/text/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

using OrderedJson = nlohmann::ordered_json;
using Spans = std::vector<std::pair<size_t, size_t>>;

const std::string kTemplateDir = std::string(E3_SOURCE_DIR) + "/tests/fixtures/chat_templates/";

OrderedJson ReadJson(const std::string& name) {
  std::ifstream in(kTemplateDir + name, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return OrderedJson::parse(text.str());
}

std::string ReadText(const std::string& name) {
  std::ifstream in(kTemplateDir + name, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Spans SpansOf(const OrderedJson& j) {
  Spans out;
  for (const OrderedJson& s : j) out.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
  return out;
}

bool Inside(const Spans& spans, size_t begin, size_t end) {
  for (const auto& [b, e] : spans) {
    if (b <= begin && end <= e) return true;
  }
  return false;
}

bool Overlaps(const Spans& spans, size_t begin, size_t end) {
  for (const auto& [b, e] : spans) {
    if (b < end && begin < e) return true;
  }
  return false;
}

// What any correct mask satisfies, whatever rule made it: each assistant
// answer lies inside a span, and each user text has an occurrence outside
// every span.
void ExpectMaskSane(const std::string& text, const Spans& spans, const std::vector<ChatMessage>& messages,
                    const std::string& where) {
  for (const ChatMessage& m : messages) {
    // Templates commonly strip the content (Jinja's trim).
    const size_t first = m.content.find_first_not_of(" \t\n\r");
    const size_t last = m.content.find_last_not_of(" \t\n\r");
    if (first == std::string::npos || last - first < 1 || m.content.find("</think>") != std::string::npos) continue;
    const std::string c = m.content.substr(first, last - first + 1);
    bool inside = false, outside = false;
    for (size_t at = text.find(c); at != std::string::npos; at = text.find(c, at + 1)) {
      inside = inside || Inside(spans, at, at + c.size());
      outside = outside || !Overlaps(spans, at, at + c.size());
    }
    if (m.role == "assistant") EXPECT_TRUE(inside) << where << ": answer not trained: " << c;
    if (m.role == "user") EXPECT_TRUE(outside) << where << ": user text trained: " << c;
  }
}

class ChatTemplateGoldenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(PinTemplateClockForTesting("2024-07-26").ok()); }
  static void TearDownTestSuite() { (void)PinTemplateClockForTesting(""); }
};

TEST_F(ChatTemplateGoldenTest, EveryCaseMatchesTransformers) {
  const OrderedJson golden = ReadJson("golden.json");
  const OrderedJson convs = ReadJson("conversations.json");
  const OrderedJson spec = ReadJson("templates.json");
  ASSERT_TRUE(golden["strftime_now_pinned"].get<bool>()) << "the generator could not pin strftime_now";
  std::map<std::string, OrderedJson> templates, conversations;
  for (const OrderedJson& t : spec["templates"]) templates[t["name"]] = t;
  for (const OrderedJson& c : convs["conversations"]) conversations[c["name"]] = c;

  std::map<std::string, int> checked;
  for (const OrderedJson& c : golden["cases"]) {
    const OrderedJson& t = templates.at(c["template"]);
    const OrderedJson& conv = conversations.at(c["conversation"]);
    const std::string where = c["template"].get<std::string>() + " " + c["kwargs"].dump() + " " +
                              c["conversation"].get<std::string>() +
                              (c["add_generation_prompt"].get<bool>() ? " +gen" : "");
    OrderedJson variables = c["kwargs"];
    for (const char* key : {"bos_token", "eos_token"}) {
      if (t.contains(key)) variables[key] = t[key];
    }
    auto messages = MessagesOfLine(OrderedJson{{"messages", conv["messages"]}});
    ASSERT_TRUE(messages.ok()) << where << ": " << messages.status();
    const OrderedJson tools = conv["tools"].is_null() ? OrderedJson() : convs["tools"][conv["tools"].get<std::string>()];
    const std::string source = ReadText(t["file"]);
    const bool agp = c["add_generation_prompt"].get<bool>();
    for (const bool train_reasoning : {true, false}) {
      auto tmpl = ChatTemplate::FromText(source, t["file"], variables, train_reasoning);
      ASSERT_TRUE(tmpl.ok()) << where << ": " << tmpl.status();
      auto r = tmpl->Render(*messages, agp, tools);
      if (c.contains("error")) {
        EXPECT_FALSE(r.ok()) << where << ": transformers refused with " << c["error"];
        break;
      }
      ASSERT_TRUE(r.ok()) << where << ": " << r.status();
      EXPECT_EQ(r->text, c["text"].get<std::string>()) << where;
      if (agp) break;
      const char* key = train_reasoning || !c.contains("answer_spans") ? "spans" : "answer_spans";
      if (!train_reasoning && !c.contains("answer_spans")) break;  // generation blocks: transformers' mask only
      EXPECT_EQ(r->assistant_spans, SpansOf(c[key])) << where << " (" << key << ")";
      ExpectMaskSane(r->text, r->assistant_spans, *messages, where);
    }
    ++checked[c["template"]];
  }
  EXPECT_EQ(checked.size(), templates.size());
  for (const auto& [name, n] : checked) EXPECT_GE(n, 10) << name;
}

}  // namespace
}  // namespace e3
