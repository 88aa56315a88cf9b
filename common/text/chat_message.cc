#include "common/text/chat_message.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace e3 {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kMaxQuoted = 40;

std::string Quote(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxQuoted) text = text.substr(0, kMaxQuoted) + "...";
  return text;
}

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, " ", what));
}

bool IsRole(const std::string& role) {
  return role == "system" || role == "developer" || role == "user" || role == "assistant" ||
         role == "tool" || role == "ipython";
}

// ShareGPT's "from" values (and LLaMA-Factory's) as chat roles; nullptr
// when unknown.
const char* RoleFromShareGpt(const std::string& from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant" || from == "chatgpt" || from == "bot" || from == "model" ||
      from == "function_call") {
    return "assistant";
  }
  if (from == "system") return "system";
  if (from == "tool" || from == "function" || from == "observation" || from == "function_response") return "tool";
  return nullptr;
}

// Content as a string: a string, null, or a list of text parts joined by
// newlines (as vLLM renders parts for templates that take strings).
absl::Status ReadContent(const Json& content, const std::string& where, ChatMessage* out) {
  if (content.is_string()) {
    out->content = content.get<std::string>();
    return absl::OkStatus();
  }
  if (content.is_null()) {
    out->content_is_null = true;
    return absl::OkStatus();
  }
  if (!content.is_array()) return Bad(where, absl::StrCat("is ", content.type_name(), "; expected a string, null or a list of text parts"));
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& part = content[k];
    const std::string at = absl::StrCat(where, "[", k, "]");
    if (part.is_string()) {
      absl::StrAppend(&out->content, k == 0 ? "" : "\n", part.get<std::string>());
      continue;
    }
    if (!part.is_object()) return Bad(at, absl::StrCat("is ", part.type_name(), "; expected a text part"));
    const auto type = part.find("type");
    if (type != part.end() && *type != "text") {
      return Bad(at + ".type", absl::StrCat("is ", Quote(*type), "; expected \"text\" (a text model's data)"));
    }
    const auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return Bad(at + ".text", "is missing or not a string");
    absl::StrAppend(&out->content, k == 0 ? "" : "\n", text->get<std::string>());
  }
  return absl::OkStatus();
}

// tool_calls must be a list of objects naming a function. Their arguments
// stay as the data gives them (an object or a JSON string), as transformers
// passes them: templates differ in which they expect (Llama 3.1's tojson
// wants an object, DeepSeek-V3's concatenation a string).
absl::Status CheckToolCalls(const Json& calls, const std::string& where) {
  if (!calls.is_array()) return Bad(where, absl::StrCat("is ", calls.type_name(), "; expected an array"));
  for (size_t k = 0; k < calls.size(); ++k) {
    const Json& call = calls[k];
    const std::string at = absl::StrCat(where, "[", k, "]");
    if (!call.is_object()) return Bad(at, absl::StrCat("is ", call.type_name(), "; expected an object"));
    const Json& function = call.contains("function") ? call["function"] : call;
    if (!function.is_object() || !function.contains("name")) return Bad(at, "has no function name");
  }
  return absl::OkStatus();
}

absl::StatusOr<ChatMessage> ReadTurn(const Json& turn, const std::string& where) {
  if (!turn.is_object()) return Bad(where, absl::StrCat("is ", turn.type_name(), "; expected an object"));
  ChatMessage m;
  const bool share_gpt = !turn.contains("role") && turn.contains("from");
  const char* role_key = share_gpt ? "from" : "role";
  const char* content_key = share_gpt ? "value" : "content";
  const auto role = turn.find(role_key);
  if (role == turn.end()) return Bad(where, "has neither \"role\"/\"content\" nor \"from\"/\"value\"");
  if (!role->is_string()) return Bad(absl::StrCat(where, ".", role_key), absl::StrCat("is ", role->type_name(), "; expected a string"));
  if (share_gpt) {
    const char* mapped = RoleFromShareGpt(role->get<std::string>());
    if (mapped == nullptr) {
      return Bad(where + ".from", absl::StrCat("is ", Quote(*role), "; expected human/user, gpt/assistant, system or tool/observation"));
    }
    m.role = mapped;
  } else {
    m.role = role->get<std::string>();
    if (!IsRole(m.role)) {
      return Bad(where + ".role", absl::StrCat("is ", Quote(*role), "; expected system, developer, user, assistant or tool"));
    }
  }
  for (auto it = turn.begin(); it != turn.end(); ++it) {
    if (it.key() != role_key && it.key() != content_key) m.fields[it.key()] = it.value();
  }
  const auto content = turn.find(content_key);
  const bool has_calls = m.fields.contains("tool_calls");
  if (content == turn.end() && !has_calls) return Bad(where, absl::StrCat("has no \"", content_key, "\""));
  if (content == turn.end()) {
    m.content_is_null = true;
  } else if (absl::Status s = ReadContent(*content, absl::StrCat(where, ".", content_key), &m); !s.ok()) {
    return s;
  }
  if (has_calls) {
    if (absl::Status s = CheckToolCalls(m.fields["tool_calls"], where + ".tool_calls"); !s.ok()) return s;
  }
  // Qwen3's templates read reasoning_content, GPT-OSS's read thinking.
  for (const auto& [from, to] : {std::pair{"reasoning_content", "thinking"}, std::pair{"thinking", "reasoning_content"}}) {
    if (m.fields.contains(from) && m.fields[from].is_string() && !m.fields.contains(to)) m.fields[to] = m.fields[from];
  }
  return m;
}

}  // namespace

Json MessageToJson(const ChatMessage& message) {
  Json j = message.fields;
  j["role"] = message.role;
  j["content"] = message.content_is_null ? Json() : Json(message.content);
  return j;
}

std::string ReasoningOf(const ChatMessage& message) {
  for (const char* key : {"reasoning_content", "thinking"}) {
    auto it = message.fields.find(key);
    if (it != message.fields.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

bool HasConversation(const Json& line) {
  return line.is_object() && (line.contains("messages") || line.contains("conversations"));
}

absl::StatusOr<std::vector<ChatMessage>> MessagesOfLine(const Json& line) {
  const bool messages = line.contains("messages");
  if (messages && line.contains("conversations")) {
    return absl::InvalidArgumentError("has both \"messages\" and \"conversations\"; expected one of them");
  }
  const char* key = messages ? "messages" : "conversations";
  const auto turns = line.find(key);
  if (turns == line.end()) return absl::InvalidArgumentError("has no \"messages\" or \"conversations\"");
  if (!turns->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is ", turns->type_name(), "; expected an array of turns"));
  }
  if (turns->empty()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is empty; expected turns"));
  std::vector<ChatMessage> out;
  out.reserve(turns->size());
  for (size_t i = 0; i < turns->size(); ++i) {
    auto m = ReadTurn((*turns)[i], absl::StrCat(key, "[", i, "]"));
    if (!m.ok()) return m.status();
    out.push_back(std::move(m).value());
  }
  return out;
}

absl::StatusOr<Json> ToolsOfLine(const Json& line) {
  const auto tools = line.find("tools");
  if (tools == line.end() || tools->is_null()) return Json();
  if (tools->is_string()) {  // some datasets store the schema list as text
    Json parsed = Json::parse(tools->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded() && parsed.is_array()) return parsed;
  }
  if (!tools->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("\"tools\" is ", tools->type_name(), "; expected an array of function schemas"));
  }
  return *tools;
}

}  // namespace e3
