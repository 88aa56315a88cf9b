// One turn of a conversation as training data writes it, and the readers
// of the line formats users bring: OpenAI-style {"messages": [...]},
// {"conversations": [...]} with role/content turns, and ShareGPT's
// from/value turns. Every field a chat template may read (tool_calls,
// reasoning_content, name, tool_call_id, ...) is kept and handed to it.
#ifndef E3_COMMON_TEXT_CHAT_MESSAGE_H_
#define E3_COMMON_TEXT_CHAT_MESSAGE_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace e3 {

struct ChatMessage {
  std::string role;     // system, developer, user, assistant or tool
  std::string content;  // the text; empty when content_is_null
  // `"content": null`, as an assistant turn that only calls tools has:
  // templates test for it, so it reaches them as None, not "".
  bool content_is_null = false;
  // The turn's other fields, as the template sees them.
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();

  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}
};

// The message as the chat template reads it: its fields, role and content.
nlohmann::ordered_json MessageToJson(const ChatMessage& message);

// The reasoning an assistant turn carries apart from its content
// (reasoning_content, or thinking); empty when none.
std::string ReasoningOf(const ChatMessage& message);

// The conversation of one data line: the turns under "messages" or
// "conversations" (role/content or ShareGPT from/value), normalised:
// content given as a list of text parts is joined (by newlines, as vLLM
// does for string templates), reasoning_content and thinking both set.
// Everything else (tool_calls with their arguments, name, tool_call_id)
// reaches the template as written, as transformers passes it.
// Errors name the field, e.g. `messages[2].content[0].type is "image";
// expected "text"`.
absl::StatusOr<std::vector<ChatMessage>> MessagesOfLine(const nlohmann::ordered_json& line);

// Whether a line holds a conversation ("messages" or "conversations").
bool HasConversation(const nlohmann::ordered_json& line);

// A line's "tools" (a list of function schemas) for the template; null
// when the line has none.
absl::StatusOr<nlohmann::ordered_json> ToolsOfLine(const nlohmann::ordered_json& line);

}  // namespace e3

#endif  // E3_COMMON_TEXT_CHAT_MESSAGE_H_
